//! Golden files of the pf anchor (`com.apple/agenshield`) for the specs that matter, and
//! the properties every render must have. `UPDATE_GOLDEN=1` rewrites the files; review the
//! diff before committing it.

use std::net::IpAddr;
use std::path::Path;

use agenshield_pf::pf::anchor::{self, label, render, Live, Verdict, ANCHOR};
use agenshield_pf::RedirectSpec;

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

/// The daemon's default: agent uid 5200, listeners 127.0.0.1:15001 and [::1]:15001, all
/// agent DNS into the stub on 127.0.0.1:15053 and [::1]:15053.
fn default_spec() -> RedirectSpec {
    RedirectSpec {
        agent_uids: vec![5200],
        redirect_v4: Some(15001),
        redirect_v6: Some(15001),
        dns_v4: Some(15053),
        dns_v6: Some(15053),
        dns_passthrough: Vec::new(),
        exempt: Vec::new(),
    }
}

fn multi_uid_exempt_spec() -> RedirectSpec {
    RedirectSpec {
        agent_uids: vec![5200, 5202],
        redirect_v4: Some(15001),
        redirect_v6: Some(15001),
        dns_v4: Some(15053),
        dns_v6: Some(15053),
        dns_passthrough: vec![ip("127.0.0.1"), ip("fd00::53")],
        exempt: vec![(ip("10.99.0.0"), 24), (ip("fd00:99::"), 64)],
    }
}

fn v4_only_spec() -> RedirectSpec {
    RedirectSpec {
        agent_uids: vec![5200],
        redirect_v4: Some(15001),
        redirect_v6: None,
        dns_v4: Some(15053),
        dns_v6: None,
        dns_passthrough: Vec::new(),
        exempt: Vec::new(),
    }
}

/// No stub listener (`listen.dns = []`): agent UDP 53 is refused, TCP 53 goes to the proxy
/// like any TCP.
fn no_dns_spec() -> RedirectSpec {
    RedirectSpec {
        dns_v4: None,
        dns_v6: None,
        ..default_spec()
    }
}

/// The operator's opt-out: DNS to one resolver passes around the stub.
fn passthrough_spec() -> RedirectSpec {
    RedirectSpec {
        dns_passthrough: vec![ip("192.168.1.1")],
        ..default_spec()
    }
}

fn check_golden(name: &str, spec: &RedirectSpec) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    let got = render(spec);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} ({e}; UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        got, want,
        "the pf anchor for {name} changed: update the golden file on purpose"
    );
}

#[test]
fn golden_default() {
    check_golden("pf-default.conf", &default_spec());
}

#[test]
fn golden_multiple_uids_and_exempt_ranges() {
    check_golden("pf-multi-uid-exempt.conf", &multi_uid_exempt_spec());
}

#[test]
fn golden_v4_only() {
    check_golden("pf-v4-only.conf", &v4_only_spec());
}

#[test]
fn golden_no_dns() {
    check_golden("pf-no-dns.conf", &no_dns_spec());
}

#[test]
fn golden_dns_passthrough() {
    check_golden("pf-dns-passthrough.conf", &passthrough_spec());
}

