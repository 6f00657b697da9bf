//! Keys that were removed, and what a config that still has them gets: a warning where the
//! old value asked for nothing the new design does not give, a refusal that names the key to
//! use instead where it asked for more or less. Never a different meaning, silently.

use super::schema::Redirect;

const DNS_REMOVED: &str = "redirect.allow_dns and redirect.dns_servers were removed: the \
     agent's DNS now goes to the proxy's DNS stub (listen.dns), which answers only names some \
     rule could allow";

/// A removed key whose value the current design cannot honour.
#[derive(Debug, thiserror::Error)]
pub enum RemovedKey {
    #[error(
        "{removed}. redirect.allow_dns = false (no DNS for the agent) is now listen.dns = \
         []: set that and delete redirect.allow_dns",
        removed = DNS_REMOVED
    )]
    NoDnsForTheAgent,
    #[error(
        "{removed}. Delete redirect.dns_servers; to let the agent's DNS reach those \
         resolvers unchanged (around policy: a channel out of the machine) set \
         redirect.dns_passthrough = [\"IP\", …] instead",
        removed = DNS_REMOVED
    )]
    DnsServers,
}

/// The DNS pass-through's keys. Its shipped defaults (`allow_dns = true`,
/// `dns_servers = []`) are in every config installed before the stub: the stub is stricter,
/// so they only warn (the warnings returned). Anything that asked for more (named resolvers)
/// or less (no DNS) is refused.
pub(super) fn redirect_dns(r: &Redirect) -> Result<Vec<&'static str>, RemovedKey> {
    match (r.allow_dns, r.dns_servers.as_deref()) {
        (None, None) => Ok(Vec::new()),
        (None | Some(true), None | Some([])) => Ok(vec![
            "redirect.allow_dns / redirect.dns_servers (removed: delete them)",
        ]),
        (Some(false), _) => Err(RemovedKey::NoDnsForTheAgent),
        (_, Some(_)) => Err(RemovedKey::DnsServers),
    }
}
