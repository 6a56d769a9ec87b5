//! Loops the full map at one context length, for profiling the mapping kernel alone.
use baton::mapper::artifact;
use baton::model::{ForwardOptions, Logits, Model};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (s, t) = if args.get(1).map(|s| s.as_str()) == Some("rev") {
        ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    } else {
        ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
    };
    let n: usize = args.get(2).and_then(|v| v.parse().ok()).unwrap_or(1024);
    let reps: usize = args.get(3).and_then(|v| v.parse().ok()).unwrap_or(10);
    let dev = candle_core::Device::Cpu;
    let p = baton::fetch::SilentProgress;
    let src = Model::open(s, &dev, &p)?;
    let tgt = Model::open(t, &dev, &p)?;
    let (_, mapper) = artifact::open_for(
        std::env::var("MAPPER_DIR")
            .ok()
            .map(std::path::PathBuf::from)
            .as_deref(),
        &src,
        &tgt,
    )?;
    let ids = baton::model::bench::bench_tokens(n, 150000, 7);
    let mut cache = src.decoder.new_cache();
    src.decoder.forward(
        &ids,
        &mut cache,
        &ForwardOptions {
            logits: Logits::None,
            probe_positions: vec![],
        },
    )?;
    let mut times = vec![];
    for _ in 0..reps {
        let t0 = Instant::now();
        let m = mapper.map_cache(&cache, src.decoder.rope(), tgt.decoder.rope())?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        drop(m);
    }
    times.sort_by(|a, b| a.total_cmp(b));
    println!("precision {:?}", mapper.precision());
    if mapper.precision() == baton::mapper::MapPrecision::Int8 {
        let f = mapper
            .clone()
            .with_precision(baton::mapper::MapPrecision::F32)?;
        let a = mapper.map_cache(&cache, src.decoder.rope(), tgt.decoder.rope())?;
        let b = f.map_cache(&cache, src.decoder.rope(), tgt.decoder.rope())?;
        for l in 0..tgt.decoder.kv_shape().n_layer {
            let (x, y) = (a.layer_range(l, 0, n)?, b.layer_range(l, 0, n)?);
            let rel = |p: &candle_core::Tensor, q: &candle_core::Tensor| -> anyhow::Result<f32> {
                let d = (p - q)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
                Ok((d / q.sqr()?.sum_all()?.to_scalar::<f32>()?).sqrt())
            };
            print!("L{l} k {:.4} v {:.4}; ", rel(&x.k, &y.k)?, rel(&x.v, &y.v)?);
        }
        println!();
    }
    println!(
        "{s} -> {t} {n} tokens: map median {:.1} ms min {:.1}",
        times[reps / 2],
        times[0]
    );
    Ok(())
}
