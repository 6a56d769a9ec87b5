//! The document `baton bench --json` prints: one [`BenchReport`], versioned so that
//! scripts reading it break only on a version bump. Field names and nesting are held by a
//! snapshot test; change them only with [`VERSION`].
//!
//! ```text
//! {format: "baton.bench", version, device, repeats, suffix, results: [{direction,
//!  mapper, k, mapper_cost, points: [BenchPoint], map_ms_per_token,
//!  reprefill_ms_per_token}]}
//! ```
//!
//! Beside it, the cost line and the per-length table printed for people.

use super::switch::{linear_fit, BenchPoint, MapperCost};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

pub const FORMAT: &str = "baton.bench";
pub const VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BenchReport {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`] of this baton.
    pub version: u32,
    /// Where it ran: `cpu`, `cuda:0`, ….
    pub device: String,
    /// Timed runs per variant and length (medians and min–max over them).
    pub repeats: usize,
    /// Tokens of the suffix the incremental variants map or re-prefill.
    pub suffix: usize,
    pub results: Vec<DirectionBench>,
}

/// One direction's sweep over context lengths.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirectionBench {
    /// `"<source> -> <target>"`.
    pub direction: String,
    /// The mapper artifact timed.
    pub mapper: PathBuf,
    pub k: usize,
    pub mapper_cost: MapperCost,
    pub points: Vec<BenchPoint>,
    /// Least-squares growth of the median full map with context length; `null` with
    /// fewer than two lengths.
    pub map_ms_per_token: Option<f64>,
    /// The same for the median full re-prefill.
    pub reprefill_ms_per_token: Option<f64>,
}

impl DirectionBench {
    pub fn new(
        direction: String,
        mapper: PathBuf,
        k: usize,
        mapper_cost: MapperCost,
        points: Vec<BenchPoint>,
    ) -> Self {
        let x: Vec<f64> = points.iter().map(|p| p.tokens as f64).collect();
        let slope = |f: fn(&BenchPoint) -> f64| {
            let (s, _) = linear_fit(&x, &points.iter().map(f).collect::<Vec<_>>());
            (points.len() >= 2 && s.is_finite()).then_some(s)
        };
        Self {
            map_ms_per_token: slope(|p| p.map_full.median_ms),
            reprefill_ms_per_token: slope(|p| p.reprefill_full.median_ms),
            direction,
            mapper,
            k,
            mapper_cost,
            points,
        }
    }

    /// The cost line printed above a direction's table.
    pub fn cost_line(&self) -> String {
        cost_line(&self.direction, self.k, &self.mapper_cost)
    }

    /// How map and re-prefill grow with length; `None` with fewer than two lengths.
    pub fn growth_line(&self) -> Option<String> {
        let (map, pre) = (self.map_ms_per_token?, self.reprefill_ms_per_token?);
        Some(format!(
            "growth: map {map:.4} ms/token ({:.1} GFLOP/s), re-prefill {pre:.4} ms/token",
            self.mapper_cost.flops_per_token / (map * 1e-3) / 1e9
        ))
    }
}

/// The header of the per-length table.
/// The cost line of a direction's mapper, known before anything is timed.
pub fn cost_line(direction: &str, k: usize, c: &MapperCost) -> String {
    format!(
        "{direction} (k={k}{}, {:?}): mapper {:.1} MFLOP/token, {:.1} MB of weights, {:.1} KB of features per token",
        c.rank.map(|r| format!(", rank {r}")).unwrap_or_default(),
        c.precision,
        c.flops_per_token / 1e6,
        c.weight_bytes / 1e6,
        c.activation_bytes_per_token / 1e3
    )
}

pub fn table_header() -> String {
    format!(
        "{:>7} {:>11} {:>11} {:>9} {:>8} {:>11} {:>9} {:>8} {:>9}  (median ms, [min–max] in --json)",
        "tokens", "src prefill", "re-prefill", "map", "speedup", "re-pf sfx", "map sfx", "speedup", "switch"
    )
}

/// One length's row of the table: medians in ms and the two speed-ups.
pub fn table_row(p: &BenchPoint) -> String {
    format!(
        "{:>7} {:>11.1} {:>11.1} {:>9.2} {:>7.1}x {:>11.1} {:>9.2} {:>7.1}x {:>9.1}",
        p.tokens,
        p.source_prefill.median_ms,
        p.reprefill_full.median_ms,
        p.map_full.median_ms,
        p.speedup_full,
        p.reprefill_suffix.median_ms,
        p.map_suffix.median_ms,
        p.speedup_suffix,
        p.switch_end_to_end.median_ms
    ) + &match (p.handoff_with_reread, p.reread_share_of_reprefill) {
        (Some(h), Some(share)) => format!(
            "  with re-read {:.1} ms = {:.0}% of the re-prefill",
            h.median_ms,
            share * 100.0
        ),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Spread;
    use baton_method::mapper::MapPrecision;
    use baton_test_support::json_shape;

    fn point(tokens: usize, map: f64, pre: f64) -> BenchPoint {
        let s = |m: f64| Spread {
            median_ms: m,
            min_ms: m,
            max_ms: m,
        };
        BenchPoint {
            tokens,
            suffix: 64,
            source_prefill: s(pre),
            reprefill_full: s(pre),
            map_full: s(map),
            map_suffix: s(map / 8.0),
            reprefill_suffix: s(pre / 8.0),
            switch_end_to_end: s(map + 20.0),
            speedup_full: pre / map,
            speedup_suffix: pre / map,
            handoff_with_reread: None,
            reread_share_of_reprefill: None,
        }
    }

    fn cost() -> MapperCost {
        MapperCost {
            flops_per_token: 2e6,
            weight_bytes: 1e6,
            activation_bytes_per_token: 1e3,
            precision: MapPrecision::Int8,
            rank: None,
        }
    }

    fn direction(points: Vec<BenchPoint>) -> DirectionBench {
        DirectionBench::new("a -> b".into(), "m.safetensors".into(), 8, cost(), points)
    }

    #[test]
    fn the_bench_document_keeps_its_field_names_and_nesting() {
        let r = BenchReport {
            format: FORMAT.into(),
            version: VERSION,
            device: "cpu".into(),
            repeats: 3,
            suffix: 64,
            results: vec![direction(vec![
                point(128, 1.0, 50.0),
                point(256, 2.0, 110.0),
            ])],
        };
        let v = serde_json::to_value(r).unwrap_or_default();
        insta::assert_snapshot!(json_shape(&v));
    }

    #[test]
    fn growth_is_the_least_squares_slope_and_absent_for_one_length() {
        let d = direction(vec![point(128, 1.0, 50.0), point(256, 2.0, 110.0)]);
        let map = d.map_ms_per_token.unwrap_or(f64::NAN);
        let pre = d.reprefill_ms_per_token.unwrap_or(f64::NAN);
        assert!((map - 1.0 / 128.0).abs() < 1e-12, "{map}");
        assert!((pre - 60.0 / 128.0).abs() < 1e-12, "{pre}");
        assert!(d.growth_line().is_some());
        let one = direction(vec![point(128, 1.0, 50.0)]);
        assert_eq!(one.map_ms_per_token, None);
        assert_eq!(one.growth_line(), None);
        let v = serde_json::to_value(&one).unwrap_or_default();
        assert!(v["map_ms_per_token"].is_null());
    }

    #[test]
    fn a_table_row_shows_the_medians_and_speedups() {
        let row = table_row(&point(1024, 2.0, 100.0));
        assert!(row.trim_start().starts_with("1024"), "{row}");
        assert!(row.contains("50.0x"), "{row}");
    }
}
