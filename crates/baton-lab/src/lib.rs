//! The lab: what measures the product rather than being it. Evaluations on held-out text,
//! tasks and the recall suite (`eval`), timings of the map against the re-prefill and of
//! the decoder (`bench`), drift studies over many scripted conversations, sharded onto
//! Slurm (`study`), and their plots (`plot`). It may import every room of the product;
//! no room of the product imports it, so the workbench builds and runs without it.

pub mod bench;
pub mod eval;
pub mod plot;
pub mod study;
