//! The tensors an artifact must hold, with their shapes, derived from its metadata alone
//! (the kind, the two models' KV geometry, the source layers each map reads, the rank,
//! the trained heads' widths) and checked against the file's header before any value is
//! read. Shapes were once rebuilt from element counts, so a tensor written with a wrong
//! shape, a head layer dropped where the widths still chained, or a bias of half length
//! loaded as something else; here each is refused by its own name.

use super::MapperMeta;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashSet;

const FIX: &str = "the file is damaged or was edited: delete it and run `baton calibrate` again";

/// One tensor the metadata calls for.
struct Expected {
    name: String,
    shape: Vec<usize>,
    /// What its shape follows from, for the error.
    why: String,
}

/// Checks that `st` holds exactly the tensors `meta` describes, each F32 in the shape the
/// metadata gives; the reason names the first tensor that is missing, misshapen or not
/// accounted for.
pub(super) fn check(meta: &MapperMeta, st: &SafeTensors<'_>) -> Result<(), String> {
    let (required, scales) = expected(meta)?;
    let names: HashSet<&str> = st.names().into_iter().collect();
    for e in &required {
        if !names.contains(e.name.as_str()) {
            return Err(format!("tensor `{}` is missing ({}); {FIX}", e.name, e.why));
        }
        shape_of(st, e)?;
    }
    check_scales(meta, st, &names, &scales)?;
    let known: HashSet<&str> = required
        .iter()
        .map(|e| e.name.as_str())
        .chain(SCALES)
        .collect();
    let mut extra: Vec<&str> = names.difference(&known).copied().collect();
    extra.sort_unstable();
    if let Some(name) = extra.first() {
        return Err(format!(
            "it holds tensor `{name}`, which a {} mapper with this metadata does not have \
             (kind, rank or head widths disagree with the tensors); {FIX}",
            meta.kind
        ));
    }
    Ok(())
}

fn shape_of(st: &SafeTensors<'_>, e: &Expected) -> Result<(), String> {
    let t = st
        .tensor(&e.name)
        .map_err(|err| format!("tensor `{}`: {err}; {FIX}", e.name))?;
    if t.dtype() != Dtype::F32 {
        return Err(format!(
            "tensor `{}` is {:?}, not F32; {FIX}",
            e.name,
            t.dtype()
        ));
    }
    if t.shape() != e.shape.as_slice() {
        return Err(format!(
            "tensor `{}` has shape {:?}, the metadata calls for {:?} ({}); {FIX}",
            e.name,
            t.shape(),
            e.shape,
            e.why
        ));
    }
    Ok(())
}

const SCALES: [&str; 4] = [
    "source.key_mean",
    "source.key_std",
    "source.value_mean",
    "source.value_std",
];

/// The source scales: all four or none (artifacts from before them), each one vector
/// over the source layers and the token block's pieces when calibration offered them.
fn check_scales(
    meta: &MapperMeta,
    st: &SafeTensors<'_>,
    names: &HashSet<&str>,
    allowed: &[usize],
) -> Result<(), String> {
    let present: Vec<&str> = SCALES
        .iter()
        .copied()
        .filter(|n| names.contains(n))
        .collect();
    if present.is_empty() {
        return Ok(());
    }
    if let Some(missing) = SCALES.iter().find(|n| !names.contains(*n)) {
        return Err(format!(
            "tensor `{missing}` is missing (the other source scales are there); {FIX}"
        ));
    }
    let d_s = meta.source.kv_heads * meta.source.head_dim;
    for name in SCALES {
        let t = st
            .tensor(name)
            .map_err(|err| format!("tensor `{name}`: {err}; {FIX}"))?;
        let fits = matches!(t.shape(), [n] if allowed.contains(n));
        if t.dtype() != Dtype::F32 || !fits {
            let want: Vec<String> = allowed.iter().map(|n| format!("[{n}]")).collect();
            return Err(format!(
                "tensor `{name}` is {:?} {:?}, the metadata calls for F32 {} (one value per \
                 feature of the source's {} layers of {d_s}, with the token block's pieces \
                 when calibration offered them); {FIX}",
                t.dtype(),
                t.shape(),
                want.join(" or "),
                meta.source.layers
            ));
        }
    }
    Ok(())
}

