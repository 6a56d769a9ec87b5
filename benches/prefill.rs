//! Criterion bench of baton's decoder prefill (the re-prefill a map is timed against) on
//! the default pair's smaller model. Needs it in baton's cache dir (`baton fetch`);
//! without it, it says so and measures nothing. `baton bench-model` sets the same
//! prefill against candle-transformers' quantized Qwen2 in one run.
use baton::fetch::SilentProgress;
use baton::model::{ForwardOptions, Logits};
use candle_core::Device;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn prefill(c: &mut Criterion) {
    let Ok(model) = baton::fetch::open_model("qwen2.5-coder-0.5b", &Device::Cpu, &SilentProgress)
    else {
        eprintln!("prefill: qwen2.5-coder-0.5b is not in the cache dir; run `baton fetch` first");
        return;
    };
    let mut group = c.benchmark_group("prefill");
    group.sample_size(10);
    for tokens in [128usize, 512] {
        let ids = baton::lab::bench::decoder::bench_tokens(tokens, model.config().vocab_size, 7);
        let opts = ForwardOptions {
            logits: Logits::None,
            probe_positions: vec![],
        };
        group.bench_with_input(
            BenchmarkId::new("qwen2.5-coder-0.5b", tokens),
            &tokens,
            |b, _| {
                b.iter(|| {
                    let mut cache = model.decoder.new_cache();
                    model
                        .decoder
                        .forward(&ids, &mut cache, &opts)
                        .map(|_| cache.len())
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, prefill);
criterion_main!(benches);
