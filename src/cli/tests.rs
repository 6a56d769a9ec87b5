use super::calibrate::CalibrateArgs;
use super::common::{DeviceArg, DirectionArg};
use super::*;
use baton::calibrate::RankChoice;

fn parse(args: &[&str]) -> std::result::Result<Cli, clap::Error> {
    Cli::try_parse_from([&["baton"], args].concat())
}

fn calibrate(args: &[&str]) -> CalibrateArgs {
    match parse(&[&["calibrate"], args].concat()).unwrap().command {
        Some(Command::Calibrate(a)) => a,
        other => panic!("not calibrate: {other:?}"),
    }
}

/// Why `baton calibrate ARGS` is refused.
fn calibrate_error(args: &[&str]) -> String {
    parse(&[&["calibrate"], args].concat())
        .map(|_| ())
        .unwrap_err()
        .to_string()
}

#[test]
fn calibrate_flags_become_options_with_all_as_every_layer() {
    let o = calibrate(&["--k", "1", "--k", "all", "--max-k", "all", "--rank", "auto"]).options();
    assert_eq!(o.k_sweep, vec![1, usize::MAX]);
    assert_eq!(o.max_k, usize::MAX);
    assert_eq!(o.rank, Some(RankChoice::Auto));
    let o = calibrate(&["--reference", "--max-k", "4", "--rank", "16"]).options();
    assert_eq!((o.sequences, o.seq_len, o.max_k), (500, 1024, 4));
    assert_eq!(o.rank, Some(RankChoice::Fixed(16)));
}

#[test]
fn each_train_hidden_is_a_width_to_try_and_commas_make_layers() {
    let o = calibrate(&[
        "--mapper",
        "residual",
        "--train-hidden",
        "128",
        "--train-hidden",
        "512,512",
    ])
    .options();
    assert_eq!(o.train.hidden, vec![vec![128], vec![512, 512]]);
    assert!(calibrate(&[]).options().train.hidden.is_empty());
    let e = calibrate_error(&["--train-hidden", "256,x"]);
    assert!(e.contains("`x` is not a width"), "{e}");
}

#[test]
fn counts_of_zero_and_impossible_sampling_are_refused_when_parsing() {
    for args in [
        &["generate", "-p", "x", "--max-tokens", "0"][..],
        &["generate", "-p", "x", "--temperature", "NaN"],
        &["generate", "-p", "x", "--temperature=-1"],
        &["generate", "-p", "x", "--top-p", "0"],
        &["bench", "--repeats", "0"],
        &["bench", "--suffix", "0"],
        &["eval", "--prefix", "0"],
        &["eval", "--continuation", "0"],
        &["bench-model", "--repeats", "0"],
    ] {
        let e = parse(args).map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("invalid value"), "{args:?}: {e}");
    }
    assert!(parse(&["generate", "-p", "x", "--temperature", "0.7"]).is_ok());
}

#[test]
fn an_anchor_past_the_prefix_and_a_suffix_past_a_length_are_refused() {
    let eval = |args: &[&str]| match parse(&[&["eval"], args].concat()).unwrap().command {
        Some(Command::Eval(a)) => a.validate(),
        _ => unreachable!(),
    };
    let e = eval(&["--anchor", "500"]).unwrap_err().to_string();
    assert!(e.contains("--anchor 500") && e.contains("384"), "{e}");
    assert!(eval(&["--anchor", "1"]).is_ok());
    let bench = |args: &[&str]| match parse(&[&["bench"], args].concat()).unwrap().command {
        Some(Command::Bench(a)) => a.validate(),
        _ => unreachable!(),
    };
    let e = bench(&["--lengths", "128", "--suffix", "1000"])
        .unwrap_err()
        .to_string();
    assert!(e.contains("--suffix 1000") && e.contains("128"), "{e}");
    assert!(bench(&[]).is_ok());
}

#[test]
fn directions_put_the_source_first() {
    assert_eq!(DirectionArg::Both.pairs(&1, &2), vec![(&1, &2), (&2, &1)]);
    assert_eq!(DirectionArg::TargetToSource.pairs(&1, &2), vec![(&2, &1)]);
}

