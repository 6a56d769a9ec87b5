//! What the headless commands show on a plain terminal: progress bars for long phases
//! ([`bars`]). The workbench draws its own screen and uses none of this.

pub mod bars;

pub use bars::PhaseBars;
