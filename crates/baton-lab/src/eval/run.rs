//! `baton eval` as a library call: every asked direction through held-out text and the
//! asked tasks, gathered into one [`EvalReport`]. The binary only parses and prints.

use super::eval_json::{recall_line, task_line, text_line, DirectionEval, EvalReport};
use super::recall::{eval_recall_variants, HandoffVariant, RecallOptions};
use super::reread::RereadModels;
use super::tasks::{eval_task_with, TaskEvalOptions};
use super::text::{eval_text_with, TextEvalOptions};
use super::EvalError;
use baton_data::recall::RecallConversation;
use baton_data::tasks::{TaskDef, TaskItem};
use baton_method::handoff::reread::RereadSetting;
use baton_method::mapper::{artifact, MapPrecision};
use baton_runtime::model::Model;

/// What to evaluate, the same for every direction.
pub struct EvalPlan<'a> {
    /// Token windows of `text.prefix + text.continuation`; empty for none.
    pub windows: &'a [Vec<u32>],
    pub text: TextEvalOptions,
    pub tasks: &'a [(&'static TaskDef, Vec<TaskItem>)],
    pub task_options: TaskEvalOptions,
    /// The multi-turn recall suite's conversations; empty for none.
    pub conversations: &'a [RecallConversation],
    pub recall: RecallOptions,
    /// Other handoffs the recall suite runs in the same turns as `recall`'s own.
    pub handoffs: &'a [HandoffVariant],
    /// Where the mappers are (the cache's mappers/ when `None`).
    pub mapper_dir: &'a baton_method::mapper::dir::MapperDir,
    pub precision: MapPrecision,
    /// Gains around the mean prediction for the mapped keys and values (1 for none; see
    /// [`baton_method::mapper::gain`]).
    pub gains: Gains,
    /// The recall suite's mapper learns from each conversation after answering it,
    /// starting from its calibration (see [`baton_method::learn`]); nothing learned is kept.
    pub learn: bool,
    /// Measure the mapper with what it learned and kept (as the workbench starts it).
    pub learned: bool,
}

/// Gains for the mapped keys and values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Gains {
    pub key: f32,
    pub value: f32,
}

impl Default for Gains {
    fn default() -> Self {
        Self {
            key: 1.0,
            value: 1.0,
        }
    }
}

/// Where an evaluation reports as it goes.
pub trait EvalProgress {
    /// A line about what is happening (always for people, never part of the results).
    fn status(&self, line: &str);
    /// A result line for people.
    fn result(&self, line: &str);
    /// A task of `items` items starts; `label` names it.
    fn task_started(&self, label: &str, items: usize);
    fn task_advanced(&self, done: usize);
    fn task_finished(&self);
}

/// Evaluates each (source, target) direction in turn with its stored mapper.
pub fn evaluate(
    directions: &[(&Model, &Model)],
    plan: &EvalPlan<'_>,
    progress: &dyn EvalProgress,
) -> Result<EvalReport, EvalError> {
    let mut results = Vec::new();
    for &(s, t) in directions {
        results.push(evaluate_direction(s, t, plan, progress)?);
    }
    Ok(EvalReport::new(results))
}

/// Folds `gains` into the artifact's maps, before they become tensors.
fn apply_gains(
    art: &mut artifact::MapperArtifact,
    s: &Model,
    gains: Gains,
) -> Result<(), EvalError> {
    use baton_method::mapper::gain::{apply_gain, Half};
    let scales = art.source_scales.as_ref().ok_or_else(|| {
        EvalError::Input(format!(
            "{} has no source feature means (made before the int8 map): calibrate again to use a gain",
            art.path.display()
        ))
    })?;
    let width = s.config().kv_width();
    apply_gain(&mut art.keys, Half::Keys, scales, width, gains.key)?;
    apply_gain(&mut art.values, Half::Values, scales, width, gains.value)?;
    Ok(())
}

