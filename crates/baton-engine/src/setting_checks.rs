//! One check per conversation setting, shared by the command-line flags (as value
//! parsers of the text a flag is given) and a script's top-level keys (as serde
//! deserializers), so that a value one refuses the other refuses too, with the same words.

use serde::{Deserialize, Deserializer};

/// The longest answer, in tokens: 0 would still let the model answer one token.
pub fn check_max_tokens(n: usize) -> Result<usize, String> {
    if n == 0 {
        return Err("max_tokens must be at least 1 (it is the longest answer, in tokens)".into());
    }
    Ok(n)
}

/// The gate's threshold is a cosine, so only -1..=1 means anything: above 1 every
/// switch would re-prefill, and NaN compares false with every estimate.
pub fn check_gate(cosine: f64) -> Result<f64, String> {
    if !(-1.0..=1.0).contains(&cosine) {
        return Err(format!(
            "the gate is an attention cosine from -1 to 1 (e.g. 0.9: re-prefill when the estimate is below 0.9), not {cosine}"
        ));
    }
    Ok(cosine)
}

/// `--max-tokens`.
pub fn max_tokens_flag(v: &str) -> Result<usize, String> {
    let n = v
        .trim()
        .parse::<usize>()
        .map_err(|e| format!("`{v}` is not a count: {e}"))?;
    check_max_tokens(n)
}

/// `--gate`.
pub fn gate_flag(v: &str) -> Result<f64, String> {
    let x = v
        .trim()
        .parse::<f64>()
        .map_err(|_| format!("`{v}` is not a number"))?;
    check_gate(x)
}

/// A script's `max_tokens`.
pub(super) fn max_tokens_key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<usize>, D::Error> {
    Option::<usize>::deserialize(d)?
        .map(check_max_tokens)
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// A script's `gate`.
pub(super) fn gate_key<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    Option::<f64>::deserialize(d)?
        .map(check_gate)
        .transpose()
        .map_err(serde::de::Error::custom)
}

/// A script's `reread` as the text the flag would be given: a number (`0.2`) is its
/// digits, and a boolean its word, so that `reread = true` is refused by the flag's own
/// parser, which says what it takes.
pub(super) fn reread_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;
    impl serde::de::Visitor<'_> for Text {
        type Value = String;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a re-read budget: a share (0.2 or \"20%\"), a time (\"150ms\"), optionally with \":SELECTOR:SPANS\", or 0 or \"off\" for none")
        }
        fn visit_bool<E>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_i64<E>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_u64<E>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_f64<E>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
        fn visit_str<E>(self, v: &str) -> Result<String, E> {
            Ok(v.to_string())
        }
    }
    d.deserialize_any(Text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SettingsOverrides;

    /// Why the script key is refused.
    fn refused(key: &str) -> String {
        toml::from_str::<SettingsOverrides>(key)
            .map(|_| ())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn zero_max_tokens_is_refused_by_flag_and_script_alike() {
        let why = check_max_tokens(0).unwrap_err();
        assert_eq!(max_tokens_flag("0").unwrap_err(), why);
        let key = refused("max_tokens = 0");
        assert!(key.contains(&why), "{key}");
        let o: SettingsOverrides = toml::from_str("max_tokens = 1").unwrap();
        assert_eq!(o.max_tokens, Some(1));
        assert_eq!(max_tokens_flag("1"), Ok(1));
    }

    #[test]
    fn a_gate_outside_a_cosine_or_nan_is_refused_by_flag_and_script_alike() {
        for (flag, key, shown) in [
            ("7.5", "gate = 7.5", "7.5"),
            ("NaN", "gate = nan", "NaN"),
            ("-1.5", "gate = -1.5", "-1.5"),
            ("inf", "gate = inf", "inf"),
        ] {
            let by_flag = gate_flag(flag).unwrap_err();
            let by_key = refused(key);
            for e in [&by_flag, &by_key] {
                assert!(
                    e.contains("from -1 to 1") && e.contains(&format!("not {shown}")),
                    "{flag}: {e}"
                );
            }
        }
        for ok in [-1.0, 0.0, 0.9, 1.0] {
            assert_eq!(check_gate(ok), Ok(ok));
            let o: SettingsOverrides = toml::from_str(&format!("gate = {ok:?}")).unwrap();
            assert_eq!(o.gate, Some(ok));
        }
        assert_eq!(gate_flag("high").unwrap_err(), "`high` is not a number");
    }

    #[test]
    fn a_boolean_reread_names_the_values_it_takes() {
        let by_flag = "true".parse::<crate::RereadOverride>().unwrap_err();
        let by_key = refused("reread = true");
        for e in [&by_flag, &by_key] {
            assert!(
                e.contains("re-read budget \"true\"")
                    && e.contains("0.2 or 20%")
                    && e.contains("150ms"),
                "{e}"
            );
            assert!(!e.contains("untagged"), "{e}");
        }
        let by_key = refused("reread = false");
        assert!(by_key.contains("re-read budget \"false\""), "{by_key}");
        let e = refused("reread = [1]");
        assert!(e.contains("a share (0.2"), "{e}");
        let o: SettingsOverrides = toml::from_str("reread = 0").unwrap();
        assert_eq!(o.reread.unwrap().0, None);
    }
}
