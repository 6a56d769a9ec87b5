//! The GGUF and safetensors loaders agree on the same weights for every architecture,
//! which also checks the rope layouts: llama GGUF files rotate adjacent pairs of permuted
//! Q/K rows, Hugging Face checkpoints rotate halves.

mod common;

use baton::model::{load_decoder, LoadOptions, RopeLayout};
use candle_core::Device;
use common::synthetic::Tiny;

#[test]
fn gguf_and_safetensors_give_the_same_logits_for_each_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let dev = Device::Cpu;
    let ids: Vec<u32> = (0..40u32).map(|i| (i * 37 + 5) % 128).collect();
    for arch in ["qwen2", "qwen3", "llama", "mistral"] {
        let tiny = Tiny::new(arch);
        let st = dir.path().join(format!("{arch}-hf"));
        let gg = dir.path().join(format!("{arch}.gguf"));
        tiny.write_safetensors(&st, 7);
        tiny.write_gguf(&gg, 7);
        let a = load_decoder(&st, &dev, LoadOptions::for_device(&dev)).unwrap();
        let b = load_decoder(&gg, &dev, LoadOptions::for_device(&dev)).unwrap();
        assert_eq!(a.decoder.config().rope.layout, RopeLayout::RotateHalf);
        let expect_gguf = if matches!(arch, "llama" | "mistral") {
            RopeLayout::Interleaved
        } else {
            RopeLayout::RotateHalf
        };
        assert_eq!(b.decoder.config().rope.layout, expect_gguf);
        let (mut ca, mut cb) = (a.decoder.new_cache(), b.decoder.new_cache());
        let la = a.decoder.next_logits(&ids, &mut ca).unwrap();
        let lb = b.decoder.next_logits(&ids, &mut cb).unwrap();
        let scale = la
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let d = (&la - &lb)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(
            d <= 1e-4 * scale.max(1.0),
            "{arch}: max |dlogit| {d} (scale {scale})"
        );
        // Values carry no position, so V caches agree directly; keys agree up to the
        // GGUF row permutation for llama-family files.
        let (ea, eb) = (ca.export().unwrap(), cb.export().unwrap());
        let dv = (&ea[1].v - &eb[1].v)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        assert!(dv < 1e-4, "{arch}: V caches differ by {dv}");
    }
}
