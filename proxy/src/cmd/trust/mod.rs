//! Making an agent's tools trust our CA: a PEM bundle (the machine's roots, bundles the
//! machine already configures, ours), a JVM trust store made from it, the variables every
//! runtime reads them from, the files that carry those variables into each way the agent's
//! processes start, and the machine's own store for `install --trust-system-store`. Used by
//! `install` (the agent user), `exec` (one command) and `doctor` (checking it).

pub mod bundle;
pub mod files;
pub mod runtimes;
pub mod settings;
pub mod system_store;
pub mod truststore;
pub mod vars;

pub use runtimes::CA_FILE_VARS;
pub use vars::AgentTrust;
