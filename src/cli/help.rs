//! How the command line reads. The flags are declared beside the code that uses them;
//! this module lays them out for a person: which heading each falls under, the short
//! forms (one letter means one flag in every command), what `-h` shows in one line
//! each (`--help` shows every flag with its paragraph), and `baton -h`'s commands
//! grouped by use. Tests hold every `-h` to 22 rows of 80 columns: one 80×24 screen
//! with the prompt that follows, its first line still in view.

use clap::{Arg, ArgAction, Command};

const PAIR: &str = "Pair and mapper";
const FIT: &str = "What to fit";
const MEASURE: &str = "What to measure";
const HANDOFF: &str = "The handoff";
const OUTPUT: &str = "Output";

/// Short forms. Given to a flag wherever a command has it.
const SHORT: &[(&str, char)] = &[
    ("device", 'd'),
    ("source", 's'),
    ("target", 't'),
    ("mapper_dir", 'M'),
    ("json", 'j'),
    ("record", 'r'),
    ("reread", 'p'),
    ("max_tokens", 'n'),
    ("corpus", 'c'),
    ("sequences", 'N'),
    ("k", 'k'),
    ("direction", 'D'),
    ("script", 'f'),
    ("out", 'o'),
    ("plot", 'P'),
];

/// Shorter value names than the field names clap takes by default, so that a flag and
/// its line fit beside each other on 80 columns.
const VALUE: &[(&str, &str)] = &[
    ("source", "MODEL"),
    ("target", "MODEL"),
    ("model", "MODEL"),
    ("mapper_dir", "DIR"),
    ("merge_stats", "DIR"),
    ("device", "DEV"),
    ("corpus", "PATH"),
    ("sequences", "N"),
    ("seq_len", "N"),
    ("select_sequences", "N"),
    ("max_tokens", "N"),
    ("record", "FILE"),
    ("script", "FILE"),
    ("plot", "FILE"),
    ("reread", "PLAN"),
    ("out", "DIR"),
    ("study", "FILE"),
    ("session", "FILE"),
    ("conversations", "N"),
    ("skip_conversations", "N"),
    ("texts", "PATH"),
    ("tasks", "TASKS"),
    ("lengths", "N,..."),
    ("switches", "N"),
    ("prompt_len", "N"),
    ("decode_len", "N"),
    ("repeats", "N"),
];

/// Each command's headings (the flags under each) and the flags its `-h` shows, with
/// their one line. A flag left out of `brief` is in `--help` only.
struct Layout {
    path: &'static [&'static str],
    groups: &'static [(&'static str, &'static [&'static str])],
    brief: &'static [(&'static str, &'static str)],
}

const CONVERSATION: &[(&str, &[&str])] = &[
    (PAIR, &["source", "target", "mapper_dir", "device"]),
    (
        HANDOFF,
        &[
            "reread",
            "gate",
            "premap",
            "tail",
            "learn",
            "no_keep_learned",
            "repair",
            "reference",
        ],
    ),
    ("The conversation", &["script", "system", "max_tokens"]),
    (OUTPUT, &["record", "no_record"]),
    (FIT, &["no_background_calibration"]),
];

const CONVERSATION_BRIEF: &[(&str, &str)] = &[
    ("source", "first model"),
    ("target", "model handed to"),
    ("mapper_dir", "mappers directory"),
    ("reread", "handoff plan, e.g. up:40%:facts:word"),
    ("reference", "no re-prefill to compare with"),
    ("record", "session file to record to"),
    ("script", "conversation script (TOML)"),
];

