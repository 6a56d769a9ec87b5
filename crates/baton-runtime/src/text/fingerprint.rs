//! A tokenizer's fingerprint: a hash of everything that decides how text becomes ids
//! (normaliser, pre-tokeniser, model options, vocabulary, merges, added tokens, the
//! post-processor's output), so two files that tokenize alike match however they were
//! stored (tokenizer.json or GGUF metadata), and mapper artifacts and sessions can be
//! bound to it.

use super::error::{build_err, TokenizerError};
use sha2::{Digest, Sha256};
use tokenizers::Tokenizer;

pub(crate) fn compute_fingerprint(tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
    let mut h = Sha256::new();
    let line = |h: &mut Sha256, s: &str| {
        h.update(s.as_bytes());
        h.update(b"\n");
    };
    line(&mut h, "baton-tokenizer-fingerprint v1");
    line(
        &mut h,
        &format!("normalizer {}", to_json(&tokenizer.get_normalizer())?),
    );
    line(
        &mut h,
        &format!("pre_tokenizer {}", to_json(&tokenizer.get_pre_tokenizer())?),
    );

    let model = serde_json::to_value(tokenizer.get_model()).map_err(build_err)?;
    let serde_json::Value::Object(mut model) = model else {
        return Err(build_err("model does not serialise to an object"));
    };
    let merges = model.remove("merges");
    model.remove("vocab");
    line(
        &mut h,
        &format!("model {}", serde_json::Value::Object(model)),
    );

    let vocab = tokenizer.get_vocab(true);
    let mut by_id: Vec<(u32, &str)> = vocab.iter().map(|(t, &id)| (id, t.as_str())).collect();
    by_id.sort_unstable();
    line(&mut h, &format!("vocab {}", by_id.len()));
    for (id, tok) in &by_id {
        line(
            &mut h,
            &format!("{id} {}", serde_json::to_string(tok).map_err(build_err)?),
        );
    }

    match merges {
        Some(serde_json::Value::Array(merges)) => {
            line(&mut h, &format!("merges {}", merges.len()));
            for m in &merges {
                line(&mut h, &m.to_string());
            }
        }
        _ => line(&mut h, "merges none"),
    }

    let added = tokenizer.get_added_tokens_decoder();
    let mut added: Vec<_> = added.iter().collect();
    added.sort_unstable_by_key(|(id, _)| **id);
    line(&mut h, &format!("added {}", added.len()));
    for (id, t) in added {
        line(
            &mut h,
            &format!(
                "{id} {} single_word={} lstrip={} rstrip={} normalized={}",
                serde_json::to_string(&t.content).map_err(build_err)?,
                t.single_word,
                t.lstrip,
                t.rstrip,
                t.normalized
            ),
        );
    }

    let empty = tokenizer.encode_fast("", true).map_err(build_err)?;
    line(&mut h, &format!("post {:?}", empty.get_ids()));
    Ok(hex::encode(h.finalize()))
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<String, TokenizerError> {
    serde_json::to_string(v).map_err(build_err)
}
