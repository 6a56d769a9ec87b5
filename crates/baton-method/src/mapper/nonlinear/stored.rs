//! Heads as an artifact stores them: plain f32 tensors named after the map they belong
//! to, `keys.<layer>.head.in_mean`, `….in_scale`, `….out_scale`, `….out_mean`, and
//! `….layer.<i>.weight` / `….bias` in order; the activation and how the head is used come
//! from the mapper's kind.

use super::{Dense, Head, Heads, MapperKind};

/// A named f32 tensor: name, values, shape.
pub type Buffer = (String, Vec<f32>, Vec<usize>);

/// Every tensor of `heads`, named for the artifact.
pub fn buffers(heads: &Heads) -> Vec<Buffer> {
    let mut out = Vec::new();
    for (side, list) in [("keys", &heads.keys), ("values", &heads.values)] {
        for (j, h) in list.iter().enumerate() {
            let p = format!("{side}.{j}.head");
            for (name, v) in [
                ("in_mean", &h.in_mean),
                ("in_scale", &h.in_scale),
                ("out_scale", &h.out_scale),
                ("out_mean", &h.out_mean),
            ] {
                out.push((format!("{p}.{name}"), v.clone(), vec![v.len()]));
            }
            for (i, l) in h.layers.iter().enumerate() {
                out.push((
                    format!("{p}.layer.{i}.weight"),
                    l.weight.clone(),
                    vec![l.rows, l.cols],
                ));
                out.push((format!("{p}.layer.{i}.bias"), l.bias.clone(), vec![l.cols]));
            }
        }
    }
    out
}

/// The heads of a `kind` mapper with `layers` target layers, read with `read` (a tensor's
/// values by name) and `has` (whether the file holds a name); `widths` gives each map's
/// (input, output) widths for the check.
pub fn read(
    kind: MapperKind,
    layers: usize,
    read: &dyn Fn(&str) -> Result<Vec<f32>, String>,
    has: &dyn Fn(&str) -> bool,
    widths: &dyn Fn(bool, usize) -> (usize, usize),
) -> Result<Option<Heads>, String> {
    let Some((_, activation, used)) = kind.architecture() else {
        return Ok(None);
    };
    let mut sides = Vec::new();
    for (side, keys) in [("keys", true), ("values", false)] {
        let mut list = Vec::with_capacity(layers);
        for j in 0..layers {
            let p = format!("{side}.{j}.head");
            let mut dense = Vec::new();
            while has(&format!("{p}.layer.{}.weight", dense.len())) {
                let i = dense.len();
                let weight = read(&format!("{p}.layer.{i}.weight"))?;
                let bias = read(&format!("{p}.layer.{i}.bias"))?;
                let cols = bias.len();
                dense.push(Dense {
                    rows: weight.len() / cols.max(1),
                    cols,
                    weight,
                    bias,
                });
            }
            let head = Head {
                activation,
                used,
                in_mean: read(&format!("{p}.in_mean"))?,
                in_scale: read(&format!("{p}.in_scale"))?,
                layers: dense,
                out_scale: read(&format!("{p}.out_scale"))?,
                out_mean: read(&format!("{p}.out_mean"))?,
            };
            let (input, output) = widths(keys, j);
            head.check(input, output).map_err(|e| format!("{p}: {e}"))?;
            list.push(head);
        }
        sides.push(list);
    }
    let values = sides.pop().unwrap_or_default();
    let keys = sides.pop().unwrap_or_default();
    Ok(Some(Heads { kind, keys, values }))
}
