//! The Linux backend: one nftables table, `inet agenshield`, rendered as text by a pure
//! function and applied atomically with `nft -f -`.
//!
//! Mechanics (verified on the kernels we test on): redirection happens in a `nat` chain on the
//! `output` hook at priority -100 (locally generated packets never traverse prerouting), the
//! agent is matched positively with `meta skuid` (packets without a socket never match it),
//! and the filter chain accepts what was redirected with `ct status dnat`.

use std::fmt::Write as _;
use std::net::IpAddr;

use crate::redirect::RedirectSpec;

pub const FAMILY: &str = "inet";
pub const TABLE: &str = "agenshield";

/// The ruleset for `spec`, as `nft -f` reads it. Pure: golden-tested.
pub fn render(spec: &RedirectSpec) -> String {
    let mut s = String::new();
    let uids: Vec<String> = spec.agent_uids.iter().map(u32::to_string).collect();
    let agent = "meta skuid @agent_uids";
    let (v4, v6): (Vec<_>, Vec<_>) = spec.exempt.iter().partition(|(ip, _)| ip.is_ipv4());
    let _ = writeln!(s, "table {FAMILY} {TABLE} {{");
    let _ = writeln!(
        s,
        "\tset agent_uids {{\n\t\ttype uid\n\t\telements = {{ {} }}\n\t}}\n",
        uids.join(", ")
    );

    let (pass4, pass6): (Vec<IpAddr>, Vec<IpAddr>) =
        spec.dns_passthrough.iter().partition(|ip| ip.is_ipv4());
    let _ = writeln!(s, "\tchain nat_output {{");
    let _ = writeln!(s, "\t\ttype nat hook output priority -100; policy accept;");
    passthrough_rules(&mut s, agent, &pass4, &pass6);
    // All other DNS, to any address (exempt ranges included), ends at the stub.
    for (family, port) in [("ipv4", spec.dns_v4), ("ipv6", spec.dns_v6)] {
        if let Some(port) = port {
            for proto in ["udp", "tcp"] {
                let _ = writeln!(
                    s,
                    "\t\t{agent} meta nfproto {family} {proto} dport 53 redirect to :{port}"
                );
            }
        }
    }
    exempt_rules(&mut s, agent, &v4, &v6);
    for (family, port) in [("ipv4", spec.redirect_v4), ("ipv6", spec.redirect_v6)] {
        if let Some(port) = port {
            let _ = writeln!(
                s,
                "\t\t{agent} meta nfproto {family} meta l4proto tcp redirect to :{port}"
            );
        }
    }
    let _ = writeln!(s, "\t}}\n");

    let _ = writeln!(s, "\tchain filter_output {{");
    let _ = writeln!(s, "\t\ttype filter hook output priority 0; policy accept;");
    // Only what our own redirect produced: another tool's DNAT (Docker, kube-proxy) must
    // not become a way around the proxy.
    for (family, addr, port, protos) in [
        ("ip", "127.0.0.1", spec.redirect_v4, &["tcp"][..]),
        ("ip6", "::1", spec.redirect_v6, &["tcp"][..]),
        ("ip", "127.0.0.1", spec.dns_v4, &["udp", "tcp"][..]),
        ("ip6", "::1", spec.dns_v6, &["udp", "tcp"][..]),
    ] {
        if let Some(port) = port {
            for proto in protos {
                let _ = writeln!(
                    s,
                    "\t\t{agent} ct status dnat {family} daddr {addr} {proto} dport {port} accept"
                );
            }
        }
    }
    passthrough_rules(&mut s, agent, &pass4, &pass6);
    exempt_rules(&mut s, agent, &v4, &v6);
    let _ = writeln!(
        s,
        "\t\t{agent} meta l4proto tcp counter reject with tcp reset"
    );
    let _ = writeln!(s, "\t\t{agent} counter reject with icmpx admin-prohibited");
    let _ = writeln!(s, "\t}}");
    let _ = writeln!(s, "}}");
    s
}

