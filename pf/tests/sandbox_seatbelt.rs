//! The Seatbelt profiles, byte for byte: `UPDATE_GOLDEN=1` rewrites the golden files, which
//! are then reviewed like code. They are rendered for the installed layout (DESIGN.md paths).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use agenshield_pf::sandbox::seatbelt::{agent_profile, exec_profile, Protected, SeatbeltError};

fn installed() -> Protected {
    Protected {
        files: vec![
            PathBuf::from("/opt/agenshield/certs/ca-key.pem"),
            PathBuf::from("/opt/agenshield/config/proxy.toml"),
        ],
        dirs: vec![
            PathBuf::from("/opt/agenshield/vault"),
            PathBuf::from("/opt/agenshield/policies"),
        ],
        sockets: vec![PathBuf::from("/var/run/agenshield/proxy.sock")],
    }
}

fn golden(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{} ({e}); UPDATE_GOLDEN=1 writes it", path.display()));
    assert_eq!(
        got, want,
        "{name} changed: review the new profile and update the golden file on purpose"
    );
}

fn addrs(list: &[&str]) -> Vec<SocketAddr> {
    list.iter().map(|s| s.parse().expect("addr")).collect()
}

/// Every `(` has its `)`, outside string literals: a profile sandbox-exec can parse at all.
fn assert_balanced(profile: &str) {
    let mut depth = 0i32;
    let mut in_str = false;
    let mut escaped = false;
    for line in profile.lines() {
        for c in line.chars() {
            if in_str {
                match (escaped, c) {
                    (true, _) => escaped = false,
                    (false, '\\') => escaped = true,
                    (false, '"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match c {
                ';' => break,
                '"' => in_str = true,
                '(' => depth += 1,
                ')' => {
                    depth -= 1;
                    assert!(depth >= 0, "unbalanced ) in {line:?}");
                }
                _ => {}
            }
        }
        assert!(!in_str, "string literal runs past the line: {line:?}");
    }
    assert_eq!(depth, 0, "unbalanced parentheses");
}

#[test]
fn agent_profile_matches_golden() {
    let p = agent_profile(&installed(), &addrs(&["192.168.1.1:53", "127.0.0.1:15053"]))
        .expect("render");
    assert_balanced(&p);
    golden("seatbelt-agent.sb", &p);
    // Transparent mode must not touch TCP destinations: pf rewrites them after Seatbelt looks.
    assert!(!p.contains("remote tcp"), "{p}");
    assert!(!p.contains("(deny network-outbound)\n"), "{p}");
    assert!(p.contains("(deny network-outbound (remote udp))"));
}

#[test]
fn agent_profile_without_resolvers_allows_no_udp() {
    let p = agent_profile(&installed(), &[]).expect("render");
    assert_balanced(&p);
    assert!(p.contains("(deny network-outbound (remote udp))"));
    assert!(!p.contains("(allow network-outbound"), "{p}");
}

#[test]
fn exec_profile_matches_golden() {
    let p = exec_profile(&installed(), "127.0.0.1:15080".parse().expect("addr")).expect("render");
    assert_balanced(&p);
    golden("seatbelt-exec.sb", &p);
    // The one way out is the proxy; the denials come after the allow-everything default.
    let deny = p
        .find("(deny network-outbound)\n")
        .expect("deny all outbound");
    let allow = p
        .find("(allow network-outbound (remote tcp \"localhost:15080\"))")
        .expect("allow the proxy");
    assert!(p.find("(allow default)").expect("default") < deny && deny < allow);
    assert!(!p.contains("udp"), "no DNS for exec: {p}");
}

#[test]
fn exec_profile_for_a_non_loopback_listener_allows_its_port_on_any_host() {
    let p = exec_profile(&installed(), "10.1.2.3:3128".parse().expect("addr")).expect("render");
    assert_balanced(&p);
    assert!(p.contains("(allow network-outbound (remote tcp \"*:3128\"))"));
    assert!(p.contains("10.1.2.3, which SBPL cannot name"));
}

#[test]
fn protected_paths_are_denied_last_in_both_spellings() {
    let mut prot = installed();
    prot.dirs.push(PathBuf::from("/tmp/state \"quoted\"/vault"));
    for p in [
        agent_profile(&prot, &addrs(&["127.0.0.1:53"])).expect("agent"),
        exec_profile(&prot, "127.0.0.1:15080".parse().expect("addr")).expect("exec"),
    ] {
        assert_balanced(&p);
        let files = p
            .find("(deny file-read* file-write*")
            .expect("file denials");
        assert!(p.rfind("(allow ").expect("an allow") < files, "{p}");
        assert!(p.contains("(subpath \"/private/tmp/state \\\"quoted\\\"/vault\")"));
        assert!(p.contains("(literal \"/private/var/run/agenshield/proxy.sock\")"));
        assert!(p.contains(
            "(remote unix-socket (path-literal \"/private/var/run/agenshield/proxy.sock\"))"
        ));
    }
}

#[test]
fn bad_paths_are_refused() {
    let mut prot = installed();
    prot.files.push(PathBuf::from("relative/ca-key.pem"));
    assert!(matches!(
        exec_profile(&prot, "127.0.0.1:1".parse().expect("addr")),
        Err(SeatbeltError::NotAbsolute(_))
    ));
    let mut prot = installed();
    prot.sockets.push(PathBuf::from("/tmp/a\n(allow network*)"));
    assert!(matches!(
        agent_profile(&prot, &[]),
        Err(SeatbeltError::Unprintable(_))
    ));
}
