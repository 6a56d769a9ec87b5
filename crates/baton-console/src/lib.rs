//! What the headless commands show on a plain terminal: progress bars for long phases
//! ([`bars`]), a conversation as plain lines ([`events`]) with a long prefill's progress
//! ([`prefill`]), a model's description
//! ([`info`]) and the mappers in the cache ([`mappers`]). The workbench draws its own
//! screen and uses none of this.

pub mod bars;
pub mod events;
pub mod info;
pub mod mappers;
pub mod prefill;

pub use bars::PhaseBars;
pub use events::EventPrinter;
