//! The daemon's runtime topology, beneath the data path: the shards connections are served
//! on (`shards`: one single-threaded runtime per core) and the release of memory to the OS
//! after a burst (`memory_release`, whose park hook every runtime installs). Imports nothing
//! else from the crate, so `conn`, `upstream` and `daemon` all use it without an import
//! pointing up.

pub mod memory_release;
pub(crate) mod shards;
