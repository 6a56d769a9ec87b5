//! The token block: the target's own layer-0 keys and values offered to every map as
//! extra source features.
//!
//! A source model's cache carries which token stands at a position only through its own
//! projections, and a ridge map from them loses most of it: the late target layers'
//! values, which carry the token an answer copies out of the context (a name, a number),
//! were the worst-fitted half of the cache. The target computes its own layer 0 from the
//! token ids alone ([`baton_runtime::model::LayerZero`]), so those features are exact and cost a
//! small fraction of one layer's prefill. With them:
//!
//! ```text
//! x(t) = [ x_s1(t) | … | x_sk(t) | K̄⁰_T(t) | V⁰_T(t) ]
//! ```
//!
//! The block `[K̄⁰_T | V⁰_T]` (2·D_t wide) is cut into `m = 2·D_t / D_s` pieces of the
//! source's width and each piece is handled as one more source layer, indices
//! `L_s .. L_s + m`: the statistics, the ridge, the artifact and the int8 path then need
//! nothing new. Every target layer's K and V maps read all `m` pieces. Target layer 0
//! itself becomes an exact copy (up to the ridge's λ), since its keys and values are in
//! the block.

use super::MapperError;
use baton_runtime::model::ModelError;
use candle_core::Tensor;

/// How many source-width pieces the block of a target with key/value width `d_t` makes
/// for a source of width `d_s`.
pub fn block_layers(d_s: usize, d_t: usize) -> Result<usize, MapperError> {
    if d_s == 0 || !(2 * d_t).is_multiple_of(d_s) {
        return Err(MapperError::Geometry(format!(
            "token features need the target's layer-0 keys and values ({} values a \
             position) to split into pieces of the source's width {d_s}; this pair does \
             not allow it, calibrate without --token-features",
            2 * d_t
        )));
    }
    Ok(2 * d_t / d_s)
}

/// `rows` rows of `src` (each `src_width` wide) with the block appended to each row: the
/// first `d_t` values of the matching rows of `tgt_k` and `tgt_v` (each `tgt_width`
/// wide, layer 0 first, as calibration's all-layer features are laid out).
pub fn with_block(
    src: &[f32],
    src_width: usize,
    tgt_k: &[f32],
    tgt_v: &[f32],
    tgt_width: usize,
    d_t: usize,
    rows: usize,
) -> Result<Vec<f32>, MapperError> {
    if src.len() != rows * src_width
        || tgt_k.len() != rows * tgt_width
        || tgt_v.len() != rows * tgt_width
        || d_t > tgt_width
    {
        return Err(MapperError::MapShape(format!(
            "{rows} rows of {src_width} source and {tgt_width} target features do not \
             match buffers of {}, {} and {} values",
            src.len(),
            tgt_k.len(),
            tgt_v.len()
        )));
    }
    let mut out = Vec::with_capacity(rows * (src_width + 2 * d_t));
    for r in 0..rows {
        out.extend_from_slice(&src[r * src_width..(r + 1) * src_width]);
        out.extend_from_slice(&tgt_k[r * tgt_width..r * tgt_width + d_t]);
        out.extend_from_slice(&tgt_v[r * tgt_width..r * tgt_width + d_t]);
    }
    Ok(out)
}

/// The block of layer-0 keys `k0` and values `v0` ([rows, D_t] each), cut into pieces of
/// `d_s` columns: piece `i` is source layer `L_s + i`.
pub fn pieces(k0: &Tensor, v0: &Tensor, d_s: usize) -> Result<Vec<Tensor>, ModelError> {
    let block = Tensor::cat(&[k0, v0], 1)?;
    let width = block.dim(1)?;
    let m = block_layers(d_s, width / 2).map_err(|e| ModelError::Cache(e.to_string()))?;
    (0..m)
        .map(|i| Ok(block.narrow(1, i * d_s, d_s)?.contiguous()?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn the_block_splits_only_into_whole_pieces_of_the_source_width() {
        assert_eq!(block_layers(128, 256).unwrap(), 4);
        assert_eq!(block_layers(256, 128).unwrap(), 1);
        let e = block_layers(96, 128).unwrap_err().to_string();
        assert!(e.contains("without --token-features"), "{e}");
        assert!(block_layers(0, 128).is_err());
    }

    #[test]
    fn each_row_gets_the_targets_layer_zero_keys_then_values() {
        // 2 rows, 3 source features, 2 target layers of width 2.
        let src = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let tk = [10.0, 11.0, 12.0, 13.0, 20.0, 21.0, 22.0, 23.0];
        let tv = [-10.0, -11.0, -12.0, -13.0, -20.0, -21.0, -22.0, -23.0];
        let got = with_block(&src, 3, &tk, &tv, 4, 2, 2).unwrap();
        assert_eq!(
            got,
            [
                1.0, 2.0, 3.0, 10.0, 11.0, -10.0, -11.0, //
                4.0, 5.0, 6.0, 20.0, 21.0, -20.0, -21.0
            ]
        );
        assert!(with_block(&src, 3, &tk, &tv, 4, 2, 3).is_err());
        assert!(with_block(&src, 3, &tk, &tv, 4, 5, 2).is_err());
    }

    #[test]
    fn pieces_cover_the_keys_then_the_values_in_order() -> Result<(), ModelError> {
        let dev = Device::Cpu;
        let k = Tensor::new(&[[1f32, 2.0], [5.0, 6.0]], &dev)?;
        let v = Tensor::new(&[[3f32, 4.0], [7.0, 8.0]], &dev)?;
        let p = pieces(&k, &v, 1)?;
        assert_eq!(p.len(), 4);
        assert_eq!(p[2].to_vec2::<f32>()?, vec![vec![3.0], vec![7.0]]);
        let p = pieces(&k, &v, 4)?;
        assert_eq!(
            p[0].to_vec2::<f32>()?,
            vec![vec![1.0, 2.0, 3.0, 4.0], vec![5.0, 6.0, 7.0, 8.0]]
        );
        Ok(())
    }
}
