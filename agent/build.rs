//! Builds the kernel programs in `ebpf/programs` for the BPF target with the
//! nightly toolchain (aya-build), so `cargo build` yields an agent with its
//! datapath embedded.
fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../ebpf");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "weir-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )?;
    // aya-build's own `AYA_BUILD_SKIP=1` returns before writing the object,
    // and `include_bytes_aligned!` needs a file. The fuzz targets (fuzz/) set
    // it: they never load programs, and it keeps cargo-fuzz's sanitizer and
    // coverage flags away from the nested BPF build. An agent built this way
    // fails at load time with aya's parse error on the empty object.
    let skipped = std::env::var_os("AYA_BUILD_SKIP")
        .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skipped {
        let out =
            std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        std::fs::write(out.join("weir-ebpf"), [])?;
    }
    Ok(())
}
