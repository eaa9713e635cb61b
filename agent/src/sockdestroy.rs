//! Destroys connected UDP sockets pinned to removed backends.
//! (Stub interface; the node-runtime work fills it in.)
use std::net::SocketAddr;

#[derive(Debug, Default)]
pub struct SocketReaper {}

impl SocketReaper {
    /// UDP backends a sync just removed; never blocks.
    pub fn backends_removed(&self, _gone: Vec<SocketAddr>) {}
}
