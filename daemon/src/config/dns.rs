//! `[dns]`: how the agent's DNS stub answers (its addresses are `listen.dns`).

use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    /// What a name no rule allows is answered with.
    pub denied: DeniedAnswer,
}

/// The answer for a name no rule allows. Neither asks a resolver: the name never leaves the
/// machine.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeniedAnswer {
    /// An address from the synthetic range that stands for the name (as for `ask` names):
    /// the connection that follows comes back through the redirect, and the agent gets the
    /// refusal that names the rule (a JSON 403 over HTTP), instead of a lookup failure that
    /// looks like a typo.
    #[default]
    Synthetic,
    /// NXDOMAIN, with an Extended DNS Error (RFC 8914, Blocked) naming the rule for clients
    /// that speak EDNS.
    Nxdomain,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn denied_names_get_a_synthetic_address_unless_nxdomain_is_asked_for() {
        let d: DnsConfig = toml::from_str("").expect("empty");
        assert_eq!(d.denied, DeniedAnswer::Synthetic);
        let d: DnsConfig = toml::from_str("denied = \"nxdomain\"").expect("nxdomain");
        assert_eq!(d.denied, DeniedAnswer::Nxdomain);
        let e = toml::from_str::<DnsConfig>("denied = \"refused\"")
            .expect_err("unknown value")
            .to_string();
        assert!(e.contains("synthetic") && e.contains("nxdomain"), "{e}");
        assert!(
            toml::from_str::<DnsConfig>("answer = 1").is_err(),
            "unknown key"
        );
    }
}