#[test]
fn an_unknown_device_says_which_ones_exist() {
    let d = |s: &str| {
        s.parse::<DeviceArg>()
            .map_err(anyhow::Error::msg)
            .and_then(DeviceArg::open)
    };
    assert!(d("cpu").unwrap().is_cpu());
    let e = d("tpu").unwrap_err().to_string();
    assert!(e.contains("cpu, cuda or cuda:N"), "{e}");
    let e = d("cuda:x").unwrap_err().to_string();
    assert!(e.contains("`x` is not a device number"), "{e}");
    // The same when clap parses the flag, which names it.
    let e = parse(&["--device", "tpu", "mappers"])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("--device") && e.contains("cpu, cuda or cuda:N"),
        "{e}"
    );
    assert_eq!(
        parse(&["mappers", "--device", "cuda:1"]).unwrap().device,
        DeviceArg::Cuda(1)
    );
}

#[test]
fn a_bad_count_names_its_flag() {
    let o = calibrate(&["--key-gain", "matched", "--value-gain", "1.5"]).options();
    assert!(o.key_gain_matched && !o.value_gain_matched);
    assert_eq!(o.value_gain, 1.5);
    let o = calibrate(&[]).options();
    assert_eq!(
        o.key_gain_matched,
        baton::calibrate::DEFAULT_KEY_GAIN_MATCHED
    );
    assert!(!o.value_gain_matched);
    let e = calibrate_error(&["--key-gain", "sharp"]);
    assert!(e.contains("`matched`"), "{e}");
    let e = calibrate_error(&["--k", "two"]);
    assert!(e.contains("--k") && e.contains("`two`"), "{e}");
    let e = calibrate_error(&["--rank", "x"]);
    assert!(e.contains("--rank"), "{e}");
}

#[test]
fn the_settings_flags_are_the_same_for_the_workbench_and_run() {
    use baton::engine::{Settings, SettingsOverrides};
    let flags = [
        "--max-tokens",
        "12",
        "--gate",
        "0.9",
        "--premap",
        "--no-reference",
        "--tail",
        "32",
        "--no-learn",
        "--repair",
        "--reread",
        "0.1:round-trip:sentence",
        "--system",
        "be brief",
    ];
    let want = SettingsOverrides {
        max_tokens: Some(12),
        gate: Some(0.9),
        premap: Some(true),
        reference: Some(false),
        tail: Some(32),
        learn: Some(false),
        repair: Some(true),
        reread: Some("0.1:round-trip:sentence".parse().unwrap()),
        system: Some("be brief".into()),
    };
    let workbench = match parse(&[&["workbench"], &flags[..]].concat())
        .unwrap()
        .command
    {
        Some(Command::Workbench(a)) => SettingsOverrides::from(a.conversation.settings),
        other => panic!("not workbench: {other:?}"),
    };
    let run = match parse(&[&["run", "--script", "s.toml"], &flags[..]].concat())
        .unwrap()
        .command
    {
        Some(Command::Run(a)) => SettingsOverrides::from(a.conversation.settings),
        other => panic!("not run: {other:?}"),
    };
    assert_eq!(workbench, want);
    assert_eq!(run, want);
    // Nothing given: nothing overridden, and the defaults are the settings' own.
    let none = workbench::WorkbenchArgs::defaults().conversation;
    assert_eq!(
        SettingsOverrides::from(&none.settings),
        SettingsOverrides::default()
    );
    let cfg = none.engine_config(&baton::model::Placement::on(candle_core::Device::Cpu), None);
    assert_eq!(cfg.settings, Settings::default());
    assert!(cfg.settings.learn && cfg.learning.keep);
    let e = parse(&["workbench", "--max-tokens", "0"])
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(e.contains("--max-tokens"), "{e}");
}

#[test]
fn the_command_line_goes_over_the_script_and_the_script_over_the_defaults() {
    use baton::engine::SettingsOverrides;
    let a = match parse(&["run", "--script", "s.toml", "--tail", "8"])
        .unwrap()
        .command
    {
        Some(Command::Run(a)) => a,
        other => panic!("not run: {other:?}"),
    };
    let script = SettingsOverrides {
        tail: Some(64),
        max_tokens: Some(48),
        learn: Some(false),
        ..Default::default()
    };
    let cfg = a.conversation.engine_config(
        &baton::model::Placement::on(candle_core::Device::Cpu),
        Some(&script),
    );
    assert_eq!(cfg.settings.tail, 8);
    assert_eq!(cfg.settings.max_tokens, 48);
    assert!(!cfg.settings.learn);
    assert!(cfg.settings.reference);
}