/// A learner from the artifact's calibration (with what it learned and kept, when
/// `learned`), judged on the default corpus's held-out text.
fn open_learner(
    s: &Model,
    t: &Model,
    art: &artifact::MapperArtifact,
    mapper: &baton_method::mapper::CacheMapper,
    plan: &EvalPlan<'_>,
    learned: bool,
) -> Result<baton_method::learn::Learner, EvalError> {
    if plan.gains != Gains::default() {
        return Err(EvalError::Input(
            "--learn solves the maps again with the gains they were calibrated with: leave out --key-gain and --value-gain"
                .into(),
        ));
    }
    let docs = baton_data::corpus::read_documents(&baton_data::corpus::default_files()?)?;
    let anchor = plan.recall.anchor;
    let slices = baton_method::learn::calibration_slices(s, t, &docs, anchor)?;
    let opened = baton_method::learn::open(
        s,
        t,
        art,
        mapper.clone(),
        plan.mapper_dir,
        learned,
        slices,
        anchor,
    )?;
    Ok(opened.learner)
}

/// The residual maps the `upper=` handoffs of `ways` need: kept in `mapper_dir`, or
/// fitted on the default calibration corpus and kept there (see
/// [`baton_method::calibrate::residual::kept_or_fitted`]).
fn residual_maps(
    s: &Model,
    t: &Model,
    mapper_dir: &baton_method::mapper::dir::MapperDir,
    ways: &[HandoffVariant],
    direction: &str,
    progress: &dyn EvalProgress,
) -> Result<Vec<baton_method::mapper::residual::ResidualMap>, EvalError> {
    let mut layers = Vec::new();
    for w in ways {
        if let Some(split) = w.layers {
            split.check(t.config().n_layer).map_err(EvalError::Input)?;
            if let super::recall::LayerSplit::Upper(m) = split {
                if !layers.contains(&m) {
                    layers.push(m);
                }
            }
        }
    }
    if layers.is_empty() {
        return Ok(Vec::new());
    }
    let opts = baton_method::calibrate::residual::ResidualFit::default();
    let maps = baton_method::calibrate::residual::kept_or_fitted(
        s,
        t,
        Some(mapper_dir),
        &layers,
        &opts,
        &mut |message| progress.status(&format!("{direction}: {message}")),
    )
    .map_err(|e| EvalError::Input(format!("the residual map: {e}")))?;
    for m in &maps {
        progress.status(&format!(
            "{direction}: residual map from source layer {} to target layer {}: R² {:.3} on {} positions",
            m.source_layer, m.target_layer, m.r2, m.observations
        ));
    }
    Ok(maps)
}

