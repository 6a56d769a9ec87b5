//! `--token-features` of `baton calibrate`.

use baton::calibrate::TokenFeatures;

/// Which maps read the token block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TokenFeaturesArg {
    /// None: the source's features only.
    #[default]
    Off,
    /// Every key and value map.
    All,
    /// Per target layer and half, where the block raises that layer's held-out
    /// attention cosine.
    Cosine,
    /// Per target layer and half, where the block raises the held-out R².
    R2,
}

impl From<TokenFeaturesArg> for TokenFeatures {
    fn from(a: TokenFeaturesArg) -> Self {
        match a {
            TokenFeaturesArg::Off => TokenFeatures::Off,
            TokenFeaturesArg::All => TokenFeatures::All,
            TokenFeaturesArg::Cosine => TokenFeatures::Cosine,
            TokenFeaturesArg::R2 => TokenFeatures::R2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn each_flag_value_is_the_library_value_a_script_names_the_same() {
        for a in TokenFeaturesArg::value_variants() {
            let name = a.to_possible_value().unwrap().get_name().to_string();
            let by_script: TokenFeatures = serde_json::from_value(name.clone().into()).unwrap();
            assert_eq!(TokenFeatures::from(*a), by_script, "{name}");
        }
        assert_eq!(TokenFeaturesArg::value_variants().len(), 4);
    }
}