const LAYOUTS: &[Layout] = &[
    Layout {
        path: &["fetch"],
        groups: &[
            (PAIR, &["names", "pair", "all", "device"]),
            (OUTPUT, &["verify"]),
        ],
        brief: &[
            ("names", "what to fetch"),
            ("pair", "the default pair's models and data"),
        ],
    },
    Layout {
        path: &["info"],
        groups: &[(PAIR, &["model", "device"]), (OUTPUT, &["json"])],
        brief: &[("model", "model name, path or hub reference")],
    },
    Layout {
        path: &["generate"],
        groups: &[
            (PAIR, &["model", "device"]),
            (
                "Generation",
                &[
                    "prompt",
                    "chat",
                    "max_tokens",
                    "temperature",
                    "top_p",
                    "seed",
                ],
            ),
            (OUTPUT, &["logits_out"]),
        ],
        brief: &[
            ("model", "model name, path or hub reference"),
            ("prompt", "text to continue"),
            ("chat", "wrap the prompt in the chat template"),
            ("max_tokens", "tokens to generate"),
        ],
    },
    Layout {
        path: &["bench-model"],
        groups: &[
            (PAIR, &["model", "device"]),
            (MEASURE, &["prompt_len", "decode_len", "repeats"]),
            (OUTPUT, &["json"]),
        ],
        brief: &[
            ("model", "model name, path or hub reference"),
            ("prompt_len", "prompt tokens to prefill"),
            ("decode_len", "tokens to decode"),
        ],
    },
    Layout {
        path: &["calibrate"],
        groups: &[
            (
                PAIR,
                &["source", "target", "mapper_dir", "direction", "device"],
            ),
            (
                FIT,
                &[
                    "corpus",
                    "sequences",
                    "seq_len",
                    "reference",
                    "stride",
                    "skip_first",
                    "k",
                    "lambda",
                    "max_k",
                    "chat_share",
                    "token_features",
                    "key_gain",
                    "value_gain",
                    "no_standardize",
                    "rank",
                    "merge_stats",
                    "attention_weight",
                    "skip_windows",
                    "mapper",
                    "train_loss",
                    "train_windows",
                    "train_epochs",
                    "train_seed",
                    "train_hidden",
                    "train_lr",
                ],
            ),
            (MEASURE, &["select_sequences", "select_by", "k_tolerance"]),
            (
                OUTPUT,
                &["no_save_stats", "accept_poor", "save_stats", "json"],
            ),
        ],
        brief: &[
            ("source", "first model"),
            ("target", "second model"),
            ("mapper_dir", "where the mappers go"),
            ("corpus", "calibration text (files or folders)"),
            ("sequences", "windows to fit on"),
            ("k", "source layers per target layer to try"),
            ("merge_stats", "add statistics an earlier run saved"),
            ("accept_poor", "keep a map worse than no context"),
        ],
    },
    Layout {
        path: &["mappers"],
        groups: &[
            (PAIR, &["mapper_dir", "device"]),
            (OUTPUT, &["reset_learned", "json"]),
        ],
        brief: &[
            ("mapper_dir", "mappers directory"),
            ("reset_learned", "forget what the mappers learned"),
        ],
    },
    Layout {
        path: &["eval"],
        groups: &[
            (
                PAIR,
                &["source", "target", "mapper_dir", "direction", "device"],
            ),
            (
                MEASURE,
                &[
                    "texts",
                    "limit",
                    "prefix",
                    "continuation",
                    "tasks",
                    "target_reads_question",
                    "task_limit",
                    "conversations",
                    "skip_conversations",
                    "precision",
                ],
            ),
            (
                HANDOFF,
                &[
                    "anchor",
                    "tail",
                    "key_gain",
                    "value_gain",
                    "learn",
                    "learned",
                    "oracle",
                    "reread",
                    "handoffs",
                ],
            ),
            (OUTPUT, &["no_text", "json"]),
        ],
        brief: &[
            ("source", "first model"),
            ("target", "model handed to"),
            ("mapper_dir", "mappers directory"),
            ("texts", "held-out texts to measure on"),
            ("tasks", "answer tasks, e.g. gsm8k:100"),
            ("conversations", "recall-suite conversations"),
            ("reread", "handoff plan to measure"),
            ("handoffs", "handoffs to compare"),
        ],
    },
    Layout {
        path: &["report"],
        groups: &[(OUTPUT, &["session", "json", "plot", "device"])],
        brief: &[
            ("session", "session file (.jsonl)"),
            ("plot", "also plot the drift (.svg, .png)"),
        ],
    },
    Layout {
        path: &["run"],
        groups: CONVERSATION,
        brief: CONVERSATION_BRIEF,
    },
    Layout {
        path: &["replay"],
        groups: &[
            (PAIR, &["mapper_dir", "device"]),
            (OUTPUT, &["session", "record", "json"]),
        ],
        brief: &[
            ("session", "session file to replay"),
            ("record", "record the replay to this file"),
        ],
    },
    Layout {
        path: &["workbench"],
        groups: CONVERSATION,
        brief: CONVERSATION_BRIEF,
    },
    Layout {
        path: &["demo"],
        groups: CONVERSATION,
        brief: CONVERSATION_BRIEF,
    },
    Layout {
        path: &["bench"],
        groups: &[
            (
                PAIR,
                &["source", "target", "mapper_dir", "direction", "device"],
            ),
            (
                MEASURE,
                &["lengths", "repeats", "suffix", "reread", "precision"],
            ),
            (OUTPUT, &["plot", "json"]),
        ],
        brief: &[
            ("source", "first model"),
            ("target", "model handed to"),
            ("lengths", "context lengths to time"),
            ("reread", "handoff plan to time beside the map"),
        ],
    },
    Layout {
        path: &["gate-study"],
        groups: &[
            (PAIR, &["source", "target", "mapper_dir", "device"]),
            (MEASURE, &["switches"]),
            (OUTPUT, &["plot", "no_save", "json"]),
        ],
        brief: &[
            ("switches", "switches to measure"),
            ("no_save", "do not keep the gate's line"),
        ],
    },
    Layout {
        path: &["study"],
        groups: &[(PAIR, &["device"])],
        brief: &[],
    },
    Layout {
        path: &["study", "plan"],
        groups: &[(OUTPUT, &["study", "out", "json", "device"])],
        brief: &[
            ("study", "study file (TOML)"),
            ("out", "save the manifest here"),
        ],
    },
    Layout {
        path: &["study", "run"],
        groups: &[
            (PAIR, &["mapper_dir", "device"]),
            ("What to run", &["study", "shard", "shards", "jobs"]),
            (OUTPUT, &["out"]),
        ],
        brief: &[
            ("study", "study file (TOML)"),
            ("out", "output directory"),
            ("mapper_dir", "mappers directory"),
            ("shard", "this shard's number"),
            ("shards", "shards in all"),
        ],
    },
    Layout {
        path: &["study", "report"],
        groups: &[(OUTPUT, &["out", "against", "json", "plot", "device"])],
        brief: &[
            ("out", "a study's output directory"),
            ("against", "variant to compare with"),
        ],
    },
    Layout {
        path: &["study", "recall-scripts"],
        groups: &[(
            OUTPUT,
            &["conversations", "skip_conversations", "out", "device"],
        )],
        brief: &[
            ("conversations", "conversations to write"),
            ("out", "directory to write them to"),
        ],
    },
];

