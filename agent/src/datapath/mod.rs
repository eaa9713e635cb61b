//! Loading the kernel programs, pinning their maps and links, and taking over
//! from a previous agent without a moment in which traffic goes unhandled.
pub mod devices;
pub mod kernel;
mod legacy;
pub mod links;
pub mod loader;
pub mod lock;
pub mod netdev;
pub mod pins;
mod sock;

pub use devices::{Devices, Pattern};
pub use loader::{Datapath, LoadError, LoadOptions};
pub use netdev::Acceleration;
