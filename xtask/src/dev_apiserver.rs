//! `cargo xtask dev-apiserver`: the test API server as a standalone process, for
//! running the agent or kubectl against by hand. Runs it through cargo so xtask
//! does not link it.
use std::{net::SocketAddr, path::PathBuf, process::Command};

use anyhow::Result;

use crate::util;

#[derive(clap::Args)]
pub struct DevApiserver {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write the kubeconfig for clients.
    #[arg(long, default_value = "target/dev-apiserver/kubeconfig")]
    kubeconfig: PathBuf,
}

pub fn run(args: DevApiserver) -> Result<()> {
    // util::exec runs from the workspace root; keep the path the user meant.
    let kubeconfig = std::path::absolute(&args.kubeconfig)?;
    util::exec(
        Command::new(env!("CARGO"))
            .args(["run", "-p", "weir-test-apiserver", "--", "--listen"])
            .arg(args.listen.to_string())
            .arg("--kubeconfig")
            .arg(&kubeconfig),
    )
}
