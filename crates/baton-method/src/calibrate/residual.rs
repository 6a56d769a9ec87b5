//! Calibrating a residual map ([`crate::mapper::residual`]): both models read the same
//! calibration windows (plain and chat-shaped, as the KV maps are calibrated), each
//! keeping its residual stream at its layer, and one ridge is fitted from the source's to
//! the target's.

use super::{mixed_windows, CalibrateError};
use crate::mapper::artifact::ModelRef;
use crate::mapper::dir::MapperDir;
use crate::mapper::residual::{matching_layer, ResidualMap};
use crate::mapper::residual_file;
use crate::mapper::PairStats;
use baton_data::corpus::{Document, Split};
use baton_runtime::model::Model;
use candle_core::{DType, Tensor};

/// How a residual map is calibrated.
#[derive(Debug, Clone, Copy)]
pub struct ResidualFit {
    /// Windows read, and their length in tokens.
    pub sequences: usize,
    pub seq_len: usize,
    /// The share of windows in the chat template's shape.
    pub chat_share: f64,
    /// First positions of every window left out of the fit: the attention sink's
    /// residual stream holds activations thousands of times the rest, and a handoff never
    /// maps it (the target holds its opening).
    pub skip_first: usize,
    pub lambda: f64,
}

impl Default for ResidualFit {
    fn default() -> Self {
        Self {
            sequences: 32,
            seq_len: 256,
            chat_share: 0.5,
            skip_first: 4,
            lambda: 1.0,
        }
    }
}

/// Fit one map for each target layer of `target_layers`, from `src`'s residual stream
/// at the layer of the same depth ([`matching_layer`]) to `tgt`'s entering that layer, on
/// windows of `docs`'s fitting split. Both models read each window once, keeping every
/// layer asked for.
pub fn fit_residual_maps(
    src: &Model,
    tgt: &Model,
    docs: &[Document],
    target_layers: &[usize],
    opts: &ResidualFit,
) -> Result<Vec<ResidualMap>, CalibrateError> {
    let windows = mixed_windows(
        src,
        docs,
        Split::Fit,
        opts.seq_len,
        (0, opts.sequences),
        opts.chat_share,
    )?;
    let (ls, lt) = (src.config().n_layer, tgt.config().n_layer);
    let source_layers: Vec<usize> = target_layers
        .iter()
        .map(|&m| matching_layer(m, lt, ls))
        .collect();
    let (d_s, d_t) = (src.config().hidden, tgt.config().hidden);
    let mut stats = target_layers
        .iter()
        .map(|_| PairStats::new(1, d_s, 1, d_t))
        .collect::<Result<Vec<_>, _>>()?;
    for w in &windows {
        let xs = src
            .decoder
            .forward_keeping(w, &mut src.decoder.new_cache(), &source_layers)?;
        let ys = tgt
            .decoder
            .forward_keeping(w, &mut tgt.decoder.new_cache(), target_layers)?;
        let skip = opts.skip_first.min(w.len());
        let rows = w.len() - skip;
        if rows == 0 {
            continue;
        }
        let flat = |t: &Tensor| -> Result<Vec<f32>, CalibrateError> {
            Ok(t.narrow(0, skip, rows)?
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?)
        };
        for ((x, y), st) in xs.iter().zip(&ys).zip(stats.iter_mut()) {
            st.update(&flat(x)?, &flat(y)?, rows)?;
        }
    }
    stats
        .iter()
        .zip(source_layers.iter().zip(target_layers))
        .map(|(st, (&i, &m))| {
            Ok(ResidualMap::fit(
                st,
                i,
                m,
                opts.lambda,
                tgt.decoder.device(),
            )?)
        })
        .collect()
}

/// The residual maps from `src` to each of `tgt`'s `target_layers`: those kept in `dir`
/// read back, the others fitted on the default calibration text ([`fit_residual_maps`],
/// one read of the windows for all of them) and kept there, so that the workbench and
/// the evaluation use the same maps and each is fitted once. `status` hears, as it
/// happens (a fit takes a minute on two cores), what is
/// fitted, what it scored, and any kept map that could not be read (it is fitted again)
/// or fitted map that could not be kept (it is used all the same).
pub fn kept_or_fitted(
    src: &Model,
    tgt: &Model,
    dir: Option<&MapperDir>,
    target_layers: &[usize],
    opts: &ResidualFit,
    status: &mut dyn FnMut(&str),
) -> Result<Vec<ResidualMap>, CalibrateError> {
    let (rs, rt) = (
        ModelRef::new(&src.identity, src.config()),
        ModelRef::new(&tgt.identity, tgt.config()),
    );
    let mut found: Vec<Option<ResidualMap>> = Vec::with_capacity(target_layers.len());
    for &m in target_layers {
        found.push(match dir {
            Some(dir) => match residual_file::load(dir, &rs, &rt, m, tgt.decoder.device()) {
                Ok(map) => map,
                Err(e) => {
                    status(&e.to_string());
                    None
                }
            },
            None => None,
        });
    }
    let missing: Vec<usize> = target_layers
        .iter()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(&m, _)| m)
        .collect();
    if !missing.is_empty() {
        status(&format!(
            "fitting the residual map {} -> {} to layer(s) {missing:?} on the calibration text \
             (once: it is kept in the mapper directory)",
            rs.name, rt.name
        ));
        let started = std::time::Instant::now();
        let docs = baton_data::corpus::read_documents(&baton_data::corpus::default_files()?)?;
        let mut fitted = fit_residual_maps(src, tgt, &docs, &missing, opts)?.into_iter();
        let seconds = started.elapsed().as_secs_f64();
        for slot in found.iter_mut().filter(|f| f.is_none()) {
            let Some(map) = fitted.next() else { break };
            let kept = match dir.map(|d| residual_file::save(d, &rs, &rt, &map)) {
                Some(Ok(_)) => "kept in the mapper directory".to_string(),
                Some(Err(e)) => format!("used, and not kept: {e}"),
                None => "used for this run only".to_string(),
            };
            status(&format!(
                "residual map {} -> {} layer {} (from its layer {}): R² {:.3} on {} positions, \
                 fitted in {seconds:.1} s, {kept}",
                rs.name, rt.name, map.target_layer, map.source_layer, map.r2, map.observations
            ));
            *slot = Some(map);
        }
    }
    found
        .into_iter()
        .map(|f| {
            f.ok_or_else(|| {
                CalibrateError::Options("the residual fit returned too few maps".into())
            })
        })
        .collect()
}