/// `baton -h`'s commands, grouped by use, each with its line.
const GROUPS: &[(&str, &[(&str, &str)])] = &[
    (
        "The workbench and its demo",
        &[
            (
                "workbench",
                "chat, switch models, watch the handoff (the default)",
            ),
            ("demo", "play the scripted demo, pausing at each switch"),
        ],
    ),
    (
        "Scripted runs, sessions and studies",
        &[
            ("run", "run a scripted conversation and record it"),
            ("replay", "run a recorded session again and compare"),
            ("report", "sum a recorded session up, or plot it"),
            ("study", "drift studies over many conversations"),
        ],
    ),
    (
        "Models and mappers",
        &[
            ("fetch", "download models and data"),
            ("info", "a model's shape, tokenizer and checksum"),
            ("generate", "generate text from a prompt"),
            ("calibrate", "fit the mappers between two models"),
            ("mappers", "list the mappers and what they learned"),
        ],
    ),
    (
        "Measurement",
        &[
            ("eval", "measure a mapper on held-out text and tasks"),
            ("bench", "time the map against the re-prefill"),
            ("bench-model", "time the decoder against candle's"),
            ("gate-study", "measure the gate's estimates"),
        ],
    ),
];

/// One line for the commands listed under another (`baton study -h`); `--help` on the
/// command itself gives its paragraph.
const LINES: &[(&[&str], &str)] = &[
    (
        &["study", "plan"],
        "expand a study file into its work items",
    ),
    (
        &["study", "run"],
        "run a study's unfinished items (or one shard's)",
    ),
    (
        &["study", "report"],
        "sum a study's output up, with intervals",
    ),
    (
        &["study", "recall-scripts"],
        "write the recall suite as study scripts",
    ),
];

/// The command line as a person reads it.
pub fn shape(cmd: Command) -> Command {
    let about = cmd.get_long_about().or(cmd.get_about()).cloned();
    let cmd = cmd
        .help_template(top_template())
        .before_long_help(about.map(|a| format!("{a}\n\n")).unwrap_or_default())
        .mut_arg("device", |a| {
            let paragraph = a.get_help().cloned().unwrap_or_default();
            a.short('d')
                .value_name("DEV")
                .help("cpu, cuda or cuda:N")
                .long_help(paragraph)
                .help_heading(PAIR)
                .hide_env_values(true)
        })
        // Test and device settings: in `--help`, not in `-h`.
        .mut_arg("activations", |a| {
            a.help_heading(PAIR)
                .hide_short_help(true)
                .hide_env_values(true)
        })
        .mut_arg("attention", |a| {
            a.help_heading(PAIR)
                .hide_short_help(true)
                .hide_env_values(true)
        });
    let mut cmd = cmd;
    for layout in LAYOUTS {
        cmd = at(cmd, layout.path, &|c| lay_out(c, layout));
    }
    for (path, line) in LINES {
        cmd = at(cmd, path, &|c| {
            let paragraph = c.get_long_about().or(c.get_about()).cloned();
            let c = c.about(line.to_string());
            match paragraph {
                Some(p) => c.long_about(p),
                None => c,
            }
        });
    }
    cmd.disable_help_subcommand(true)
}

