//! What baton reads to calibrate and to evaluate: text corpora cut into token windows
//! ([`corpus`]), benchmark items (HellaSwag, ARC, MMLU, GSM8K, … in [`tasks`]) and the
//! Arrow IPC tables some of them ship as ([`arrow`]). Files are only read, never run.

pub mod arrow;
pub mod chat_corpus;
pub mod corpus;
pub mod held_out;
pub mod package_texts;
pub mod recall;
pub mod tasks;
