//! Seeded damage for the readers of user files (see tests/fuzz_readers.rs).
#![allow(dead_code)]

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha12Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Cases per reader: `BATON_FUZZ_CASES`, default 400 (what CI runs).
pub fn cases() -> usize {
    std::env::var("BATON_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400)
}

/// A damaged copy of `seed`, the `case`-th of the series `series`.
pub fn mutate(seed: &[u8], series: u64, case: u64, focus: usize) -> Vec<u8> {
    let mut rng = ChaCha12Rng::seed_from_u64(series.wrapping_mul(1_000_003).wrapping_add(case));
    let mut b = seed.to_vec();
    let span = focus.min(b.len()).max(1);
    for _ in 0..rng.random_range(1..=4) {
        if b.is_empty() {
            b.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..span.min(b.len()));
        match rng.random_range(0..7) {
            0 => b[at] ^= 1 << rng.random_range(0..8),
            1 => b[at] = 0,
            2 => b[at] = 0xFF,
            3 => b.truncate(at),
            4 => {
                let end = (at + rng.random_range(1..64)).min(b.len());
                let run = b[at..end].to_vec();
                b.splice(at..at, run);
            }
            5 => {
                let run: Vec<u8> = (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                b.splice(at..at, run);
            }
            _ => {
                let huge: u64 = match rng.random_range(0..3) {
                    0 => u64::MAX,
                    1 => 1 << 40,
                    _ => rng.random_range(1 << 20..1 << 32),
                };
                let end = (at + 8).min(b.len());
                b[at..end].copy_from_slice(&huge.to_le_bytes()[..end - at]);
            }
        }
    }
    b
}

/// Feed `n` damaged copies of `seed` to `read`; returns how many it accepted. A panic
/// fails the test with the case that caused it.
pub fn fuzz(
    name: &str,
    seed: &[u8],
    focus: usize,
    n: usize,
    read: &dyn Fn(&[u8]) -> bool,
) -> usize {
    let series = name
        .bytes()
        .fold(0u64, |h, c| h.wrapping_mul(31).wrapping_add(c as u64));
    let mut accepted = 0;
    for case in 0..n as u64 {
        let input = mutate(seed, series, case, focus);
        match catch_unwind(AssertUnwindSafe(|| read(&input))) {
            Ok(true) => accepted += 1,
            Ok(false) => {}
            Err(_) => panic!(
                "{name}: case {case} panicked ({} bytes); reproduce with mutate(seed, {series}, {case}, {focus})",
                input.len()
            ),
        }
    }
    eprintln!(
        "fuzz {name}: {n} damaged inputs, {accepted} read, {} refused, no panic",
        n - accepted
    );
    accepted
}
