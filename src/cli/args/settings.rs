//! The conversation settings as flags of `baton workbench`, `baton demo` and `baton run`.

use baton::engine::setting_checks;
use baton::engine::{RereadOverride, SettingsOverrides};
use clap::Args;

/// The flags of [`SettingsOverrides`]: each one left out or set. The values go through
/// the same checks in [`setting_checks`] a script's keys do, so both refuse a value with
/// the same words.
#[derive(Debug, Clone, Default, PartialEq, Args)]
pub struct SettingsArgs {
    /// Longest answer, in tokens (default 256).
    #[arg(long, value_parser = setting_checks::max_tokens_flag)]
    pub max_tokens: Option<usize>,
    /// Re-prefill instead of mapping when the switch's fidelity estimate (mean
    /// attention cosine, -1 to 1) is below this.
    #[arg(long, value_name = "COSINE", value_parser = setting_checks::gate_flag)]
    pub gate: Option<f64>,
    /// Map the inactive model's cache after every turn, so a switch finds it ready.
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub premap: Option<bool>,
    /// Start with the re-prefilled reference path off (Ctrl-R toggles it); a script's
    /// `reference = false`.
    #[arg(long = "no-reference", num_args = 0, default_missing_value = "false")]
    pub reference: Option<bool>,
    /// At a switch, the target reads the newest N tokens of the conversation itself
    /// instead of receiving them mapped: a longer handoff for the facts said last
    /// (default 0).
    #[arg(long, value_name = "N")]
    pub tail: Option<usize>,
    /// Do not learn from the conversation: the mappers stay as calibrated (what they
    /// learned in earlier sessions is not used either); a script's `learn = false`.
    #[arg(long = "no-learn", num_args = 0, default_missing_value = "false")]
    pub learn: Option<bool>,
    /// Repair in the background: while idle after a switch, the active model re-prefills
    /// the conversation into its own cache, replacing mapped positions (Ctrl-P toggles).
    #[arg(long, num_args = 0, default_missing_value = "true")]
    pub repair: Option<bool>,
    /// The handoff's plan at the first message after a switch: each mapped position is
    /// re-read, kept mapped or dropped (what it drops is read back in the background,
    /// and before the next message at the latest). Default: up:40%:facts:word (`up:` runs
    /// it on switches to the larger model only). A budget (a share, 0.2 or 20%, or a
    /// time, 150ms) after an optional kind: `map` (re-read that much, keep the rest
    /// mapped; the default kind), `drop` (re-read it, drop the rest) or `focus` (`drop`
    /// with the best sentence whole where the message asks about what the history says,
    /// `map` otherwise); then optionally the selector (`facts`, the default, or
    /// `sentence-facts`) and the span growth (`word`, the default, `sentence` or
    /// `token`). 0 or off: the map alone. docs/plan.md says which to choose. A script's
    /// `reread = "drop:30%:sentence-facts"`.
    #[arg(
        long,
        visible_alias = "plan",
        value_name = "[up:][KIND:]BUDGET[:SELECTOR[:SPANS]]"
    )]
    pub reread: Option<RereadOverride>,
    /// The system prompt the conversation starts with.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
}

impl From<&SettingsArgs> for SettingsOverrides {
    fn from(a: &SettingsArgs) -> Self {
        // Spelled out field by field (no `..`), so a setting added to the library without
        // its flag does not compile.
        let SettingsArgs {
            max_tokens,
            gate,
            premap,
            reference,
            tail,
            learn,
            repair,
            reread,
            system,
        } = a.clone();
        SettingsOverrides {
            max_tokens,
            gate,
            premap,
            reference,
            tail,
            learn,
            repair,
            reread,
            system,
        }
    }
}

impl From<SettingsArgs> for SettingsOverrides {
    fn from(a: SettingsArgs) -> Self {
        Self::from(&a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton::engine::setting_checks::{check_gate, check_max_tokens, gate_flag};
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        settings: SettingsArgs,
    }

    fn flags(args: &[&str]) -> Result<SettingsOverrides, clap::Error> {
        Flags::try_parse_from([&["baton"], args].concat()).map(|f| f.settings.into())
    }

    /// Why the flags are refused (clap's message) and why the same script key is.
    fn refused(flag: &[&str], key: &str) -> (String, String) {
        let by_flag = flags(flag).map(|_| ()).unwrap_err().to_string();
        let by_key = toml::from_str::<SettingsOverrides>(key)
            .map(|_| ())
            .unwrap_err()
            .to_string();
        (by_flag, by_key)
    }

    #[test]
    fn flags_map_into_the_settings_a_script_with_the_same_values_gives() {
        let by_flags = flags(&[
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
        ])
        .unwrap();
        let by_script: SettingsOverrides = toml::from_str(
            r#"
            max_tokens = 12
            gate = 0.9
            premap = true
            reference = false
            tail = 32
            learn = false
            repair = true
            reread = "0.1:round-trip:sentence"
            system = "be brief"
            "#,
        )
        .unwrap();
        assert_eq!(by_flags, by_script);
        assert!(by_flags.reread.unwrap().0.is_some());
        // A share written as a number in the script is the flag's text.
        let share = toml::from_str::<SettingsOverrides>("reread = 0.2").unwrap();
        assert_eq!(flags(&["--reread", "0.2"]).unwrap(), share);
        let off = toml::from_str::<SettingsOverrides>("reread = \"off\"").unwrap();
        assert_eq!(flags(&["--reread", "off"]).unwrap(), off);
        // Nothing given: nothing set, as an empty script.
        assert_eq!(flags(&[]).unwrap(), toml::from_str("").unwrap());
        assert_eq!(flags(&[]).unwrap(), SettingsOverrides::default());
    }

    #[test]
    fn zero_max_tokens_is_refused_by_flag_and_script_alike() {
        let (flag, key) = refused(&["--max-tokens", "0"], "max_tokens = 0");
        let why = check_max_tokens(0).unwrap_err();
        assert!(
            flag.contains("--max-tokens") && flag.contains(&why),
            "{flag}"
        );
        assert!(key.contains(&why), "{key}");
        assert_eq!(flags(&["--max-tokens", "1"]).unwrap().max_tokens, Some(1));
    }

    #[test]
    fn a_gate_outside_a_cosine_or_nan_is_refused_by_flag_and_script_alike() {
        for (flag, key, shown) in [
            ("7.5", "gate = 7.5", "7.5"),
            ("NaN", "gate = nan", "NaN"),
            ("-1.5", "gate = -1.5", "-1.5"),
            ("inf", "gate = inf", "inf"),
        ] {
            let (by_flag, by_key) = refused(&[&format!("--gate={flag}")], key);
            for e in [&by_flag, &by_key] {
                assert!(
                    e.contains("from -1 to 1") && e.contains(&format!("not {shown}")),
                    "{flag}: {e}"
                );
            }
        }
        for ok in [-1.0, 0.0, 0.9, 1.0] {
            assert_eq!(check_gate(ok), Ok(ok));
            assert_eq!(flags(&[&format!("--gate={ok}")]).unwrap().gate, Some(ok));
        }
        assert_eq!(gate_flag("high").unwrap_err(), "`high` is not a number");
    }

    #[test]
    fn a_boolean_reread_names_the_values_it_takes() {
        let (by_flag, by_key) = refused(&["--reread", "true"], "reread = true");
        for e in [&by_flag, &by_key] {
            assert!(
                e.contains("re-read budget \"true\"")
                    && e.contains("0.2 or 20%")
                    && e.contains("150ms"),
                "{e}"
            );
            assert!(!e.contains("untagged"), "{e}");
        }
    }
}