/// The tensors `meta` calls for, in the order they are checked (a map's bias before its
/// weight, so that a bias of the wrong length is named as such), and the lengths the
/// source scales may have.
fn expected(meta: &MapperMeta) -> Result<(Vec<Expected>, Vec<usize>), String> {
    let (l_s, d_s) = (
        meta.source.layers,
        meta.source.kv_heads * meta.source.head_dim,
    );
    let (l_t, d_t) = (
        meta.target.layers,
        meta.target.kv_heads * meta.target.head_dim,
    );
    if d_s == 0 || d_t == 0 {
        return Err(format!(
            "its metadata gives a KV width of {d_s} for the source and {d_t} for the target; {FIX}"
        ));
    }
    // The token block's pieces are source layers past the source's own (see
    // `token_block`); a pair whose widths do not split has none.
    let pieces = crate::mapper::token_block::block_layers(d_s, d_t).unwrap_or(0);
    let hidden = head_widths(meta);
    let mut out = Vec::new();
    let mut widest = 0;
    for (side, sources) in [("keys", &meta.key_sources), ("values", &meta.value_sources)] {
        if sources.len() != l_t {
            return Err(format!(
                "its metadata lists the source layers of {} {side} maps, the target has {l_t} \
                 layers; {FIX}",
                sources.len()
            ));
        }
        for (j, s) in sources.iter().enumerate() {
            let p = format!("{side}.{j}");
            if s.is_empty() {
                return Err(format!("the map `{p}` reads no source layer; {FIX}"));
            }
            if let Some(&bad) = s.iter().find(|&&i| i >= l_s + pieces) {
                return Err(format!(
                    "the map `{p}` reads source layer {bad}, past the source's {l_s} layers \
                     and the token block's {pieces} pieces; {FIX}"
                ));
            }
            widest = widest.max(s.iter().max().map_or(0, |&i| i + 1));
            let rows = s.len() * d_s;
            let input = format!("{} source layers of {d_s} features", s.len());
            let output = format!("the target's KV width {d_t}");
            let mut add = |name: String, shape: Vec<usize>, why: String| {
                out.push(Expected { name, shape, why })
            };
            add(format!("{p}.bias"), vec![d_t], output.clone());
            add(
                format!("{p}.weight"),
                vec![rows, d_t],
                format!("{input} to {output}"),
            );
            if let Some(r) = meta.rank {
                add(
                    format!("{p}.left"),
                    vec![rows, r],
                    format!("{input} to rank {r}"),
                );
                add(
                    format!("{p}.right"),
                    vec![r, d_t],
                    format!("rank {r} to {output}"),
                );
            }
            if let Some(hidden) = &hidden {
                let h = format!("{p}.head");
                let kind = meta.kind;
                add(format!("{h}.in_mean"), vec![rows], input.clone());
                add(format!("{h}.in_scale"), vec![rows], input.clone());
                let mut widths = vec![rows];
                widths.extend(hidden);
                widths.push(d_t);
                for (i, w) in widths.windows(2).enumerate() {
                    let why = format!(
                        "a {kind} mapper with hidden widths {hidden:?} has {} head layers, \
                         from {input} to {output}",
                        widths.len() - 1
                    );
                    add(
                        format!("{h}.layer.{i}.weight"),
                        vec![w[0], w[1]],
                        why.clone(),
                    );
                    add(format!("{h}.layer.{i}.bias"), vec![w[1]], why);
                }
                add(format!("{h}.out_scale"), vec![d_t], output.clone());
                add(format!("{h}.out_mean"), vec![d_t], output.clone());
            }
        }
    }
    let scales = [l_s, l_s + pieces]
        .into_iter()
        .filter(|&layers| layers >= widest)
        .map(|layers| layers * d_s)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    Ok((out, scales))
}

/// The hidden widths of a trained mapper's heads: those its training report names, or
/// its kind's own where an artifact has no report; `None` for the ridge map alone.
fn head_widths(meta: &MapperMeta) -> Option<Vec<usize>> {
    let (default, _, _) = meta.kind.architecture()?;
    Some(meta.training.as_ref().map_or(default, |t| t.hidden.clone()))
}

#[cfg(test)]
mod tests {
    use super::super::{load, save, MapperMeta, Maps};
    use crate::mapper::nonlinear::{Dense, Head, Heads, MapperKind};
    use crate::mapper::ridge::{Factors, FitInfo, LayerMap};
    use crate::mapper::SourceScales;
    use std::path::Path;

    // Source: 2 layers of 2 KV heads × 8; target: 2 layers of 2 × 16. The residual head's
    // hidden width equals the target's KV width, as 256 does between Qwen2.5-Coder 0.5B
    // and 1.5B: a head with its last layer gone still chains from input to output.
    const D_S: usize = 16;
    const D_T: usize = 32;