/// `f` applied to the subcommand at `path` under `cmd`.
fn at(cmd: Command, path: &[&str], f: &dyn Fn(Command) -> Command) -> Command {
    match path {
        [] => f(cmd),
        [first, rest @ ..] => cmd.mut_subcommand(*first, |c| at(c, rest, f)),
    }
}

fn lay_out(mut cmd: Command, layout: &Layout) -> Command {
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in &ids {
        let heading = layout
            .groups
            .iter()
            .find(|(_, ids)| ids.contains(&id.as_str()))
            .map(|(h, _)| *h);
        let brief = layout
            .brief
            .iter()
            .find(|(b, _)| b == id)
            .map(|(_, line)| *line);
        let short = SHORT.iter().find(|(s, _)| s == id).map(|(_, c)| *c);
        let value = VALUE.iter().find(|(v, _)| v == id).map(|(_, n)| *n);
        cmd = cmd.mut_arg(id, |a| arrange(a, heading, brief, short, value));
    }
    let hidden = ids
        .iter()
        .filter(|id| !layout.brief.iter().any(|(b, _)| b == *id))
        .filter(|id| !matches!(id.as_str(), "help" | "version" | "device"))
        .count();
    let more = if hidden > 0 && !layout.brief.is_empty() {
        hidden
    } else {
        0
    };
    with_help_flag(cmd, more)
}

/// -h and --help under the "Output" heading, instead of an "Options" section of their
/// own that would cost three lines of every `-h`; its line counts the flags `-h` leaves
/// out, where a note of its own would cost two more.
fn with_help_flag(cmd: Command, more: usize) -> Command {
    let line = match more {
        0 => "this help; --help: every flag, in full".to_string(),
        1 => "this help; --help: every flag, in full (1 more flag)".to_string(),
        n => format!("this help; --help: every flag, in full ({n} more flags)"),
    };
    cmd.disable_help_flag(true).arg(
        Arg::new("help")
            .short('h')
            .long("help")
            .action(ArgAction::Help)
            .help(line)
            .long_help("-h: the common flags, a line each; --help: every flag, in full")
            .help_heading(OUTPUT),
    )
}

fn arrange(
    a: Arg,
    heading: Option<&'static str>,
    brief: Option<&str>,
    short: Option<char>,
    value: Option<&'static str>,
) -> Arg {
    if a.is_global_set() {
        return a;
    }
    let a = match short {
        Some(c) if a.get_long().is_some() && a.get_short().is_none() => a.short(c),
        _ => a,
    };
    let a = match value {
        Some(v) if a.get_long().is_some() => a.value_name(v),
        _ => a,
    };
    let a = a.help_heading(heading).hide_env_values(true);
    match brief {
        // `-h` shows the line; `--help` the paragraph the flag was declared with.
        Some(line) => {
            let paragraph = a.get_long_help().or(a.get_help()).cloned();
            let a = a.help(line.to_string());
            match paragraph {
                Some(p) => a.long_help(p),
                None => a,
            }
        }
        None => a.hide_short_help(true),
    }
}

fn top_template() -> String {
    let width = GROUPS
        .iter()
        .flat_map(|(_, cmds)| cmds.iter().map(|(n, _)| n.len()))
        .max()
        .unwrap_or(0);
    // No about line, no blank line between groups, and the options in one line:
    // fifteen commands, grouped, and the options fit 22 rows, so that on a 24-row screen
    // the first stays in view when the prompt comes back. `--help` adds the about.
    let mut t = String::from(
        "{before-help}{usage-heading} {usage}  `baton COMMAND -h`: its flags; -V: version\n",
    );
    for (group, cmds) in GROUPS {
        t.push_str(&format!("\n{group}:"));
        for (name, line) in *cmds {
            t.push_str(&format!("\n  {name:width$}  {line}"));
        }
    }
    t.push_str(
        "\nOptions: -d, --device <DEV>  cpu (default), cuda or cuda:N [env: BATON_DEVICE]\n",
    );
    t
}

/// Every command `baton -h` lists, for the test that keeps the list whole.
#[cfg(test)]
pub fn listed() -> Vec<&'static str> {
    GROUPS
        .iter()
        .flat_map(|(_, cmds)| cmds.iter().map(|(n, _)| *n))
        .collect()
}
