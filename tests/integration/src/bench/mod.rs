//! `cargo xtask bench datapath`: Weir against kube-proxy's iptables and nftables
//! modes, programmed with the same Services. See README.md beside this file.
pub mod rules;
