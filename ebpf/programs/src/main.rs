//! Weir's kernel programs.
//!
//! Built for `bpfel-unknown-none` by `agent/build.rs` (aya-build) and embedded in
//! `weir-agent`. On the host this is an empty binary so that `cargo clippy
//! --workspace` still type-checks the programs.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]

mod maps;
mod packet;
mod pick;
mod sock;
mod xdp;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any program that could reach this, so it never runs.
    loop {}
}

#[cfg(not(target_arch = "bpf"))]
fn main() {}
