//! What install made for the agent, as doctor looks for it: the CA, the bundle, the trust
//! store and the environment file (under `paths.certs`), and whether PAM applies that file.

use std::path::PathBuf;

use crate::cmd::trust::AgentTrust;

/// The files install made for the agent, and what doctor knows of the agent's sessions.
#[derive(Debug, Clone)]
pub struct Installed {
    pub ca: PathBuf,
    pub bundle: PathBuf,
    pub truststore: PathBuf,
    pub env_file: PathBuf,
    /// Linux: whether our PAM profile is in the session stack (`None` where PAM is not how
    /// the agent's sessions get the variables).
    pub pam_enabled: Option<bool>,
}

impl Installed {
    /// What the agent is meant to trust (the variables and files install writes name these).
    pub fn trust(&self) -> AgentTrust<'_> {
        AgentTrust {
            bundle: &self.bundle,
            truststore: Some(&self.truststore),
        }
    }
}