    fn meta(kind: MapperKind, rank: Option<usize>) -> MapperMeta {
        let model = |name: &str, head_dim: usize| {
            serde_json::json!({
                "name": name, "sha256": name.repeat(8), "architecture": "qwen2", "layers": 2,
                "kv_heads": 2, "head_dim": head_dim, "tokenizer_fingerprint": "t"
            })
        };
        let training = kind.architecture().map(|_| {
            serde_json::json!({
                "loss": "attention", "hidden": [D_T], "activation": "gelu", "seed": 0,
                "learning_rate": 0.001, "windows": 1, "seq_len": 8, "epochs": 1,
                "best_epoch": [1, 1], "heldout_ridge": [1.0, 1.0],
                "heldout_trained": [0.5, 0.5], "ridge_cosine": 0.9, "ridge_top1": 0.5,
                "seconds": 1.0
            })
        });
        serde_json::from_value(serde_json::json!({
            "format": super::super::FORMAT, "version": super::super::VERSION,
            "direction": "a -> b", "source": model("a", 8), "target": model("b", 16),
            "k": 1, "lambda": 0.01, "standardize": true, "rank": rank,
            "key_sources": [[0], [0, 1]], "value_sources": [[1], [0]],
            "kind": kind, "training": training,
            "corpus": {"files": "x", "fingerprint": "f", "sequences": 1, "seq_len": 8,
                       "observations": 8},
            "report": {"observations": 8, "sequences": 1, "seq_len": 8, "stride": 1,
                       "select_sequences": 1, "sweep": [], "r2_k": [0.5, 0.5],
                       "r2_v": [0.5, 0.5], "cosine": [0.9, 0.9],
                       "single_layer_r2_k": [], "single_layer_r2_v": [],
                       "capture_seconds": 0.0, "fit_seconds": 0.0, "stats_bytes": 0},
            "created_unix": 0, "baton_version": "test"
        }))
        .unwrap()
    }

    fn ramp(n: usize, at: f32) -> Vec<f32> {
        (0..n).map(|i| at + i as f32 * 1e-3).collect()
    }

    fn map(sources: &[usize], rank: Option<usize>) -> LayerMap {
        let rows = sources.len() * D_S;
        LayerMap {
            sources: sources.to_vec(),
            weight: ramp(rows * D_T, 0.1),
            bias: ramp(D_T, 0.2),
            info: FitInfo {
                lambda_requested: 0.01,
                lambda: 0.01,
                standardized: true,
                constant_features: 0,
                observations: 8,
            },
            factors: rank.map(|r| Factors {
                rank: r,
                left: ramp(rows * r, 0.3),
                right: ramp(r * D_T, 0.4),
            }),
        }
    }

    fn head(input: usize, kind: MapperKind) -> Head {
        let (_, activation, used) = kind.architecture().unwrap();
        let dense = |rows: usize, cols: usize| Dense {
            rows,
            cols,
            weight: ramp(rows * cols, 0.5),
            bias: ramp(cols, 0.6),
        };
        Head {
            activation,
            used,
            in_mean: ramp(input, 0.0),
            in_scale: ramp(input, 1.0),
            layers: vec![dense(input, D_T), dense(D_T, D_T)],
            out_scale: ramp(D_T, 1.0),
            out_mean: ramp(D_T, 0.0),
        }
    }

    struct Parts {
        meta: MapperMeta,
        keys: Vec<LayerMap>,
        values: Vec<LayerMap>,
        scales: SourceScales,
        heads: Option<Heads>,
    }

    fn parts(kind: MapperKind, rank: Option<usize>) -> Parts {
        let meta = meta(kind, rank);
        let maps = |s: &[Vec<usize>]| s.iter().map(|s| map(s, rank)).collect::<Vec<_>>();
        let (keys, values) = (maps(&meta.key_sources), maps(&meta.value_sources));
        let heads = kind.architecture().map(|_| Heads {
            kind,
            keys: keys
                .iter()
                .map(|m| head(m.sources.len() * D_S, kind))
                .collect(),
            values: values
                .iter()
                .map(|m| head(m.sources.len() * D_S, kind))
                .collect(),
        });
        let v = ramp(2 * D_S, 1.0);
        Parts {
            meta,
            keys,
            values,
            scales: SourceScales {
                key_mean: v.clone(),
                key_std: v.clone(),
                value_mean: v.clone(),
                value_std: v,
            },
            heads,
        }
    }

    fn write(p: &Parts, path: &Path) {
        let maps = Maps {
            keys: &p.keys,
            values: &p.values,
            source_scales: &p.scales,
            heads: p.heads.as_ref(),
        };
        save(maps, &p.meta, path, &path.with_extension("json")).unwrap();
    }

