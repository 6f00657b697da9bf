//! Test support for AgenShield's end-to-end tests: a throwaway upstream PKI and
//! realistic upstream servers on loopback, so tests never touch the internet.

pub mod approvals;
pub mod audit;
pub mod aws;
pub mod bundle_server;
pub mod corp_proxy;
pub mod curl;
pub mod daemon;
pub mod dlp;
#[cfg(target_os = "linux")]
pub mod installation;
pub mod llm;
pub mod mcp;
#[cfg(target_os = "linux")]
pub mod netlab;
pub mod ocsf;
pub mod pki;
pub mod prometheus;
pub mod redis;
pub mod rsyslog;
pub mod upstream;
pub mod world;
