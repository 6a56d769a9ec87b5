//! Residual maps kept in the mapper directory, one file per pair and target layer
//! ([`crate::mapper::dir::PairFiles::residual`]): a safetensors file with `weight`
//! [source hidden, target hidden] and `bias` [target hidden] (F32), and header metadata
//! `format = "baton.residual_map"`, `version = "1"`, both models' SHA-256, both layers,
//! the fit's R² and its observations. Written through the directory's staging, so a
//! write that fails leaves what was there.

use super::artifact::ModelRef;
use super::dir::MapperDir;
use super::error::{MapperError, Result};
use super::residual::ResidualMap;
use candle_core::Device;
use safetensors::tensor::TensorView;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const FORMAT: &str = "baton.residual_map";
const VERSION: &str = "1";

fn bad(path: &Path, reason: impl std::fmt::Display) -> MapperError {
    MapperError::BadResidualFile {
        path: path.to_path_buf(),
        reason: reason.to_string(),
    }
}

/// Keep `map` (from `source` to `target`) in `dir`; where it went.
pub fn save(
    dir: &MapperDir,
    source: &ModelRef,
    target: &ModelRef,
    map: &ResidualMap,
) -> Result<PathBuf> {
    let path = dir.pair(source, target).residual(map.target_layer);
    let (weight, bias) = map.parts()?;
    let (d_s, d_t) = map.widths();
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let (w, b) = (bytes(&weight), bytes(&bias));
    let views = vec![
        (
            "weight",
            TensorView::new(Dtype::F32, vec![d_s, d_t], &w).map_err(|e| bad(&path, e))?,
        ),
        (
            "bias",
            TensorView::new(Dtype::F32, vec![d_t], &b).map_err(|e| bad(&path, e))?,
        ),
    ];
    let meta: HashMap<String, String> = [
        ("format", FORMAT.to_string()),
        ("version", VERSION.to_string()),
        ("source_sha256", source.sha256.clone()),
        ("target_sha256", target.sha256.clone()),
        ("source_layer", map.source_layer.to_string()),
        ("target_layer", map.target_layer.to_string()),
        ("r2", map.r2.to_string()),
        ("observations", map.observations.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let data = safetensors::serialize(views, Some(meta)).map_err(|e| bad(&path, e))?;
    let write = |e: super::dir::DirError| bad(&path, e);
    let mut staging = dir.stage().map_err(write)?;
    let staged = staging
        .new_root()
        .pair(source, target)
        .residual(map.target_layer);
    staging.write(&staged, &data).map_err(write)?;
    staging.commit().map_err(write)?;
    Ok(path)
}

/// The map kept in `dir` from `source` to `target`'s layer `target_layer`, if any; one
/// kept for other models is refused.
pub fn load(
    dir: &MapperDir,
    source: &ModelRef,
    target: &ModelRef,
    target_layer: usize,
    device: &Device,
) -> Result<Option<ResidualMap>> {
    let path = dir.pair(source, target).residual(target_layer);
    let data = match std::fs::read(&path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(MapperError::Io { path, source }),
    };
    let (_, header) = SafeTensors::read_metadata(&data).map_err(|e| bad(&path, e))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let get = |k: &str| {
        meta.get(k)
            .cloned()
            .ok_or_else(|| bad(&path, format!("no {k} in its header")))
    };
    let number = |k: &str| -> Result<f64> {
        get(k)?
            .parse::<f64>()
            .map_err(|_| bad(&path, format!("its {k} is not a number")))
    };
    if get("format")? != FORMAT || get("version")? != VERSION {
        return Err(bad(&path, format!("this baton reads {FORMAT} {VERSION}")));
    }
    if get("source_sha256")? != source.sha256 || get("target_sha256")? != target.sha256 {
        return Err(bad(&path, "it was fitted for other models"));
    }
    if number("target_layer")? as usize != target_layer {
        return Err(bad(&path, "it maps to another layer than its name says"));
    }
    let st = SafeTensors::deserialize(&data).map_err(|e| bad(&path, e))?;
    let floats = |name: &str| -> Result<Vec<f32>> {
        let t = st.tensor(name).map_err(|e| bad(&path, e))?;
        if t.dtype() != Dtype::F32 {
            return Err(bad(&path, format!("{name} is not F32")));
        }
        Ok(t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let map = ResidualMap::from_parts(
        number("source_layer")? as usize,
        target_layer,
        number("r2")?,
        number("observations")? as u64,
        floats("weight")?,
        floats("bias")?,
        device,
    )?;
    Ok(Some(map))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mapper::dir::tests::model;

    #[test]
    fn a_map_kept_comes_back_and_one_for_other_models_is_refused() -> Result<()> {
        let tmp = tempfile::tempdir().map_err(|source| MapperError::Io {
            path: PathBuf::new(),
            source,
        })?;
        let dir = MapperDir::named(tmp.path());
        let (s, t) = (model("small", "aa11"), model("large", "bb22"));
        let map = ResidualMap::from_parts(
            2,
            3,
            0.8,
            1000,
            vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            vec![0.5, -0.5],
            &Device::Cpu,
        )?;
        assert!(
            load(&dir, &s, &t, 3, &Device::Cpu)?.is_none(),
            "nothing kept yet"
        );
        let path = save(&dir, &s, &t, &map)?;
        assert!(path.starts_with(tmp.path()));
        let back = load(&dir, &s, &t, 3, &Device::Cpu)?.expect("kept");
        assert_eq!((back.source_layer, back.target_layer), (2, 3));
        assert_eq!((back.r2, back.observations), (0.8, 1000));
        assert_eq!(back.parts()?, map.parts()?);
        assert!(
            load(&dir, &s, &t, 4, &Device::Cpu)?.is_none(),
            "another layer"
        );
        // The same file under another model's checksum: refused, and the fix is named.
        let other = model("large", "cc33");
        let moved = dir.pair(&s, &other).residual(3);
        std::fs::create_dir_all(moved.parent().unwrap()).unwrap();
        std::fs::copy(&path, &moved).unwrap();
        let e = load(&dir, &s, &other, 3, &Device::Cpu)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other models") && e.contains("fits it again"),
            "{e}"
        );
        std::fs::write(&path, b"not safetensors").unwrap();
        assert!(load(&dir, &s, &t, 3, &Device::Cpu).is_err());
        Ok(())
    }
}
