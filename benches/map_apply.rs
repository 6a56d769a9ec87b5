//! Criterion bench of the map alone: a source cache of the default pair mapped onto the
//! target, int8 and f32, at a few context lengths. Needs the models and the mappers in
//! baton's cache dir (`baton fetch`, `baton calibrate`); without them it says so and
//! measures nothing. `baton bench` is the whole comparison against re-prefill.
use baton::fetch::SilentProgress;
use baton::mapper::MapPrecision;
use baton::model::{ForwardOptions, Logits, Model};
use candle_core::Device;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};

fn models() -> Option<(Model, Model)> {
    let open = |n: &str| baton::fetch::open_model(n, &Device::Cpu, &SilentProgress).ok();
    Some((open("qwen2.5-coder-0.5b")?, open("qwen2.5-coder-1.5b")?))
}

fn map_apply(c: &mut Criterion) {
    let Some((small, large)) = models() else {
        eprintln!("map_apply: the default pair is not in the cache dir; run `baton fetch` first");
        return;
    };
    let mut group = c.benchmark_group("map_apply");
    group.sample_size(10);
    for (src, tgt) in [(&small, &large), (&large, &small)] {
        let Ok((_, mapper)) = baton::mapper::dir::MapperDir::default_location().open_for(src, tgt)
        else {
            eprintln!(
                "map_apply: no mapper {} -> {}; run `baton calibrate` first",
                src.identity.name, tgt.identity.name
            );
            continue;
        };
        for tokens in [256usize, 1024] {
            let ids = baton::lab::bench::decoder::bench_tokens(tokens, 150_000, 7);
            let mut cache = src.decoder.new_cache();
            let opts = ForwardOptions {
                logits: Logits::None,
                probe_positions: vec![],
            };
            if src.decoder.forward(&ids, &mut cache, &opts).is_err() {
                continue;
            }
            for precision in [MapPrecision::Int8, MapPrecision::F32] {
                let Ok(m) = mapper.clone().with_precision(precision) else {
                    continue;
                };
                if m.precision() != precision {
                    continue;
                }
                let id = BenchmarkId::new(
                    format!("{}->{} {precision:?}", src.identity.name, tgt.identity.name),
                    tokens,
                );
                group.bench_with_input(id, &tokens, |b, _| {
                    b.iter(|| {
                        m.map_cache(&cache, &ids, src.decoder.rope(), tgt.decoder.rope())
                            .map(|c| c.len())
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, map_apply);
criterion_main!(benches);
