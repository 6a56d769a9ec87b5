"""The parts of scripts/device-check that read what baton wrote.

usage:
  device-compare.py logits MODEL_DIR LOGITS_JSON DEVICE
      PyTorch (transformers, SDPA attention, bf16 on a GPU, f32 on the CPU) runs the ids
      baton ran and the cosine of the two last-position logits is printed as JSON.
      Exits 0 with {"skipped": why} where torch or transformers cannot be imported.
  device-compare.py summary WORK_DIR DEVICE ACTIVATIONS
      One JSON document of every step: exit code, seconds, and what it measured.
"""

import json
import math
import re
import sys
from pathlib import Path


def logits(model_dir, logits_json, device):
    doc = json.loads(Path(logits_json).read_text())
    try:
        import torch
        from transformers import AutoModelForCausalLM
    except Exception as e:  # noqa: BLE001 - any import failure means no comparison
        print(json.dumps({"skipped": f"no torch/transformers here ({type(e).__name__})"}))
        return
    on_gpu = device.startswith("cuda") and torch.cuda.is_available()
    dtype = torch.bfloat16 if on_gpu else torch.float32
    model = AutoModelForCausalLM.from_pretrained(
        model_dir, torch_dtype=dtype, attn_implementation="sdpa"
    ).to("cuda" if on_gpu else "cpu")
    ids = torch.tensor([doc["ids"]], device=model.device)
    with torch.no_grad():
        theirs = model(ids).logits[0, -1].float().cpu()
    ours = torch.tensor(doc["logits"], dtype=torch.float32)
    cos = torch.nn.functional.cosine_similarity(ours, theirs, dim=0).item()
    print(
        json.dumps(
            {
                "tokens": len(doc["ids"]),
                "cosine": cos,
                "same_top1": int(ours.argmax()) == int(theirs.argmax()),
                "torch": torch.__version__,
                "pytorch_dtype": str(dtype),
            }
        )
    )


def switch_measures(session):
    """The first switch's per-layer measures in a session file."""
    if not session.is_file():
        return None
    for line in session.read_text().splitlines():
        e = json.loads(line).get("event", {})
        if e.get("type") == "switch_measured":
            m = e.get("metrics")
            if m:
                return {k: m[k] for k in ("attention_cosine", "r2_k", "r2_v")}
    return None


def step(work, name):
    rc_file = work / "steps" / f"{name}.rc"
    if not rc_file.is_file():
        return {"ran": False}
    rc, seconds = rc_file.read_text().split()
    out = (work / "steps" / f"{name}.out").read_text()
    err = (work / "steps" / f"{name}.err").read_text()
    s = {"exit": int(rc), "seconds": round(float(seconds), 2)}
    if int(rc) in (124, 137):
        s["timed_out"] = True
    if int(rc) != 0:
        s["error"] = err.strip().splitlines()[-1:] if err.strip() else []
    return s, out, err


def summary(work, device, activations):
    work = Path(work)
    doc = {"format": "baton.device-check", "device": device, "activations": activations, "steps": {}}
    for name in ("version", "libraries", "models", "generate", "logits", "calibrate", "bench", "eval", "switch", "switch-cpu"):
        got = step(work, name)
        if got == {"ran": False}:
            doc["steps"][name] = got
            continue
        s, out, err = got
        if s["exit"] == 0:
            if name == "version":
                doc["build"] = out.strip()
                doc["fused_attention"] = "fused attention" in out
            elif name == "generate":
                m = re.search(r"prefill (\d+) tokens at ([\d.]+) tokens/s; decode (\d+) tokens at ([\d.]+)", err)
                if m:
                    s["prefill_tokens"], s["prefill_tok_s"] = int(m[1]), float(m[2])
                    s["decode_tokens"], s["decode_tok_s"] = int(m[3]), float(m[4])
            elif name in ("logits", "bench", "eval"):
                s["result"] = json.loads(out)
        doc["steps"][name] = s
    dev, cpu = switch_measures(work / "device.jsonl"), switch_measures(work / "cpu.jsonl")
    if dev and cpu:
        diff = {
            k: max(abs(a - b) for a, b in zip(dev[k], cpu[k]))
            for k in dev
            if all(isinstance(x, (int, float)) and math.isfinite(x) for x in dev[k] + cpu[k])
        }
        doc["map_device_vs_cpu"] = {"max_abs_difference": diff, "device": dev, "cpu": cpu}
    else:
        doc["map_device_vs_cpu"] = {"skipped": "a switch run did not record its measures"}
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "logits":
        logits(*sys.argv[2:])
    elif len(sys.argv) == 5 and sys.argv[1] == "summary":
        summary(*sys.argv[2:])
    else:
        sys.exit(__doc__)