/// The operator's opt-out (`redirect.dns_passthrough`): DNS to these resolvers unchanged.
fn passthrough_rules(s: &mut String, agent: &str, v4: &[IpAddr], v6: &[IpAddr]) {
    for (family, servers) in [("ip", v4), ("ip6", v6)] {
        if servers.is_empty() {
            continue;
        }
        let list: Vec<String> = servers.iter().map(ToString::to_string).collect();
        for proto in ["udp", "tcp"] {
            let _ = writeln!(
                s,
                "\t\t{agent} {family} daddr {{ {} }} {proto} dport 53 accept",
                list.join(", ")
            );
        }
    }
}

fn exempt_rules(s: &mut String, agent: &str, v4: &[&(IpAddr, u8)], v6: &[&(IpAddr, u8)]) {
    for (proto, nets) in [("ip", v4), ("ip6", v6)] {
        if nets.is_empty() {
            continue;
        }
        let list: Vec<String> = nets.iter().map(|(ip, p)| format!("{ip}/{p}")).collect();
        let _ = writeln!(
            s,
            "\t\t{agent} {proto} daddr {{ {} }} accept",
            list.join(", ")
        );
    }
}

/// The uids in an installed table's `agent_uids` set, read from `nft list` output.
pub fn installed_uids(listing: &str) -> Vec<u32> {
    let Some(start) = listing.find("set agent_uids") else {
        return Vec::new();
    };
    let rest = &listing[start..];
    let Some(open) = rest.find("elements = {") else {
        return Vec::new();
    };
    let after = &rest[open + "elements = {".len()..];
    let body = after.split('}').next().unwrap_or("");
    body.split(',')
        .filter_map(|e| e.trim().parse().ok())
        .collect()
}

#[cfg(target_os = "linux")]
pub use backend::Nftables;

#[cfg(target_os = "linux")]
mod backend {
    use std::sync::Mutex;

    use super::{installed_uids, render, FAMILY, TABLE};
    use crate::redirect::{FirewallState, FirewallStatus, RedirectError, RedirectSpec, Redirector};

    /// Drives the `nft` command. Needs CAP_NET_ADMIN (root).
    #[derive(Debug, Default)]
    pub struct Nftables {
        nft: String,
        /// nft's listing of the last spec asked about: the reconcile loop asks about the same
        /// spec every few seconds, and deriving it costs a namespace and two nft runs.
        expected: Mutex<Option<(RedirectSpec, String)>>,
    }

    impl Nftables {
        pub fn new() -> Nftables {
            Nftables {
                nft: std::env::var("AGENSHIELD_NFT").unwrap_or_else(|_| "nft".into()),
                expected: Mutex::new(None),
            }
        }

        fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String, RedirectError> {
            run(&self.nft, args, stdin)
        }

        /// The live table as `nft -s list` prints it, or `None` when it does not exist.
        pub fn live(&self) -> Result<Option<String>, RedirectError> {
            match self.run(&["-s", "list", "table", FAMILY, TABLE], None) {
                Ok(out) => Ok(Some(out)),
                Err(RedirectError::Command { stderr, .. })
                    if stderr.contains("No such file or directory") =>
                {
                    Ok(None)
                }
                Err(e) => Err(e),
            }
        }

        /// How nft itself lists the rendered ruleset: loaded into a throwaway network
        /// namespace, so comparing with the live table needs no parser of ours.
        pub fn expected(&self, spec: &RedirectSpec) -> Result<String, RedirectError> {
            if let Ok(cache) = self.expected.lock() {
                if let Some((_, listing)) = cache.as_ref().filter(|(c, _)| c == spec) {
                    return Ok(listing.clone());
                }
            }
            let listing = self.derive_expected(spec)?;
            if let Ok(mut cache) = self.expected.lock() {
                *cache = Some((spec.clone(), listing.clone()));
            }
            Ok(listing)
        }

        fn derive_expected(&self, spec: &RedirectSpec) -> Result<String, RedirectError> {
            let script = format!(
                "{nft} -f - && {nft} -s list table {FAMILY} {TABLE}",
                nft = self.nft
            );
            run(
                "unshare",
                &["--net", "--", "sh", "-c", &script],
                Some(&render(spec)),
            )
        }
    }

