//! Flags for the library's own types: the library knows no command line, so each type a
//! command takes as flags has its argument struct or value enum here, mapped into it.

pub mod settings;
pub mod token_features;

pub use settings::SettingsArgs;
pub use token_features::TokenFeaturesArg;
