//! Builds the kernel programs in `ebpf/programs` for the BPF target with the
//! nightly toolchain (aya-build), so `cargo build` yields an agent with its
//! datapath embedded.
//!
//! aya-build echoes every line of the nested build as `cargo:warning=`, and
//! cargo replays a build script's warnings on every later build, so each
//! build would open with dozens of "warnings" when nothing is wrong. The
//! nested build's output is therefore captured and shown only when it fails,
//! or always with `WEIR_EBPF_VERBOSE=1`. Cargo's other directives
//! (`rerun-if-changed`, …) are passed on unchanged.
use std::{
    fs::File,
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    os::fd::AsRawFd as _,
};

const VERBOSE: &str = "WEIR_EBPF_VERBOSE";

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed={VERBOSE}");
    let verbose = std::env::var_os(VERBOSE).is_some_and(|v| v == "1" || v == "true");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let (result, printed) = capture_stdout(&out.join("aya-build.log"), build_ebpf)?;
    let failed = result.is_err();
    for line in printed.lines() {
        match line.strip_prefix("cargo:warning=") {
            Some(_) if !(failed || verbose) => {}
            _ => println!("{line}"),
        }
    }
    result?;
    // aya-build's own `AYA_BUILD_SKIP=1` returns before writing the object,
    // and `include_bytes_aligned!` needs a file. The fuzz targets (fuzz/) set
    // it: they never load programs, and it keeps cargo-fuzz's sanitizer and
    // coverage flags away from the nested BPF build. An agent built this way
    // fails at load time with aya's parse error on the empty object.
    let skipped = std::env::var_os("AYA_BUILD_SKIP")
        .is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    if skipped {
        std::fs::write(out.join("weir-ebpf"), [])?;
    }
    Ok(())
}

fn build_ebpf() -> anyhow::Result<()> {
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

/// Runs `f` with this process's stdout (fd 1, which cargo reads directives
/// from) pointed at `log`, and returns what was written there. aya-build
/// prints from this thread and from one it joins before returning, so
/// nothing else writes meanwhile.
fn capture_stdout<T>(log: &std::path::Path, f: impl FnOnce() -> T) -> std::io::Result<(T, String)> {
    let mut file = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(log)?;
    std::io::stdout().flush()?;
    // SAFETY: dup and dup2 on descriptors this process owns; fd 1 is
    // restored below before anything else prints.
    let saved = unsafe { libc::dup(1) };
    if saved < 0 || unsafe { libc::dup2(file.as_raw_fd(), 1) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let value = f();
    std::io::stdout().flush()?;
    // SAFETY: as above; `saved` is closed once restored.
    let restored = unsafe { libc::dup2(saved, 1) };
    unsafe { libc::close(saved) };
    if restored < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut printed = String::new();
    file.seek(SeekFrom::Start(0))?;
    file.read_to_string(&mut printed)?;
    Ok((value, printed))
}