    impl Redirector for Nftables {
        fn apply(&self, spec: &RedirectSpec) -> Result<(), RedirectError> {
            // Create-then-delete-then-define in one transaction: atomic, and never two tables.
            let script = format!(
                "table {FAMILY} {TABLE}\ndelete table {FAMILY} {TABLE}\n{}",
                render(spec)
            );
            self.run(&["-f", "-"], Some(&script)).map(|_| ())
        }

        fn remove(&self) -> Result<bool, RedirectError> {
            if self.live()?.is_none() {
                return Ok(false);
            }
            self.run(&["delete", "table", FAMILY, TABLE], None)?;
            Ok(true)
        }

        fn status(&self, spec: &RedirectSpec) -> Result<FirewallStatus, RedirectError> {
            // Absence is decided without `unshare`, so a host that forbids namespaces can
            // still have a vanished table restored.
            let Some(live) = self.live()? else {
                return Ok(FirewallStatus {
                    state: FirewallState::Absent,
                    installed_uids: Vec::new(),
                    installed: String::new(),
                    expected: render(spec),
                });
            };
            let expected = self.expected(spec)?;
            let (state, installed) = if live == expected {
                (FirewallState::Matches, live)
            } else {
                (FirewallState::Differs, live)
            };
            Ok(FirewallStatus {
                state,
                installed_uids: installed_uids(&installed),
                installed,
                expected,
            })
        }

        fn describe(&self) -> String {
            format!("nftables table {FAMILY} {TABLE}")
        }
    }

    /// What `program` printed on stdout (see `crate::command::run`).
    fn run(program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, RedirectError> {
        crate::command::run(program, args, stdin).map(|o| o.stdout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> RedirectSpec {
        RedirectSpec {
            agent_uids: vec![5200, 5202],
            redirect_v4: Some(15001),
            redirect_v6: Some(15001),
            dns_v4: Some(15053),
            dns_v6: Some(15053),
            dns_passthrough: Vec::new(),
            exempt: vec![
                ("10.99.0.0".parse().expect("ip"), 24),
                ("fd00:99::".parse().expect("ip"), 64),
            ],
        }
    }

    /// `UPDATE_GOLDEN=1` rewrites the file; review the diff before committing it.
    fn check_golden(name: &str, spec: &RedirectSpec) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("golden")
            .join(name);
        let got = render(spec);
        if std::env::var_os("UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &got).expect("write golden");
        }
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{} ({e}; UPDATE_GOLDEN=1 writes it)", path.display()));
        assert_eq!(got, want, "the nftables table for {name} changed");
    }

    #[test]
    fn ruleset_matches_golden_file() {
        check_golden("nftables-default.nft", &spec());
    }

    /// The operator's opt-out: DNS to the named resolvers passes, all other DNS still
    /// ends at the stub.
    #[test]
    fn dns_passthrough_matches_golden_file() {
        let mut s = spec();
        s.dns_passthrough = vec![
            "127.0.0.53".parse().expect("ip"),
            "fd00::53".parse().expect("ip"),
        ];
        check_golden("nftables-dns-passthrough.nft", &s);
    }

    #[test]
    fn missing_v6_listener_rejects_instead_of_redirecting() {
        let mut s = spec();
        s.redirect_v6 = None;
        s.exempt.clear();
        s.dns_v6 = None;
        let r = render(&s);
        assert!(r.contains("nfproto ipv4 meta l4proto tcp redirect to :15001"));
        assert!(!r.contains("nfproto ipv6"));
        assert!(!r.contains("ip6 daddr ::1"));
        assert!(r.contains("meta nfproto ipv4 udp dport 53 redirect to :15053"));
        assert!(!r.contains("meta nfproto ipv6 udp dport 53"));
        assert!(r.contains("meta l4proto tcp counter reject with tcp reset"));
    }

    #[test]
    fn uids_are_read_back_from_a_listing() {
        assert_eq!(installed_uids(&render(&spec())), vec![5200, 5202]);
        assert!(installed_uids("table inet agenshield {\n}").is_empty());
    }
}
