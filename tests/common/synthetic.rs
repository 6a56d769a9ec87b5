//! Tiny random models written to disk in both formats baton reads, with the tensor names
//! and layouts real converters produce, so loaders and rope layouts can be checked
//! against each other without downloading anything.
#![allow(dead_code)]

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use std::path::Path;

pub struct Tiny {
    pub arch: &'static str,
    pub n_layer: usize,
    pub hidden: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub theta: f64,
    pub context: usize,
    /// Words a chat model's tokenizer knows besides `w0` …: accented, emoji, right-to-left
    /// ones, in the normal form (NFC) its tokenizer reads them in. They take ids from
    /// the end of the vocabulary, before the role words.
    pub chat_words: &'static [&'static str],
}

impl Tiny {
    pub fn new(arch: &'static str) -> Self {
        Self {
            arch,
            n_layer: 2,
            hidden: 64,
            n_head: 4,
            n_kv_head: 2,
            head_dim: 16,
            ffn: 96,
            vocab: 128,
            theta: 10_000.0,
            context: 256,
            chat_words: &[],
        }
    }

    /// HF-named weights, deterministic for a seed.
    pub fn weights(&self, seed: u64) -> HashMap<String, Tensor> {
        let dev = Device::Cpu;
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut rand = |shape: (usize, usize), scale: f32| -> Tensor {
            let n = shape.0 * shape.1;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    ((rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * scale
                })
                .collect();
            Tensor::from_vec(v, shape, &dev).unwrap()
        };
        let (h, q, kv, f) = (
            self.hidden,
            self.n_head * self.head_dim,
            self.n_kv_head * self.head_dim,
            self.ffn,
        );
        let s = 1.0 / (h as f32).sqrt();
        let mut w = HashMap::new();
        w.insert(
            "model.embed_tokens.weight".into(),
            rand((self.vocab, h), 1.0),
        );
        w.insert("lm_head.weight".into(), rand((self.vocab, h), s));
        w.insert(
            "model.norm.weight".into(),
            (rand((1, h), 0.1).squeeze(0).unwrap() + 1.0).unwrap(),
        );
        for l in 0..self.n_layer {
            let p = format!("model.layers.{l}");
            w.insert(
                format!("{p}.input_layernorm.weight"),
                (rand((1, h), 0.1).squeeze(0).unwrap() + 1.0).unwrap(),
            );
            w.insert(
                format!("{p}.post_attention_layernorm.weight"),
                (rand((1, h), 0.1).squeeze(0).unwrap() + 1.0).unwrap(),
            );
            w.insert(
                format!("{p}.self_attn.q_proj.weight"),
                rand((q, h), s * 2.0),
            );
            w.insert(
                format!("{p}.self_attn.k_proj.weight"),
                rand((kv, h), s * 2.0),
            );
            w.insert(format!("{p}.self_attn.v_proj.weight"), rand((kv, h), s));
            w.insert(format!("{p}.self_attn.o_proj.weight"), rand((h, q), s));
            w.insert(format!("{p}.mlp.gate_proj.weight"), rand((f, h), s));
            w.insert(format!("{p}.mlp.up_proj.weight"), rand((f, h), s));
            w.insert(
                format!("{p}.mlp.down_proj.weight"),
                rand((h, f), 1.0 / (f as f32).sqrt()),
            );
            if self.arch == "qwen2" {
                w.insert(
                    format!("{p}.self_attn.q_proj.bias"),
                    rand((1, q), 0.1).squeeze(0).unwrap(),
                );
                w.insert(
                    format!("{p}.self_attn.k_proj.bias"),
                    rand((1, kv), 0.1).squeeze(0).unwrap(),
                );
                w.insert(
                    format!("{p}.self_attn.v_proj.bias"),
                    rand((1, kv), 0.1).squeeze(0).unwrap(),
                );
            }
            if self.arch == "qwen3" {
                w.insert(
                    format!("{p}.self_attn.q_norm.weight"),
                    (rand((1, self.head_dim), 0.1).squeeze(0).unwrap() + 1.0).unwrap(),
                );
                w.insert(
                    format!("{p}.self_attn.k_norm.weight"),
                    (rand((1, self.head_dim), 0.1).squeeze(0).unwrap() + 1.0).unwrap(),
                );
            }
        }
        w
    }

    /// A Hugging Face directory: config.json + model.safetensors.
    pub fn write_safetensors(&self, dir: &Path, seed: u64) {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = serde_json::json!({
            "model_type": self.arch,
            "hidden_size": self.hidden,
            "intermediate_size": self.ffn,
            "num_hidden_layers": self.n_layer,
            "num_attention_heads": self.n_head,
            "num_key_value_heads": self.n_kv_head,
            "head_dim": self.head_dim,
            "rms_norm_eps": 1e-6,
            "rope_theta": self.theta,
            "max_position_embeddings": self.context,
            "vocab_size": self.vocab,
        });
        std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
        candle_core::safetensors::save(&self.weights(seed), dir.join("model.safetensors")).unwrap();
    }

