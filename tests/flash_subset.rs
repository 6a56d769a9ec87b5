//! `scripts/flash-subset.py`, the step of `scripts/check-cuda --flash` that lays out
//! candle-flash-attn to compile only the kernels the supported models use, run on a crate
//! of the same layout: it needs no CUDA, so the layout it expects cannot rot unseen.

use std::path::Path;
use std::process::Command;

const BUILD_RS: &str = r#"use cudaforge::{KernelBuilder, Result};
const CUTLASS_COMMIT: &str = "7d49e6c7e2f8896c47f586706e67e1fb215529dc";

const KERNEL_FILES: [&str; 3] = [
    "kernels/flash_api.cu",
    "kernels/flash_fwd_hdim32_fp16_sm80.cu",
    "kernels/flash_fwd_splitkv_hdim64_bf16_sm80.cu",
];

fn main() -> Result<()> {
    let builder = KernelBuilder::new()
        .source_files(KERNEL_FILES.iter().collect())
        .with_cutlass(Some(CUTLASS_COMMIT)) // fetched from GitHub
        .arg("-O3");
    Ok(())
}
"#;

const BUILT: [&str; 4] = [
    "flash_fwd_hdim64_bf16_sm80.cu",
    "flash_fwd_hdim64_bf16_causal_sm80.cu",
    "flash_fwd_hdim128_bf16_sm80.cu",
    "flash_fwd_hdim128_bf16_causal_sm80.cu",
];

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

fn fake_crate(root: &Path) {
    write(&root.join("build.rs"), BUILD_RS);
    write(&root.join("src/lib.rs"), "");
    for f in ["flash_api.cu"].iter().chain(&BUILT) {
        write(&root.join("kernels").join(f), "// kernel\n");
    }
}

fn fake_cutlass(include: &Path) {
    write(
        &include.join("cutlass/version.h"),
        "#define CUTLASS_MAJOR 3\n#define CUTLASS_MINOR 5\n#define CUTLASS_PATCH 0\n",
    );
    write(&include.join("cute/tensor.hpp"), "");
}

fn subset(src: &Path, dst: &Path, include: &Path) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/flash-subset.py");
    Command::new("python3")
        .arg(script)
        .args([src, dst, include])
        .output()
        .unwrap()
}

#[test]
fn the_flash_crate_copy_builds_four_kernels_against_cutlass_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let (src, dst, include) = (
        dir.path().join("src"),
        dir.path().join("copy"),
        dir.path().join("cutlass/include"),
    );
    fake_crate(&src);
    fake_cutlass(&include);
    let run = subset(&src, &dst, &include);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let build = std::fs::read_to_string(dst.join("build.rs")).unwrap();
    assert!(
        build.contains("const KERNEL_FILES: [&str; 6] = ["),
        "{build}"
    );
    for f in ["flash_api.cu", "flash_fwd_not_built.cu"]
        .iter()
        .chain(&BUILT)
    {
        assert!(build.contains(&format!("\"kernels/{f}\"")), "{f}: {build}");
    }
    assert!(!build.contains("hdim32"), "{build}");
    // CUTLASS comes from the include dir given, never from a clone.
    assert!(!build.contains(".with_cutlass("), "{build}");
    let include_arg = format!(".include_path({:?})", include.to_str().unwrap());
    assert!(build.contains(&include_arg), "{build}");
    assert!(build.contains("CUTLASS 3.5.0 headers"), "{build}");
    assert!(dst.join("src/lib.rs").is_file());

    // Every kernel flash_api.cu dispatches to and the copy does not build: 18 forward
    // (2 dtypes x 9 head sizes) less the 2 built, and 8 paged split-KV (2 dtypes x 4
    // head sizes), each causal and not.
    let stubs = std::fs::read_to_string(dst.join("kernels/flash_fwd_not_built.cu")).unwrap();
    assert_eq!(stubs.matches("template<> void run_mha_fwd_<").count(), 32);
    assert_eq!(
        stubs
            .matches("template<> void run_mha_fwd_splitkv_paged_<")
            .count(),
        16
    );
    assert!(stubs.contains("run_mha_fwd_<cutlass::half_t, 64, true>"));
    assert!(!stubs.contains("run_mha_fwd_<cutlass::bfloat16_t, 64, true>"));
    assert!(!stubs.contains("run_mha_fwd_<cutlass::bfloat16_t, 128, false>"));
    assert!(stubs.contains("run_mha_fwd_splitkv_paged_<cutlass::bfloat16_t, 128, true>"));
    assert!(stubs.contains("std::abort()"));

    // A second run over an unchanged copy rewrites nothing: cargo and the kernel cache
    // see it as it was.
    let before = std::fs::metadata(dst.join("build.rs"))
        .unwrap()
        .modified()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(subset(&src, &dst, &include).status.success());
    let after = std::fs::metadata(dst.join("build.rs"))
        .unwrap()
        .modified()
        .unwrap();
    assert_eq!(before, after);
}

#[test]
fn a_changed_crate_or_a_wrong_include_dir_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (src, include) = (dir.path().join("src"), dir.path().join("include"));
    fake_crate(&src);
    fake_cutlass(&include);

    let run = subset(&src, &dir.path().join("a"), &dir.path().join("nowhere"));
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        err.contains("has no cute/") && err.contains("CUTLASS"),
        "{err}"
    );

    std::fs::remove_file(src.join("kernels/flash_fwd_hdim128_bf16_sm80.cu")).unwrap();
    let run = subset(&src, &dir.path().join("b"), &include);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(
        err.contains("flash_fwd_hdim128_bf16_sm80.cu missing"),
        "{err}"
    );

    write(&src.join("build.rs"), "fn main() {}\n");
    let run = subset(&src, &dir.path().join("c"), &include);
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(!run.status.success());
    assert!(err.contains("not candle-flash-attn's source"), "{err}");
}
