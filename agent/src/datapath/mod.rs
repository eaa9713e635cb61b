//! Loading the kernel programs, pinning their maps and links, and taking over
//! from a previous agent without a moment in which connects go unhandled.
pub mod links;
pub mod loader;
pub mod pins;

pub use loader::{Datapath, LoadError, LoadOptions};
