//! Writing an artifact: every map's tensors and the trained heads', with the metadata in
//! the header, and a readable copy of the metadata beside it. They are written where
//! they are asked to be (a mapper directory's staging, see [`crate::mapper::dir`]),
//! which puts them in place whole.

use super::{io, ArtifactError, MapperMeta};
use crate::mapper::nonlinear::{stored, Heads};
use crate::mapper::ridge::LayerMap;
use crate::mapper::SourceScales;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The maps an artifact stores, borrowed from whoever fitted them.
#[derive(Clone, Copy)]
pub struct Maps<'a> {
    pub keys: &'a [LayerMap],
    pub values: &'a [LayerMap],
    pub source_scales: &'a SourceScales,
    pub heads: Option<&'a Heads>,
}

/// Writes `maps` to `path`, and their metadata for people to `readable`.
pub fn save(
    maps: Maps<'_>,
    meta: &MapperMeta,
    path: &Path,
    readable: &Path,
) -> Result<(), ArtifactError> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let json = serde_json::to_string_pretty(meta).map_err(|e| ArtifactError::Bad {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let mut buffers: Vec<(String, Vec<u8>, Vec<usize>)> = Vec::new();
    for (kind, layer_maps) in [("keys", maps.keys), ("values", maps.values)] {
        for (j, m) in layer_maps.iter().enumerate() {
            let rows = m.weight.len() / m.bias.len().max(1);
            buffers.push((
                format!("{kind}.{j}.weight"),
                f32_bytes(&m.weight),
                vec![rows, m.bias.len()],
            ));
            buffers.push((
                format!("{kind}.{j}.bias"),
                f32_bytes(&m.bias),
                vec![m.bias.len()],
            ));
            if let Some(f) = &m.factors {
                buffers.push((
                    format!("{kind}.{j}.left"),
                    f32_bytes(&f.left),
                    vec![rows, f.rank],
                ));
                buffers.push((
                    format!("{kind}.{j}.right"),
                    f32_bytes(&f.right),
                    vec![f.rank, m.bias.len()],
                ));
            }
        }
    }
    let sc = maps.source_scales;
    for (name, v) in [
        ("source.key_mean", &sc.key_mean),
        ("source.key_std", &sc.key_std),
        ("source.value_mean", &sc.value_mean),
        ("source.value_std", &sc.value_std),
    ] {
        buffers.push((name.to_string(), f32_bytes(v), vec![v.len()]));
    }
    if let Some(h) = maps.heads {
        for (name, v, shape) in stored::buffers(h) {
            buffers.push((name, f32_bytes(&v), shape));
        }
    }
    let views: Vec<(String, TensorView<'_>)> = buffers
        .iter()
        .map(|(n, b, s)| {
            TensorView::new(Dtype::F32, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| ArtifactError::Bad {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    let mut header = HashMap::new();
    header.insert("baton".to_string(), json.clone());
    // A write cut short (a full disk) leaves no part-written file behind.
    let gone = |p: &Path| {
        let _ = std::fs::remove_file(p);
    };
    safetensors::serialize_to_file(views, Some(header), path).map_err(|e| {
        gone(path);
        ArtifactError::Bad {
            path: path.to_path_buf(),
            reason: e.to_string(),
        }
    })?;
    std::fs::write(readable, json).map_err(|e| {
        gone(readable);
        io(readable)(e)
    })?;
    Ok(())
}
