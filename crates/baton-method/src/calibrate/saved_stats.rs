//! Saved calibration statistics: the key and value [`PairStats`] of one direction, kept
//! beside the artifacts so that a later calibration can add windows to them and re-solve
//! k and λ without capturing again what they already hold.
//!
//! The statistics are sufficient for the ridge fit and they add up (see
//! [`crate::mapper::stats`]): statistics saved from one corpus, merged with those of
//! another, fit exactly the map one calibration on both corpora would fit.
//!
//! Layout, under a mapper directory: `stats/<artifact name>/` holding `keys.safetensors`,
//! `values.safetensors` (the [`PairStats`] file format) and `meta.json`
//! ([`StatsMeta`]: the two models, the token block, and every set of windows the
//! statistics hold). A save writes a fresh directory and swaps it in, so a crash leaves
//! the previous statistics whole.

use super::capture::DirectionStats;
use super::{CalibrateError, Direction};
use crate::mapper::artifact::ModelRef;
use crate::mapper::PairStats;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const FORMAT: &str = "baton-stats";
pub const VERSION: u32 = 1;

/// One set of fitting windows folded into the statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsSource {
    /// The corpus's files, as the artifact names them.
    pub corpus: String,
    pub fingerprint: String,
    /// Index of the first fit window taken from the corpus (`--skip-windows`).
    pub first_window: usize,
    pub windows: usize,
    pub seq_len: usize,
    pub stride: usize,
    pub chat_share: f64,
    pub observations: u64,
}

