//! weir-kubelet: a minimal kubelet on containerd's CRI. Not built yet; this crate
//! only reserves its place in the workspace.
fn main() {
    eprintln!("weir-kubelet is not implemented yet");
    std::process::exit(2);
}
