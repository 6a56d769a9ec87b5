//! Latency, measured in one process with the variants interleaved: the map against a
//! re-prefill across context lengths ([`switch`]) and the decoder's own throughput against
//! candle-transformers' on the same file ([`decoder`]). [`run`] is the whole `baton bench`
//! sweep and [`bench_json`] the JSON document it prints.

pub mod bench_json;
pub mod decoder;
pub mod run;
pub mod switch;

pub use bench_json::{BenchReport, DirectionBench};
pub use run::{check_plan, sweep, BenchError, SweepPlan, MIN_LENGTH};
pub use switch::{
    bench_point, linear_fit, mapper_cost, BenchOptions, BenchPoint, MapperCost, Spread,
};
