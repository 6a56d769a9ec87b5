//! Typed names for what events and commands refer to: a model of the pair by the name it
//! was loaded as. In JSON it is the plain string, so session files are unchanged.

use serde::{Deserialize, Serialize};
use std::fmt;

/// One model of the pair, by the name it was loaded as (a manifest name, a path or a
/// hub reference).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModelName(String);

impl ModelName {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ModelName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for ModelName {
    fn from(s: &str) -> Self {
        Self(s.to_string())
    }
}

impl From<String> for ModelName {
    fn from(s: String) -> Self {
        Self(s)
    }
}

impl AsRef<str> for ModelName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq<str> for ModelName {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for ModelName {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for ModelName {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<ModelName> for str {
    fn eq(&self, other: &ModelName) -> bool {
        self == other.0
    }
}

impl PartialEq<ModelName> for &str {
    fn eq(&self, other: &ModelName) -> bool {
        *self == other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_model_name_is_its_plain_string_in_json_and_compares_with_strings() {
        let m = ModelName::new("qwen2.5-coder-0.5b");
        assert_eq!(serde_json::to_string(&m).unwrap(), "\"qwen2.5-coder-0.5b\"");
        let back: ModelName = serde_json::from_str("\"qwen2.5-coder-0.5b\"").unwrap();
        assert_eq!(back, m);
        assert!(m == "qwen2.5-coder-0.5b");
        assert!("qwen2.5-coder-0.5b" == m);
        assert_eq!(m.to_string(), "qwen2.5-coder-0.5b");
    }
}