    fn refusal(p: &Parts) -> String {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write(p, &path);
        match load(&path) {
            Ok(_) => panic!("a damaged artifact loaded"),
            Err(e) => e.to_string(),
        }
    }

    /// `path` with the header entry of `name` given `shape` (the same element count, so
    /// the file stays well-formed safetensors).
    fn reshape_in_header(path: &Path, name: &str, shape: &[usize]) {
        let bytes = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let mut header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        header[name]["shape"] = serde_json::json!(shape);
        let mut text = serde_json::to_vec(&header).unwrap();
        // The data starts 8-aligned after the header.
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        let mut out = (text.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&text);
        out.extend_from_slice(&bytes[8 + n..]);
        std::fs::write(path, out).unwrap();
    }

    #[test]
    fn whole_artifacts_of_every_kind_load() {
        for (kind, rank) in [
            (MapperKind::Ridge, None),
            (MapperKind::Ridge, Some(4)),
            (MapperKind::Residual, None),
            (MapperKind::Mlp, Some(4)),
        ] {
            let p = parts(kind, rank);
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("m.safetensors");
            write(&p, &path);
            let art = load(&path).unwrap_or_else(|e| panic!("{kind} {rank:?}: {e}"));
            assert!(art.heads == p.heads, "{kind}: the heads read back differ");
            assert_eq!(art.keys[1].weight, p.keys[1].weight);
        }
    }

    #[test]
    fn a_head_layer_removed_is_refused_by_name_though_the_widths_still_chain() {
        let mut p = parts(MapperKind::Residual, None);
        let heads = p.heads.as_mut().unwrap();
        heads.keys[1].layers.pop();
        // The head's own check passes: what is left goes from the input to D_T.
        assert!(heads.keys[1].check(2 * D_S, D_T).is_ok());
        let e = refusal(&p);
        assert!(
            e.contains("tensor `keys.1.head.layer.1.weight` is missing")
                && e.contains("hidden widths [32]")
                && e.contains("baton calibrate"),
            "{e}"
        );
    }

    #[test]
    fn a_wrong_shape_in_the_header_is_refused_by_name() {
        let p = parts(MapperKind::Ridge, None);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.safetensors");
        write(&p, &path);
        assert!(load(&path).is_ok());
        // [32, 32] as [64, 16]: the same element count, once read back as the former.
        reshape_in_header(&path, "keys.1.weight", &[64, 16]);
        let e = load(&path).err().expect("refused").to_string();
        assert!(
            e.contains("tensor `keys.1.weight` has shape [64, 16]")
                && e.contains("calls for [32, 32]"),
            "{e}"
        );
    }

    #[test]
    fn a_half_length_bias_is_named_not_blamed_on_the_head() {
        let mut p = parts(MapperKind::Residual, None);
        p.values[1].bias.truncate(D_T / 2);
        let e = refusal(&p);
        assert!(
            e.contains("tensor `values.1.bias` has shape [16]") && e.contains("calls for [32]"),
            "{e}"
        );
        assert!(!e.contains("head"), "{e}");
    }

    #[test]
    fn factors_scales_and_left_over_tensors_are_checked_too() {
        // Factors of another rank than the metadata's.
        let mut p = parts(MapperKind::Ridge, Some(4));
        p.meta.rank = Some(8);
        let e = refusal(&p);
        assert!(e.contains("tensor `keys.0.left` has shape [16, 4]"), "{e}");
        // Factors the metadata does not mention.
        let mut p = parts(MapperKind::Ridge, Some(4));
        p.meta.rank = None;
        let e = refusal(&p);
        assert!(
            e.contains("tensor `keys.0.left`, which a ridge mapper"),
            "{e}"
        );
        // Heads under a ridge kind.
        let mut p = parts(MapperKind::Residual, None);
        p.meta.kind = MapperKind::Ridge;
        p.meta.training = None;
        let e = refusal(&p);
        assert!(e.contains("tensor `keys.0.head."), "{e}");
        // A source scale cut short.
        let mut p = parts(MapperKind::Ridge, None);
        p.scales.value_std.truncate(D_S);
        let e = refusal(&p);
        assert!(e.contains("tensor `source.value_std` is F32 [16]"), "{e}");
        // A map reading a source layer the source does not have.
        let mut p = parts(MapperKind::Ridge, None);
        p.meta.key_sources[0] = vec![9];
        let e = refusal(&p);
        assert!(e.contains("`keys.0` reads source layer 9"), "{e}");
    }
}
