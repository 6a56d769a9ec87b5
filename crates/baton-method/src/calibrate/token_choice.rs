//! Which target layers read the token block, when not all of them. The block gives the
//! late layers' values the token identity they carry (their held-out R² rises most), but
//! on the default pair it also costs other layers held-out attention cosine: 512 more
//! features on 8,192 observations fit some noise. Two per-layer choices are offered:
//!
//! - **cosine**: a layer's attention output at the probes depends only on that layer's
//!   keys and values (the queries are the target's own), so of keys and values each with
//!   or without the block, the combination with the best held-out cosine of that layer;
//! - **R²**: keys and values each separately, where the block raises the held-out R².

use super::heldout::{ScoreMaps, Scored};
use super::CalibrateError;
use crate::mapper::calibration_report::BlockLayers;
use crate::mapper::ridge::r2;
use crate::mapper::{LayerMap, PairStats};

/// The held-out number a layer's choice is made by.
#[derive(Clone, Copy)]
pub enum By<'a> {
    Cosine,
    /// On these held-out statistics of keys and values.
    R2 {
        keys: &'a PairStats,
        values: &'a PairStats,
    },
}

/// Per layer the best of the four combinations of `with` (every map reads the block)
/// and `without` (none does) by `by`, scored again as a whole.
pub fn choose(
    with: Scored,
    without: (Vec<LayerMap>, Vec<LayerMap>),
    by: By<'_>,
    scorer: &dyn ScoreMaps,
) -> Result<(Scored, BlockLayers), CalibrateError> {
    let (nk, nv) = without;
    let plain = scorer.score(&nk, &nv)?;
    let layers = with.keys.len();
    // [plain, keys only, values only, both] per layer.
    let cosines: Vec<[f64; 4]> = match by {
        By::Cosine => {
            let keys_only = scorer.score(&with.keys, &nv)?;
            let values_only = scorer.score(&nk, &with.values)?;
            (0..layers)
                .map(|j| {
                    [
                        plain.cosine[j],
                        keys_only.cosine[j],
                        values_only.cosine[j],
                        with.held.cosine[j],
                    ]
                })
                .collect()
        }
        By::R2 { keys, values } => (0..layers)
            .map(|j| {
                let (k0, k1) = (r2(keys, j, &nk[j])?, r2(keys, j, &with.keys[j])?);
                let (v0, v1) = (r2(values, j, &nv[j])?, r2(values, j, &with.values[j])?);
                // Keys and values are judged apart: the sum orders the four as the two
                // separate choices would.
                Ok([k0 + v0, k1 + v0, k0 + v1, k1 + v1])
            })
            .collect::<Result<_, CalibrateError>>()?,
    };
    let (mut keys, mut values) = (Vec::with_capacity(layers), Vec::with_capacity(layers));
    let mut chosen = BlockLayers {
        keys: Vec::new(),
        values: Vec::new(),
        cosine_everywhere: with.held.mean_cosine(),
        cosine_nowhere: plain.mean_cosine(),
    };
    for j in 0..layers {
        // Ties go to the plainer combination: the block costs map time.
        let best = (0..4)
            .reduce(|b, c| if cosines[j][c] > cosines[j][b] { c } else { b })
            .unwrap_or(0);
        let (k_block, v_block) = (best & 1 == 1, best & 2 == 2);
        keys.push(if k_block { &with.keys[j] } else { &nk[j] }.clone());
        values.push(if v_block { &with.values[j] } else { &nv[j] }.clone());
        if k_block {
            chosen.keys.push(j);
        }
        if v_block {
            chosen.values.push(j);
        }
    }
    let held = scorer.score(&keys, &values)?;
    Ok((Scored { keys, values, held }, chosen))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::calibrate::heldout::HeldOut;
    use crate::mapper::ridge::FitInfo;
    use crate::metrics::logits::NextTokenAgreement;

    fn map(tag: f32) -> LayerMap {
        LayerMap {
            sources: vec![0],
            weight: vec![tag],
            bias: vec![0.0],
            info: FitInfo::default(),
            factors: None,
        }
    }

    /// Layer j's cosine is a fixed function of which of its maps carry the block (a
    /// weight of 1), as the real scorer's is of that layer's maps alone.
    struct ByLayer(Vec<[f64; 4]>);

    impl ScoreMaps for ByLayer {
        fn score(&self, keys: &[LayerMap], values: &[LayerMap]) -> Result<HeldOut, CalibrateError> {
            let cosine = (0..keys.len())
                .map(|j| {
                    let c = (keys[j].weight[0] == 1.0) as usize
                        + 2 * (values[j].weight[0] == 1.0) as usize;
                    self.0[j][c]
                })
                .collect();
            Ok(HeldOut {
                cosine,
                agreement: NextTokenAgreement::default(),
            })
        }
    }

    #[test]
    fn each_layer_takes_its_best_combination_and_ties_stay_plain() {
        // [plain, keys only, values only, both]
        let scorer = ByLayer(vec![
            [0.9, 0.5, 0.5, 0.5],
            [0.1, 0.2, 0.8, 0.3],
            [0.1, 0.2, 0.3, 0.9],
            [0.5, 0.5, 0.5, 0.5],
        ]);
        let with_maps = vec![map(1.0); 4];
        let with = Scored {
            keys: with_maps.clone(),
            values: with_maps.clone(),
            held: scorer.score(&with_maps, &with_maps).unwrap(),
        };
        let without = (vec![map(0.0); 4], vec![map(0.0); 4]);
        let (scored, chosen) = choose(with, without, By::Cosine, &scorer).unwrap();
        assert_eq!(chosen.keys, vec![2]);
        assert_eq!(chosen.values, vec![1, 2]);
        assert_eq!(scored.held.cosine, vec![0.9, 0.8, 0.9, 0.5]);
        assert!((chosen.cosine_everywhere - 0.55).abs() < 1e-12);
        assert!((chosen.cosine_nowhere - 0.4).abs() < 1e-12);
    }
}
