//! The desired redirect state, and the verbs every firewall backend has (after mullvad's
//! talpid-core): apply a spec, remove what we own, report what is in place.

use std::net::IpAddr;

/// Everything a backend needs to redirect the agent users' traffic into the proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedirectSpec {
    /// Agent uids whose TCP is redirected and whose other traffic is refused. Never empty.
    pub agent_uids: Vec<u32>,
    /// The transparent listener's port on 127.0.0.1; `None` refuses agent IPv4 TCP instead.
    pub redirect_v4: Option<u16>,
    /// The transparent listener's port on ::1; `None` refuses agent IPv6 TCP instead.
    pub redirect_v6: Option<u16>,
    /// The DNS stub's port on 127.0.0.1: agent DNS (udp and tcp 53, to any IPv4 address) is
    /// redirected there. `None`: agent IPv4 UDP 53 is refused and TCP 53 goes to the proxy.
    pub dns_v4: Option<u16>,
    /// The DNS stub's port on ::1, for agent DNS to any IPv6 address.
    pub dns_v6: Option<u16>,
    /// The operator's opt-out: agent DNS to these resolvers passes unchanged, around the stub
    /// (and around policy). Empty, as it should be, unless `redirect.dns_passthrough` is set.
    pub dns_passthrough: Vec<IpAddr>,
    /// Destinations the agent may reach directly, unredirected: (network address, prefix).
    pub exempt: Vec<(IpAddr, u8)>,
}

impl RedirectSpec {
    /// Sorted, deduplicated uids; `Err` when the spec could not protect anything.
    pub fn normalized(mut self) -> Result<RedirectSpec, RedirectError> {
        self.agent_uids.sort_unstable();
        self.agent_uids.dedup();
        self.dns_passthrough.sort_unstable();
        self.dns_passthrough.dedup();
        if self.agent_uids.is_empty() {
            return Err(RedirectError::Invalid("no agent uid to redirect".into()));
        }
        for (ip, prefix) in &self.exempt {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            if *prefix > max {
                return Err(RedirectError::Invalid(format!(
                    "exempt range {ip}/{prefix}: prefix longer than {max}"
                )));
            }
        }
        Ok(self)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RedirectError {
    #[error("invalid redirect configuration: {0}")]
    Invalid(String),
    #[error("running {command}: {source}")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{command} failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("firewall redirection is not available on this platform yet")]
    Unsupported,
}

/// What is in place now, compared with what a spec would install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FirewallState {
    /// Our table/anchor is not there.
    Absent,
    /// In place and identical to what the spec renders.
    Matches,
    /// In place but different (edited by hand, or rendered from another config).
    Differs,
}

#[derive(Debug, Clone)]
pub struct FirewallStatus {
    pub state: FirewallState,
    /// The agent uids the installed rules cover (empty when absent).
    pub installed_uids: Vec<u32>,
    /// The installed rules as the firewall lists them (empty when absent).
    pub installed: String,
    /// What the spec renders, as the firewall would list it.
    pub expected: String,
}

/// A firewall backend: nftables on Linux, pf on macOS.
pub trait Redirector: Send + Sync {
    /// Installs (or atomically replaces) the rules for `spec`. Idempotent.
    fn apply(&self, spec: &RedirectSpec) -> Result<(), RedirectError>;
    /// Removes only what we own. `Ok(false)` when there was nothing to remove.
    fn remove(&self) -> Result<bool, RedirectError>;
    /// What is in place, compared with `spec`.
    fn status(&self, spec: &RedirectSpec) -> Result<FirewallStatus, RedirectError>;
    /// Human name of what we own, e.g. "nftables table inet agenshield".
    fn describe(&self) -> String;
}

/// The backend for the platform we run on.
pub fn platform_redirector() -> Box<dyn Redirector> {
    #[cfg(target_os = "linux")]
    {
        Box::new(crate::nft::Nftables::new())
    }
    #[cfg(target_os = "macos")]
    {
        Box::new(crate::pf::PfRedirector::new())
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    {
        Box::new(Unsupported)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
struct Unsupported;

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
impl Redirector for Unsupported {
    fn apply(&self, _spec: &RedirectSpec) -> Result<(), RedirectError> {
        Err(RedirectError::Unsupported)
    }
    fn remove(&self) -> Result<bool, RedirectError> {
        Err(RedirectError::Unsupported)
    }
    fn status(&self, _spec: &RedirectSpec) -> Result<FirewallStatus, RedirectError> {
        Err(RedirectError::Unsupported)
    }
    fn describe(&self) -> String {
        "no firewall backend".into()
    }
}