/// The command line as `baton` reads it, at a terminal's width.
fn shaped(width: usize) -> clap::Command {
    use clap::CommandFactory;
    let mut c = help::shape(Cli::command()).term_width(width);
    c.build();
    c
}

/// Every command's path under `baton`, the root included.
fn commands(c: &clap::Command) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new()];
    for s in c.get_subcommands().filter(|s| s.get_name() != "help") {
        for mut p in commands(s) {
            p.insert(0, s.get_name().to_string());
            out.push(p);
        }
    }
    out
}

fn find<'a>(c: &'a mut clap::Command, path: &[String]) -> &'a mut clap::Command {
    match path {
        [] => c,
        [first, rest @ ..] => find(c.find_subcommand_mut(first).unwrap(), rest),
    }
}

#[test]
fn every_short_help_fits_22_rows_of_80_columns() {
    let mut root = shaped(80);
    for path in commands(&root.clone()) {
        let help = find(&mut root, &path).render_help().to_string();
        let lines: Vec<&str> = help.trim_end().lines().collect();
        assert!(
            lines.len() <= 22,
            "baton {} -h is {} lines:\n{help}",
            path.join(" "),
            lines.len()
        );
        let wide = lines.iter().find(|l| l.chars().count() > 80);
        assert!(wide.is_none(), "baton {} -h: {wide:?}", path.join(" "));
    }
}

#[test]
fn every_flag_has_a_heading_and_long_help_keeps_the_paragraph() {
    let mut root = shaped(100);
    for path in commands(&root.clone()) {
        let c = find(&mut root, &path);
        for a in c.get_arguments() {
            let id = a.get_id().as_str();
            if a.is_hide_set() || matches!(id, "help" | "version") {
                continue;
            }
            assert!(
                a.get_help_heading().is_some(),
                "baton {} --{id} has no heading",
                path.join(" ")
            );
        }
    }
    // -h gives the line, --help the whole paragraph.
    let c = find(&mut root, &["calibrate".to_string()]);
    let (short, long) = (
        c.render_help().to_string(),
        c.render_long_help().to_string(),
    );
    assert!(short.contains("windows to fit on"), "{short}");
    assert!(long.contains("sized for a 2-core CPU"), "{long}");
    assert!(!short.contains("--train-lr") && long.contains("--train-lr"));
    assert!(long.contains("What to fit:") && long.contains("Output:"));
}

#[test]
fn baton_h_lists_every_command_once_grouped_by_use() {
    let root = shaped(80);
    let mut names: Vec<&str> = root
        .get_subcommands()
        .map(|s| s.get_name())
        .filter(|n| *n != "help")
        .collect();
    let mut listed = help::listed();
    names.sort_unstable();
    listed.sort_unstable();
    assert_eq!(listed, names);
    let top = root.clone().render_help().to_string();
    for group in ["The workbench and its demo:", "Measurement:"] {
        assert!(top.contains(group), "{top}");
    }
}

#[test]
fn short_forms_and_environment_variables_set_the_common_flags() {
    let m = shaped(80)
        .try_get_matches_from(["baton", "calibrate", "-s", "a", "-t", "b", "-N", "3", "-j"])
        .unwrap();
    let c = Cli::from_arg_matches(&m).unwrap();
    let Some(Command::Calibrate(a)) = c.command else {
        panic!("not calibrate")
    };
    assert_eq!((a.pair.source.as_str(), a.pair.target.as_str()), ("a", "b"));
    assert_eq!((a.sequences, a.json), (3, true));
    // The mapper directory once, for every command after it.
    let dir = std::env::temp_dir().join("baton-env-mapper-dir");
    std::env::set_var("BATON_MAPPER_DIR", &dir);
    let m = shaped(80).try_get_matches_from(["baton", "bench"]);
    std::env::remove_var("BATON_MAPPER_DIR");
    let c = Cli::from_arg_matches(&m.unwrap()).unwrap();
    let Some(Command::Bench(b)) = c.command else {
        panic!("not bench")
    };
    assert_eq!(b.pair.mapper_dir().as_named(), Some(dir.as_path()));
}