    /// A word-level tokenizer.json whose words are `w0` … `w{vocab-1}`, so test text maps
    /// to known ids.
    pub fn write_tokenizer(&self, dir: &Path) {
        let vocab: serde_json::Map<String, serde_json::Value> = (0..self.vocab)
            .map(|i| (format!("w{i}"), serde_json::json!(i)))
            .collect();
        let tok = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [],
            "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
    }

    /// Text of `words` random words of this vocabulary.
    pub fn text(&self, words: usize, seed: u64) -> String {
        let mut x = seed | 1;
        (0..words)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("w{}", x % self.vocab as u64)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The same weights as a GGUF file, named and laid out as llama.cpp's converter does:
    /// for llama-architecture models Q and K rows are permuted so that rope rotates
    /// adjacent pairs.
    pub fn write_gguf(&self, path: &Path, seed: u64) {
        let w = self.weights(seed);
        let a = self.arch;
        let md: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String(a.into())),
            (format!("{a}.block_count"), Value::U32(self.n_layer as u32)),
            (
                format!("{a}.embedding_length"),
                Value::U32(self.hidden as u32),
            ),
            (
                format!("{a}.feed_forward_length"),
                Value::U32(self.ffn as u32),
            ),
            (
                format!("{a}.attention.head_count"),
                Value::U32(self.n_head as u32),
            ),
            (
                format!("{a}.attention.head_count_kv"),
                Value::U32(self.n_kv_head as u32),
            ),
            (
                format!("{a}.attention.key_length"),
                Value::U32(self.head_dim as u32),
            ),
            (
                format!("{a}.context_length"),
                Value::U32(self.context as u32),
            ),
            (format!("{a}.vocab_size"), Value::U32(self.vocab as u32)),
            (format!("{a}.rope.freq_base"), Value::F32(self.theta as f32)),
            (
                format!("{a}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
        ];
        let permute = a == "llama" || a == "mistral";
        let perm = |t: &Tensor, heads: usize| -> Tensor {
            if !permute {
                return t.clone();
            }
            let (out, inp) = t.dims2().unwrap();
            t.reshape((heads, 2, out / heads / 2, inp))
                .unwrap()
                .transpose(1, 2)
                .unwrap()
                .reshape((out, inp))
                .unwrap()
                .contiguous()
                .unwrap()
        };
        let mut tensors: Vec<(String, Tensor)> = vec![
            (
                "token_embd.weight".into(),
                w["model.embed_tokens.weight"].clone(),
            ),
            ("output.weight".into(), w["lm_head.weight"].clone()),
            ("output_norm.weight".into(), w["model.norm.weight"].clone()),
        ];
        for l in 0..self.n_layer {
            let p = format!("model.layers.{l}");
            let b = format!("blk.{l}");
            let g = |n: &str| w[&format!("{p}.{n}")].clone();
            tensors.push((format!("{b}.attn_norm.weight"), g("input_layernorm.weight")));
            tensors.push((
                format!("{b}.ffn_norm.weight"),
                g("post_attention_layernorm.weight"),
            ));
            tensors.push((
                format!("{b}.attn_q.weight"),
                perm(&g("self_attn.q_proj.weight"), self.n_head),
            ));
            tensors.push((
                format!("{b}.attn_k.weight"),
                perm(&g("self_attn.k_proj.weight"), self.n_kv_head),
            ));
            tensors.push((format!("{b}.attn_v.weight"), g("self_attn.v_proj.weight")));
            tensors.push((
                format!("{b}.attn_output.weight"),
                g("self_attn.o_proj.weight"),
            ));
            tensors.push((format!("{b}.ffn_gate.weight"), g("mlp.gate_proj.weight")));
            tensors.push((format!("{b}.ffn_up.weight"), g("mlp.up_proj.weight")));
            tensors.push((format!("{b}.ffn_down.weight"), g("mlp.down_proj.weight")));
            if a == "qwen2" {
                tensors.push((format!("{b}.attn_q.bias"), g("self_attn.q_proj.bias")));
                tensors.push((format!("{b}.attn_k.bias"), g("self_attn.k_proj.bias")));
                tensors.push((format!("{b}.attn_v.bias"), g("self_attn.v_proj.bias")));
            }
            if a == "qwen3" {
                tensors.push((
                    format!("{b}.attn_q_norm.weight"),
                    g("self_attn.q_norm.weight"),
                ));
                tensors.push((
                    format!("{b}.attn_k_norm.weight"),
                    g("self_attn.k_norm.weight"),
                ));
            }
        }
        let q: Vec<(String, QTensor)> = tensors
            .into_iter()
            .map(|(n, t)| {
                (
                    n,
                    QTensor::quantize(&t.to_dtype(DType::F32).unwrap(), GgmlDType::F32).unwrap(),
                )
            })
            .collect();
        let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let t_refs: Vec<(&str, &QTensor)> = q.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let mut f = std::fs::File::create(path).unwrap();
        gguf_file::write(&mut f, &md_refs, &t_refs).unwrap();
    }
}

/// The chat template of [`Tiny::write_chat_model`]: every token stands between single
/// spaces, as the word-level tokenizer decodes it, so a rendered conversation starts
/// with the decoded cache (the engine extends its caches only then).
pub const CHAT_TEMPLATE: &str = "{% for m in messages %}{{ '' if loop.first else ' ' }}<|im_start|> {{ m.role }}{{ (' ' + m.content) if m.content else '' }} <|im_end|>{% endfor %}{{ ' <|im_start|> assistant' if add_generation_prompt else '' }}";

/// The words a chat model's messages may use: the last five ids are the role words and
/// the two special tokens.
const CHAT_RESERVED: usize = 5;

impl Tiny {
    /// A Hugging Face directory of a chat model: weights for `seed`, a word-level
    /// tokenizer with `<|im_start|>` / `<|im_end|>` and the role words, and a
    /// tokenizer_config.json with [`CHAT_TEMPLATE`]. The special tokens' output rows are
    /// zero, so greedy decoding never picks them and every answer runs to its token
    /// budget (a random model would otherwise end turns at random).
    pub fn write_chat_model(&self, dir: &Path, seed: u64) {
        std::fs::create_dir_all(dir).unwrap();
        self.write_safetensors(dir, seed);
        let mut w = self.weights(seed);
        let head = &w["lm_head.weight"];
        let keep = head.narrow(0, 0, self.vocab - 2).unwrap();
        let zero = Tensor::zeros((2, self.hidden), head.dtype(), head.device()).unwrap();
        w.insert(
            "lm_head.weight".into(),
            Tensor::cat(&[&keep, &zero], 0).unwrap(),
        );
        candle_core::safetensors::save(&w, dir.join("model.safetensors")).unwrap();
        let words = self.vocab - CHAT_RESERVED;
        let known = words - self.chat_words.len();
        let mut vocab: serde_json::Map<String, serde_json::Value> = (0..known)
            .map(|i| (format!("w{i}"), serde_json::json!(i)))
            .collect();
        for (i, word) in self.chat_words.iter().enumerate() {
            vocab.insert(word.to_string(), serde_json::json!(known + i));
        }
        for (i, word) in ["user", "assistant", "system", "<|im_start|>", "<|im_end|>"]
            .iter()
            .enumerate()
        {
            vocab.insert(word.to_string(), serde_json::json!(words + i));
        }
        let special = |id: usize, content: &str| {
            serde_json::json!({"id": id, "content": content, "single_word": false,
                "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        };
        let tok = serde_json::json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [special(self.vocab - 2, "<|im_start|>"), special(self.vocab - 1, "<|im_end|>")],
            // NFC, as Qwen's tokenizer normalises (a no-op on the w-words).
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null,
            "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"}
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
        let cfg = serde_json::json!({
            "chat_template": CHAT_TEMPLATE,
            "eos_token": "<|im_end|>",
        });
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    }

    /// A message of `words` words a chat model's tokenizer knows.
    pub fn chat_text(&self, words: usize, seed: u64) -> String {
        let known = (self.vocab - CHAT_RESERVED - self.chat_words.len()) as u64;
        let mut x = seed | 1;
        (0..words)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                format!("w{}", x % known)
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A model directory as baton loads it, hashed now.
pub fn load(dir: &Path, name: &str) -> baton::model::Model {
    use baton::model::{LoadOptions, Model, ResolvedModel};
    let r = ResolvedModel {
        name: name.into(),
        path: dir.to_path_buf(),
        sha256: baton::fetch::local_sha256(dir).unwrap(),
        sha256_check: baton::model::DigestCheck::HashedNow,
        source: None,
    };
    Model::load(&r, &Device::Cpu, LoadOptions::for_device(&Device::Cpu)).unwrap()
}

/// `tiny`'s config and tokenizer with these weights, written as a model directory.
pub fn write_model(tiny: &Tiny, dir: &Path, weights: &HashMap<String, Tensor>) {
    std::fs::create_dir_all(dir).unwrap();
    tiny.write_safetensors(dir, 0);
    candle_core::safetensors::save(weights, dir.join("model.safetensors")).unwrap();
    tiny.write_tokenizer(dir);
}

/// Two tiny models of `tiny`'s shape with these weights, written and loaded as `a` and
/// `b` (the directory must outlive them).
pub fn model_pair(
    tiny: &Tiny,
    a: &HashMap<String, Tensor>,
    b: &HashMap<String, Tensor>,
) -> (tempfile::TempDir, baton::model::Model, baton::model::Model) {
    let dir = tempfile::tempdir().unwrap();
    write_model(tiny, &dir.path().join("a"), a);
    write_model(tiny, &dir.path().join("b"), b);
    let (a, b) = (
        load(&dir.path().join("a"), "a"),
        load(&dir.path().join("b"), "b"),
    );
    (dir, a, b)
}
