//! `baton gate-study`: switches over varied text measured beside the gate's estimates,
//! and the line the gate predicts the attention cosine with.

use super::common::{at_least_one, print_json, PairArgs};
use anyhow::Result;
use baton::gate::fit;
use baton::lab::eval::gate_study::{self, GateStudy, StudySwitch};
use baton::model::Placement;
use clap::Args;

#[derive(Debug, Args)]
pub struct GateStudyArgs {
    #[command(flatten)]
    pub pair: PairArgs,
    /// Switches to measure (at least 50 for a line worth keeping).
    #[arg(long, default_value_t = 60, value_parser = at_least_one)]
    pub switches: usize,
    /// Draw the estimates against the measured cosine (.svg or .png).
    #[arg(long)]
    pub plot: Option<std::path::PathBuf>,
    /// Do not keep the fitted line beside the artifact.
    #[arg(long)]
    pub no_save: bool,
    #[arg(long)]
    pub json: bool,
}

pub fn gate_study(a: GateStudyArgs, on: &Placement) -> Result<()> {
    use baton::data::corpus;
    let (src, tgt) = a.pair.open(on)?;
    let dir = a.pair.mapper_dir();
    let (art, forward) = dir.open_for(&src, &tgt)?;
    let measured_on = fit::FitMapper::of(&art)?;
    let (back_art, reverse) = dir.open_for(&tgt, &src)?;
    let mapped_back_with = fit::FitMapper::of(&back_art)?;
    let docs = corpus::read_documents(&corpus::default_files()?)?;
    let windows = gate_study::study_windows(&tgt, &docs, a.switches)?;
    eprintln!(
        "{} switches over {} kinds of text",
        windows.len(),
        docs.len() + 1
    );
    let anchor = baton::mapper::DEFAULT_ANCHOR;
    let mut study = gate_study::study(
        &src,
        &tgt,
        &forward,
        &reverse,
        &windows,
        anchor,
        &mut print_switch,
    )?;
    if let Some(f) = &mut study.fit {
        f.mapper = Some(measured_on);
        if f.reads_the_reverse() {
            f.reverse_mapper = Some(mapped_back_with);
        }
    }
    print_study(&study);
    match &study.fit {
        Some(f) => {
            eprintln!("the gate keeps the line from {}", f.estimator);
            if !a.no_save {
                let path = fit::save(&dir, f)?;
                eprintln!("kept in {}", path.display());
            }
        }
        None => eprintln!("no gate line: too few switches to fit one"),
    }
    if let Some(p) = &a.plot {
        baton::lab::plot::gate::write_gate_plot(&study, p)?;
        eprintln!("plot written to {}", p.display());
    }
    if a.json {
        print_json(&study)?;
    }
    Ok(())
}

fn print_switch(i: usize, s: &StudySwitch) {
    eprintln!(
        "{:>3} {:<24} {:>4} tokens  distance {}  round trip {}  cosine {:.3}  agreement {:.3}",
        i + 1,
        s.text,
        s.tokens,
        s.feature_distance.map_or("-".into(), |d| format!("{d:.3}")),
        s.round_trip.map_or("-".into(), |d| format!("{d:.3}")),
        s.cosine,
        s.agreement
    )
}

/// The correlations and the fitted lines.
fn print_study(study: &GateStudy) {
    let show = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:+.3}"));
    for c in &study.correlations {
        eprintln!(
            "{}: with the attention cosine Pearson {} Spearman {}; with next-token agreement Pearson {} Spearman {}",
            c.estimator,
            show(c.pearson_cosine),
            show(c.spearman_cosine),
            show(c.pearson_agreement),
            show(c.spearman_agreement)
        );
    }
    for f in &study.lines {
        eprintln!(
            "line from {}: cosine ≈ {:.4} {:+.4} × estimate (fitted on {}, checked on {}: r {:.3}, mean absolute error {:.3})",
            f.estimator, f.intercept, f.slope, f.fitted_on, f.checked_on, f.held_out_r, f.held_out_mae
        );
    }
}