fn evaluate_direction(
    s: &Model,
    t: &Model,
    plan: &EvalPlan<'_>,
    progress: &dyn EvalProgress,
) -> Result<DirectionEval, EvalError> {
    let mut art = plan.mapper_dir.find_for(s, t)?;
    if plan.gains != Gains::default() {
        apply_gains(&mut art, s, plan.gains)?;
    }
    let mapper = art.cache_mapper(s, t)?.with_precision(plan.precision)?;
    let direction = format!("{} -> {}", s.identity.name, t.identity.name);
    let mapper = if plan.learned {
        let learner = open_learner(s, t, &art, &mapper, plan, true)?;
        progress.status(&format!(
            "{direction}: with {} positions learned",
            learner.learned_tokens()
        ));
        learner.mapper().clone()
    } else {
        mapper
    };
    progress.status(&format!(
        "{direction}: the map runs in {:?}",
        mapper.precision()
    ));
    let mut ways = vec![HandoffVariant::of(&plan.recall)];
    ways.extend_from_slice(plan.handoffs);
    let settings = ways
        .iter()
        .filter(|_| !plan.conversations.is_empty())
        .filter_map(|w| w.reread)
        .chain(plan.text.reread.filter(|_| !plan.windows.is_empty()))
        .chain(plan.task_options.reread.filter(|_| !plan.tasks.is_empty()));
    let reverse = reverse_mapper(s, t, settings, plan)?;
    let models = RereadModels {
        source: s,
        target: t,
        mapper: &mapper,
        reverse: reverse.as_ref(),
    };
    let text = if plan.windows.is_empty() {
        None
    } else {
        progress.status(&format!(
            "evaluating {direction} on {} windows ({} + {} tokens)",
            plan.windows.len(),
            plan.text.prefix,
            plan.text.continuation
        ));
        let r = eval_text_with(models, plan.windows, &plan.text)?;
        progress.result(&text_line(&direction, art.meta.k, &r));
        Some(r)
    };
    let mut tasks = Vec::new();
    for (def, items) in plan.tasks {
        let towards = if s.config().n_layer < t.config().n_layer {
            "(to larger)"
        } else {
            "(to smaller)"
        };
        progress.task_started(&format!("{} {towards}", def.name), items.len());
        let r = eval_task_with(models, def, items, &plan.task_options, &mut |n| {
            progress.task_advanced(n)
        });
        progress.task_finished();
        let r = r?;
        progress.result(&task_line(&direction, &r));
        tasks.push(r);
    }
    let mut handoffs = Vec::new();
    let conversations = if plan.conversations.is_empty() {
        None
    } else {
        let mut learner = if plan.learn {
            progress.status(&format!(
                "{direction}: reading the calibration's statistics to learn from the conversations"
            ));
            Some(open_learner(s, t, &art, &mapper, plan, plan.learned)?)
        } else {
            None
        };
        let residual = residual_maps(s, t, plan.mapper_dir, &ways, &direction, progress)?;
        let turns = plan.conversations.iter().map(|c| c.questions.len()).sum();
        progress.task_started("recall (turns)", turns);
        let r = eval_recall_variants(
            s,
            t,
            (&mapper, reverse.as_ref(), &residual),
            plan.conversations,
            &plan.recall,
            &ways,
            learner.as_mut(),
            &mut |n| progress.task_advanced(n),
        );
        progress.task_finished();
        let mut r = r?.into_iter();
        let first = r.next();
        for x in first.iter().chain(r.as_slice()) {
            progress.result(&recall_line(&direction, x));
        }
        handoffs = r.collect();
        first
    };
    Ok(DirectionEval {
        direction,
        mapper: art.path.clone(),
        k: art.meta.k,
        precision: mapper.precision(),
        anchor: plan.text.anchor,
        tail: plan.task_options.tail,
        key_gain: plan.gains.key,
        value_gain: plan.gains.value,
        text,
        tasks,
        conversations,
        handoffs,
    })
}

/// The mapper of the other direction, when a plan of any evaluation ranks or trusts by the
/// round trip.
fn reverse_mapper(
    s: &Model,
    t: &Model,
    mut settings: impl Iterator<Item = RereadSetting>,
    plan: &EvalPlan<'_>,
) -> Result<Option<baton_method::mapper::CacheMapper>, EvalError> {
    use baton_method::handoff::reread::{PlanKind, Selector};
    let wanted = settings.any(|r| r.selector == Selector::RoundTrip || r.kind == PlanKind::Trusted);
    if !wanted {
        return Ok(None);
    }
    let art = plan.mapper_dir.find_for(t, s)?;
    Ok(Some(
        art.cache_mapper(t, s)?.with_precision(plan.precision)?,
    ))
}

/// The command line's bars, for an evaluation.
impl EvalProgress for baton_console::PhaseBars {
    fn status(&self, line: &str) {
        self.note(line);
    }
    fn result(&self, line: &str) {
        baton_console::PhaseBars::result(self, line);
    }
    fn task_started(&self, label: &str, items: usize) {
        self.phase(label, items as u64);
    }
    fn task_advanced(&self, done: usize) {
        self.set_position(done as u64);
    }
    fn task_finished(&self) {
        self.finish(true);
    }
}
