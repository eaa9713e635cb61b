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
    )
}