impl StatsSource {
    /// Whether `other` read any window this one read: the same corpus and window shape
    /// with overlapping window ranges. Folding a window in twice would count it double.
    pub fn overlaps(&self, other: &StatsSource) -> bool {
        self.fingerprint == other.fingerprint
            && self.seq_len == other.seq_len
            && self.chat_share == other.chat_share
            && self.first_window < other.first_window + other.windows
            && other.first_window < self.first_window + self.windows
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsMeta {
    pub format: String,
    pub version: u32,
    pub source: ModelRef,
    pub target: ModelRef,
    /// Source layers past the source's own: the token block's pieces (0 without it).
    pub token_layers: usize,
    /// Leading positions of each window left out of the statistics.
    pub skip_first: usize,
    /// The power of the attention weights the positions were fitted with (0: none).
    #[serde(default)]
    pub attention_weight: f32,
    pub observations: u64,
    pub sources: Vec<StatsSource>,
}

impl StatsMeta {
    pub fn windows(&self) -> usize {
        self.sources.iter().map(|s| s.windows).sum()
    }

    /// One line for `baton mappers`: how much the statistics hold and where it came from.
    pub fn summary(&self) -> String {
        let from: Vec<String> = self
            .sources
            .iter()
            .map(|s| {
                format!(
                    "{} windows {}..{} of {} tokens",
                    s.corpus,
                    s.first_window,
                    s.first_window + s.windows,
                    s.seq_len
                )
            })
            .collect();
        format!(
            "saved statistics: {} windows, {} observations ({})",
            self.windows(),
            self.observations,
            from.join("; ")
        )
    }
}

/// The description of the statistics saved in `dir`, without reading the statistics
/// themselves; `None` where none were saved.
pub fn read_meta(dir: &Path) -> Result<Option<StatsMeta>, CalibrateError> {
    let path = dir.join("meta.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| bad(&path, format!("not readable: {e}"))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(&path, e)),
    }
}

/// A direction's statistics with what they hold.
#[derive(Debug)]
pub struct SavedStats {
    pub stats: DirectionStats,
    pub meta: StatsMeta,
}

fn bad(path: &Path, reason: String) -> CalibrateError {
    CalibrateError::Stats {
        path: path.to_path_buf(),
        reason,
    }
}

fn io(path: &Path, e: std::io::Error) -> CalibrateError {
    bad(path, e.to_string())
}

/// `dir` with `.suffix` appended to its name (its name has dots of its own).
/// Writes `saved` into `dir`, a fresh directory of a staging
/// ([`crate::mapper::dir::Staging`]) that puts it in place whole.
pub fn save(saved: &SavedStats, dir: &Path) -> Result<(), CalibrateError> {
    let json = serde_json::to_string_pretty(&saved.meta).map_err(|e| bad(dir, e.to_string()))?;
    write_dir(dir, &saved.stats, "meta.json", &json)
}

/// Writes `stats` and a description of them named `meta_name` into `dir` (made if
/// missing). A write cut short (a full disk) leaves no half-written directory behind.
pub fn write_dir(
    dir: &Path,
    stats: &DirectionStats,
    meta_name: &str,
    meta_json: &str,
) -> Result<(), CalibrateError> {
    let fresh = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let written = (|| {
        stats.keys.save(&dir.join("keys.safetensors"))?;
        stats.values.save(&dir.join("values.safetensors"))?;
        let meta_path = dir.join(meta_name);
        std::fs::write(&meta_path, meta_json).map_err(|e| io(&meta_path, e))
    })();
    if written.is_err() && fresh {
        let _ = std::fs::remove_dir_all(dir);
    }
    written
}

/// Reads the statistics of `direction` from `dir`, checked against the two models they
/// must have been captured between.
pub fn load(
    dir: &Path,
    direction: Direction,
    source: &ModelRef,
    target: &ModelRef,
) -> Result<SavedStats, CalibrateError> {
    let meta_path = dir.join("meta.json");
    let meta = read_meta(dir)?.ok_or_else(|| {
        bad(
            dir,
            format!(
                "no saved statistics for {} -> {} here; calibrate with `baton calibrate` \
                 (without --no-save-stats) to keep them",
                source.name, target.name
            ),
        )
    })?;
    if meta.format != FORMAT || meta.version != VERSION {
        return Err(bad(
            &meta_path,
            format!(
                "format {} version {}, this build reads {FORMAT} version {VERSION}",
                meta.format, meta.version
            ),
        ));
    }
    for (what, want, got) in [
        ("source", source, &meta.source),
        ("target", target, &meta.target),
    ] {
        if want.sha256 != got.sha256 {
            return Err(bad(
                dir,
                format!(
                    "captured with {} {} (sha256 {}), not {} (sha256 {}): statistics only \
                     add up between the same two models",
                    what, got.name, got.sha256, want.name, want.sha256
                ),
            ));
        }
    }
    let keys = PairStats::load(&dir.join("keys.safetensors"))?;
    let values = PairStats::load(&dir.join("values.safetensors"))?;
    let geometry = |p: &PairStats| (p.l_s(), p.d_s(), p.l_t(), p.d_t());
    let expected = (
        source.layers + meta.token_layers,
        source.kv_heads * source.head_dim,
        target.layers,
        target.kv_heads * target.head_dim,
    );
    if geometry(&keys) != expected || geometry(&values) != expected {
        return Err(bad(
            dir,
            format!(
                "the statistics' geometry {:?} / {:?} does not match the models' {expected:?} \
                 (layers with the token block, width, target layers, width)",
                geometry(&keys),
                geometry(&values)
            ),
        ));
    }
    if keys.count() != meta.observations || values.count() != meta.observations {
        return Err(bad(
            dir,
            format!(
                "meta.json says {} observations, the files hold {} (keys) and {} (values): \
                 the directory is mixed from two saves; calibrate again with `baton calibrate`",
                meta.observations,
                keys.count(),
                values.count()
            ),
        ));
    }
    Ok(SavedStats {
        stats: DirectionStats {
            direction,
            keys,
            values,
            token_layers: meta.token_layers,
        },
        meta,
    })
}

/// Folds `prior` (read from `prior_dir`) into `into`, statistics of the same direction,
/// refusing what would not add up (see [`check_merge`]).
pub fn merge_into(
    into: &mut SavedStats,
    prior: &SavedStats,
    prior_dir: &Path,
) -> Result<(), CalibrateError> {
    check_merge(&into.meta, &prior.meta, prior_dir)?;
    into.stats.keys.merge(&prior.stats.keys)?;
    into.stats.values.merge(&prior.stats.values)?;
    into.meta.observations = into.stats.keys.count();
    let mut sources = prior.meta.sources.clone();
    sources.append(&mut into.meta.sources);
    into.meta.sources = sources;
    Ok(())
}

/// Whether statistics described by `b` (from `prior_dir`) add up with those described
/// by `a`: the same token block and sink skip, and no window counted in both.
pub fn check_merge(a: &StatsMeta, b: &StatsMeta, prior_dir: &Path) -> Result<(), CalibrateError> {
    if a.token_layers != b.token_layers {
        let with = |n: usize| if n > 0 { "with" } else { "without" };
        return Err(bad(
            prior_dir,
            format!(
                "captured {} token features, and this calibration runs {} them: use \
                 --token-features {} to add to them",
                with(b.token_layers),
                with(a.token_layers),
                if b.token_layers > 0 { "all" } else { "off" }
            ),
        ));
    }
    if a.skip_first != b.skip_first {
        return Err(bad(
            prior_dir,
            format!(
                "captured with --skip-first {}, and this calibration skips {}: use \
                 --skip-first {} to add to them",
                b.skip_first, a.skip_first, b.skip_first
            ),
        ));
    }
    if a.attention_weight != b.attention_weight {
        return Err(bad(
            prior_dir,
            format!(
                "captured with --attention-weight {}, and this calibration weights by {}: \
                 use --attention-weight {} to add to them",
                b.attention_weight, a.attention_weight, b.attention_weight
            ),
        ));
    }
    for new in &a.sources {
        if let Some(old) = b.sources.iter().find(|old| old.overlaps(new)) {
            return Err(bad(
                prior_dir,
                format!(
                    "already hold fit windows {}..{} of this corpus ({}), which this \
                     calibration reads again: add other windows with --skip-windows {}",
                    old.first_window,
                    old.first_window + old.windows,
                    old.corpus,
                    old.first_window + old.windows
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(name: &str, sha: &str, layers: usize) -> ModelRef {
        ModelRef {
            name: name.into(),
            sha256: sha.into(),
            architecture: "qwen2".into(),
            layers,
            kv_heads: 1,
            head_dim: 2,
            tokenizer_fingerprint: "t".into(),
        }
    }

    fn source(first: usize, windows: usize) -> StatsSource {
        StatsSource {
            corpus: "c.txt".into(),
            fingerprint: "f".into(),
            first_window: first,
            windows,
            seq_len: 64,
            stride: 1,
            chat_share: 0.0,
            observations: (windows * 64) as u64,
        }
    }

    /// Statistics of `rows` observations of 2 source layers (plus `token_layers`) of
    /// width 2 into 2 target layers of width 2, row `r` offset by `base`.
    fn saved(rows: usize, base: f32, token_layers: usize, src: StatsSource) -> SavedStats {
        let ls = 2 + token_layers;
        let mut st =
            DirectionStats::new(Direction::Forward, (ls, 2), (2, 2), false).expect("geometry");
        st.token_layers = token_layers;
        let x: Vec<f32> = (0..rows * ls * 2)
            .map(|i| base + (i as f32 * 0.37).sin())
            .collect();
        let y: Vec<f32> = (0..rows * 4)
            .map(|i| base + (i as f32 * 0.11).cos())
            .collect();
        st.keys.update(&x, &y, rows).expect("update");
        st.values.update(&x, &y, rows).expect("update");
        let meta = StatsMeta {
            format: FORMAT.into(),
            version: VERSION,
            source: model("a", "aa", 2),
            target: model("b", "bb", 2),
            token_layers,
            skip_first: 0,
            attention_weight: 0.0,
            observations: rows as u64,
            sources: vec![src],
        };
        SavedStats { stats: st, meta }
    }

    #[test]
    fn saved_statistics_read_back_equal_and_a_second_save_replaces_the_first() {
        let dir = tempfile::tempdir().unwrap();
        let mapper_dir = crate::mapper::dir::MapperDir::named(dir.path());
        let at = mapper_dir
            .pair(&model("a", "aa", 2), &model("b", "bb", 2))
            .stats();
        let keep = |s: &SavedStats| {
            let mut staging = mapper_dir.stage().unwrap();
            let staged = staging
                .new_root()
                .pair(&model("a", "aa", 2), &model("b", "bb", 2))
                .stats();
            save(s, &staged).unwrap();
            staging.stage(&staged).unwrap();
            staging.commit().unwrap();
        };
        let first = saved(5, 0.0, 0, source(0, 1));
        keep(&first);
        let second = saved(7, 1.0, 0, source(1, 1));
        keep(&second);
        let back = load(
            &at,
            Direction::Forward,
            &model("a", "aa", 2),
            &model("b", "bb", 2),
        )
        .unwrap();
        assert_eq!(back.meta, second.meta);
        assert!(back.stats.keys == second.stats.keys.as_stored());
        assert!(back.stats.values == second.stats.values.as_stored());
        assert_eq!(std::fs::read_dir(at.parent().unwrap()).unwrap().count(), 1);
    }

    #[test]
    fn statistics_of_other_models_or_a_missing_directory_are_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let at = dir.path().join("s");
        let e = load(
            &at,
            Direction::Forward,
            &model("a", "aa", 2),
            &model("b", "bb", 2),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("--no-save-stats"), "{e}");
        save(&saved(5, 0.0, 0, source(0, 1)), &at).unwrap();
        let e = load(
            &at,
            Direction::Forward,
            &model("a", "zz", 2),
            &model("b", "bb", 2),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("same two models"), "{e}");
    }

    #[test]
    fn merging_adds_the_observations_and_keeps_every_source() {
        let mut into = saved(5, 0.0, 0, source(4, 2));
        let prior = saved(7, 1.0, 0, source(0, 4));
        let mut expected = into.stats.keys.clone();
        expected.merge(&prior.stats.keys).unwrap();
        merge_into(&mut into, &prior, Path::new("p")).unwrap();
        assert_eq!(into.meta.observations, 12);
        assert!(into.stats.keys == expected);
        assert_eq!(into.meta.sources, vec![source(0, 4), source(4, 2)]);
        assert_eq!(into.meta.windows(), 6);
    }

    #[test]
    fn windows_already_counted_or_another_token_block_are_refused() {
        let mut into = saved(5, 0.0, 0, source(2, 4));
        let prior = saved(7, 1.0, 0, source(0, 4));
        let e = merge_into(&mut into, &prior, Path::new("p"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--skip-windows 4"), "{e}");
        // The refused merge left the fresh statistics as they were.
        assert_eq!(into.stats.keys.count(), 5);

        let mut into = saved(5, 0.0, 1, source(8, 1));
        let e = merge_into(&mut into, &prior, Path::new("p"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("--token-features off"), "{e}");
    }

    #[test]
    fn the_summary_says_how_much_the_statistics_hold_and_where_from() {
        let mut into = saved(5, 0.0, 0, source(4, 2));
        merge_into(&mut into, &saved(7, 1.0, 0, source(0, 4)), Path::new("p")).unwrap();
        assert_eq!(
            into.meta.summary(),
            "saved statistics: 6 windows, 12 observations (c.txt windows 0..4 of 64 tokens; \
             c.txt windows 4..6 of 64 tokens)"
        );
    }

    #[test]
    fn windows_of_another_corpus_or_shape_never_overlap() {
        let a = source(0, 4);
        let mut b = source(0, 4);
        assert!(a.overlaps(&b));
        b.fingerprint = "other".into();
        assert!(!a.overlaps(&b));
        let mut c = source(0, 4);
        c.seq_len = 128;
        assert!(!a.overlaps(&c));
        assert!(!a.overlaps(&source(4, 4)));
        assert!(a.overlaps(&source(3, 1)));
    }
}