fn rules(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Every spec: filter rules only ever match the agent uids, translation only on lo0, pf.conf
/// order (tables, translation, filtering), and the refusals come last for each uid.
#[test]
fn every_render_touches_only_the_agent() {
    for spec in [
        default_spec(),
        multi_uid_exempt_spec(),
        v4_only_spec(),
        no_dns_spec(),
        passthrough_spec(),
    ] {
        let text = render(&spec);
        let lines = rules(&text);
        let mut stage = 0;
        for line in &lines {
            let this = if line.starts_with("table ") {
                0
            } else if line.contains("rdr ") {
                1
            } else {
                2
            };
            assert!(this >= stage, "out of pf.conf order: {line}\n{text}");
            stage = this;
            if this == 1 {
                assert!(line.contains(" on lo0 "), "translation off lo0: {line}");
            }
            if this == 2 {
                let user = spec
                    .agent_uids
                    .iter()
                    .any(|u| line.contains(&format!(" user = {u} ")));
                assert!(user, "filter rule for someone else: {line}");
                assert!(
                    line.starts_with("pass out quick ")
                        || line.starts_with("block return out quick ")
                );
                assert!(
                    line.ends_with(&format!("label \"{}\"", label(&spec))),
                    "{line}"
                );
            }
        }
        for uid in &spec.agent_uids {
            let mine: Vec<&&str> = lines
                .iter()
                .filter(|l| l.contains(&format!(" user = {uid} ")))
                .collect();
            let n = mine.len();
            assert!(n >= 2, "{text}");
            assert!(mine[n - 2].starts_with("block return out quick proto tcp "));
            assert!(mine[n - 1].starts_with("block return out quick proto udp "));
            assert!(
                mine[..n - 2].iter().all(|l| l.starts_with("pass ")),
                "a refusal before a pass: {text}"
            );
        }
        // No negated lists anywhere (pf expands them into rules that match everything).
        assert!(!text.contains("! {"), "{text}");
    }
}

#[test]
fn a_missing_listener_refuses_instead_of_redirecting() {
    let text = render(&v4_only_spec());
    assert!(text.contains("-> 127.0.0.1 port 15001"));
    assert!(!text.contains("inet6"), "{text}");
    assert!(!text.contains("::1"), "{text}");
    assert!(text.contains("block return out quick proto tcp from any to any user = 5200"));

    let mut none = v4_only_spec();
    none.redirect_v4 = None;
    none.dns_v4 = None;
    let text = render(&none);
    assert!(!text.contains("rdr"), "{text}");
    assert!(!text.contains("route-to"), "{text}");
    assert!(text.contains("block return out quick proto tcp from any to any user = 5200"));
}

#[test]
fn all_agent_dns_goes_to_the_stub() {
    let text = render(&default_spec());
    for (af, target) in [("inet", "127.0.0.1"), ("inet6", "::1")] {
        for proto in ["udp", "tcp"] {
            assert!(
                text.contains(&format!(
                    "rdr pass on lo0 {af} proto {proto} from any to any port 53 -> {target} port 15053"
                )),
                "{text}"
            );
            assert!(
                text.contains(&format!(
                    "pass out quick on ! lo0 route-to (lo0 {target}) {af} proto {proto} from any to any port 53 user = 5200"
                )),
                "{text}"
            );
        }
    }
    // Other users' DNS to the host's own resolvers is never translated.
    assert!(text.contains("no rdr on lo0 inet proto udp from any to 127.0.0.0/8"));
    assert!(!text.contains("agenshield_dns_passthrough"), "{text}");
    // The stub's rdr comes before the catch-all TCP rdr (pf: first match wins).
    let dns = text.find("port 53 -> 127.0.0.1").expect("dns rdr");
    let tcp = text
        .find("from any to any -> 127.0.0.1 port 15001")
        .expect("tcp rdr");
    assert!(dns < tcp, "{text}");

    let text = render(&no_dns_spec());
    assert!(!text.contains("port 53"), "{text}");

    let text = render(&passthrough_spec());
    assert!(text.contains("table <agenshield_dns_passthrough> const { 192.168.1.1 }"));
    assert!(text.contains(
        "pass out quick proto udp from any to <agenshield_dns_passthrough> port 53 user = 5200"
    ));
}

/// What `status` decides when the anchor was wiped by another tool's `pfctl -f
/// /etc/pf.conf` (stock hooks back, our anchor empty): Absent, so reconcile re-applies.
#[test]
fn wiped_anchor_reads_as_absent() {
    let stock_filter =
        "scrub-anchor \"com.apple/*\" all fragment reassemble\nanchor \"com.apple/*\" all\n";
    let stock_nat = "nat-anchor \"com.apple/*\" all\nrdr-anchor \"com.apple/*\" all\n";
    let live = Live {
        enabled: true,
        main_filter: stock_filter.into(),
        main_nat: stock_nat.into(),
        filter: String::new(),
        nat: String::new(),
        tables: vec![],
        host_addrs: vec![ip("127.0.0.1"), ip("::1")],
    };
    match anchor::compare(&default_spec(), &live) {
        Verdict::Absent(why) => assert!(why[0].contains(ANCHOR), "{why:?}"),
        other => panic!("expected Absent, got {other:?}"),
    }
}
