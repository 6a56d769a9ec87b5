"""Writes a Hugging Face model directory (config.json, model.safetensors, tokenizer.json,
tokenizer_config.json) of a named real shape with random weights, for timing and
runtime checks where no real model can be fetched: a prefill's or a map's time does not
depend on the weights' values.

usage: random-model.py SHAPE OUT_DIR TOKENIZER_DIR [SEED]

SHAPE is one of the names below. TOKENIZER_DIR holds a Qwen tokenizer.json and
tokenizer_config.json (the vocabulary sizes the embedding). Weights are float16 drawn
as transformers initialises them (normal, std 0.02; norms 1; biases 0), so activations
stay in range through every layer. Needs numpy and safetensors.
"""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# (hidden, intermediate, layers, heads, kv heads, tied): Qwen2.5's published configs.
SHAPES = {
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2, True),
    "qwen2.5-1.5b": (1536, 8960, 28, 12, 2, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, False),
    # Small enough for a CPU dry run in seconds, with the same vocabulary.
    "tiny-a": (64, 128, 2, 4, 2, True),
    "tiny-b": (96, 192, 3, 6, 2, True),
}
VOCAB = 151936


def main(shape, out_dir, tokenizer_dir, seed="0"):
    if shape not in SHAPES:
        sys.exit(f"unknown shape {shape}: one of {', '.join(SHAPES)}")
    hidden, inter, layers, heads, kv, tied = SHAPES[shape]
    hd = hidden // heads
    rng = np.random.default_rng(int(seed))

    def normal(*dims):
        return (rng.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float16)

    t = {
        "model.embed_tokens.weight": normal(VOCAB, hidden),
        "model.norm.weight": np.ones(hidden, np.float16),
    }
    if not tied:
        t["lm_head.weight"] = normal(VOCAB, hidden)
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = np.ones(hidden, np.float16)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(hidden, np.float16)
        for proj, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
            t[f"{p}.self_attn.{proj}_proj.weight"] = normal(rows, hidden)
            t[f"{p}.self_attn.{proj}_proj.bias"] = np.zeros(rows, np.float16)
        t[f"{p}.self_attn.o_proj.weight"] = normal(hidden, heads * hd)
        t[f"{p}.mlp.gate_proj.weight"] = normal(inter, hidden)
        t[f"{p}.mlp.up_proj.weight"] = normal(inter, hidden)
        t[f"{p}.mlp.down_proj.weight"] = normal(hidden, inter)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(t, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "vocab_size": VOCAB,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
        "use_sliding_window": False,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "torch_dtype": "float16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tok = Path(tokenizer_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(tok / name, out / name)
    print(f"{shape}: {sum(a.size for a in t.values()) / 1e6:.0f}M random weights in {out}")


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        sys.exit(__doc__)
    main(*sys.argv[1:])
