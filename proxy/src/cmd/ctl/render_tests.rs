//! Human output through `render_safely`, as `print` and `tail` show it: whatever the daemon
//! sends, nothing a terminal acts on or reorders by reaches it raw, and a field stays on its
//! line.

use serde_json::{json, Value};

use super::*;
use crate::cmd::ctl::escape::render_safely;

/// What an attacker would put in a path, a host, a name or an error: a bidi override,
/// CSI by ESC and by C1, an OSC title change, a line break and an isolate.
const EVIL: &str = "\u{202e}gpj.exe\x1b[2J\u{9b}31m\x1b]0;owned\x07\nFAKE LINE\u{2066}";
const EVIL_SHOWN: &str = "\\u{202e}gpj.exe\\x1b[2J\\x9b31m\\x1b]0;owned\\x07\\nFAKE LINE\\u{2066}";

fn assert_inert(out: &str) {
    for c in out.chars() {
        let raw = c != '\n'
            && (c.is_control()
                || matches!(
                    unicode_general_category::get_general_category(c),
                    unicode_general_category::GeneralCategory::Format
                ));
        assert!(!raw, "raw {:?} in {out:?}", c);
    }
    assert!(!out.lines().any(|l| l.starts_with("FAKE LINE")), "{out}");
}

#[test]
fn tail_escapes_path_host_sni_rule_and_agent_fields() {
    let request = json!({
        "kind": "request", "started": "2026-01-02T03:04:05.678Z", "protocol": "https",
        "host": format!("api{EVIL}.test"), "port": 443, "method": "GET",
        "path": format!("/files/{EVIL}"), "status": 403, "decision": "deny",
        "rule": format!("rule{EVIL}"), "error_code": "policy_denied",
        "secrets": [format!("tok{EVIL}")], "agent_uid": 5200,
    });
    let out = render_safely(&request, event);
    assert_inert(&out);
    assert!(out.contains(&format!("/files/{EVIL_SHOWN}")), "{out}");
    assert!(out.contains(&format!("rule=rule{EVIL_SHOWN}")), "{out}");
    assert!(out.contains("agent=5200"), "{out}");
    assert_eq!(out.lines().count(), 1, "{out}");

    let tls = json!({
        "kind": "connection", "started": "2026-01-02T03:04:05.678Z", "protocol": "https",
        "host": "10.0.0.1", "port": 443, "decision": "deny",
        "error_code": "client_rejected_ca", "sni": format!("x{EVIL}"),
    });
    let out = render_safely(&tls, event);
    assert_inert(&out);
    assert!(out.contains(&format!("x{EVIL_SHOWN}")), "{out}");
}

#[test]
fn pending_list_shows_agent_method_and_path_escaped() {
    let v = json!([
        {"id": "p1", "since": "2026-01-02T03:04:05Z", "expires": "2026-01-02T03:06:05Z",
         "agent_uid": 5200, "client": "127.0.0.1:5",
         "method": "POST", "host": "api.test", "port": 443, "path": "/repos/x", "rule_id": "ask"},
        {"id": "p2", "since": "2026-01-02T03:04:06Z", "agent_uid": null, "client": "127.0.0.1:6",
         "method": "GET", "host": "api.test", "port": 443, "path": format!("/{EVIL}"),
         "rule_id": "ask"},
    ]);
    let out = render_safely(&v, pending);
    assert_inert(&out);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    let cols = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(
        cols(lines[0]),
        [
            "ID",
            "SINCE",
            "EXPIRES",
            "AGENT",
            "METHOD",
            "DESTINATION",
            "RULE"
        ]
    );
    assert_eq!(
        cols(lines[1]),
        [
            "p1",
            "2026-01-02T03:04:05",
            "2026-01-02T03:06:05",
            "5200",
            "POST",
            "api.test:443/repos/x",
            "ask"
        ]
    );
    assert!(lines[2].starts_with("p2"), "{out}");
    assert_eq!(cols(lines[2])[3], "-", "no uid is shown as -: {out}");
    // Columns line up whatever their contents.
    let at = |l: &str, col: &str| l.find(col).expect("column");
    assert_eq!(at(lines[0], "METHOD"), at(lines[1], "POST"), "{out}");
    assert_eq!(at(lines[0], "METHOD"), at(lines[2], "GET"), "{out}");
    assert!(lines[3].contains("pending approve ID"), "{out}");
    assert!(
        lines[2].contains(&format!("api.test:443/{EVIL_SHOWN}")),
        "{out}"
    );
}

#[test]
fn secrets_list_escapes_names_sources_and_stored_fetch_errors() {
    let v = json!({
        "store": { "kind": "file", "path": format!("/vault{EVIL}") },
        "secrets": [{
            "name": "api", "kind": "command", "rules": [format!("r{EVIL}")],
            "updated": "2026-01-02T03:04:05Z", "uses": 1,
            "source": format!("/usr/bin/fetch{EVIL}"),
            "error": format!("exit 1: {EVIL}"),
        }],
    });
    let out = render_safely(&v, secrets);
    assert_inert(&out);
    assert!(
        out.contains(&format!("api: the last fetch failed: exit 1: {EVIL_SHOWN}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("fetched from /usr/bin/fetch{EVIL_SHOWN}")),
        "{out}"
    );
    assert!(
        out.contains(&format!("store: file vault /vault{EVIL_SHOWN}")),
        "{out}"
    );
}

#[test]
fn status_policy_and_check_escape_daemon_text() {
    let status_v = json!({
        "version": "1", "pid": 1, "uptime_secs": 5,
        "policy": {"hash": "h", "rules": 1, "mode": "enforce", "dir": format!("/p{EVIL}"),
                   "loaded_at": "t", "last_error": {"at": "t", "message": EVIL},
                   "watch": {"active": false, "error": EVIL}},
        "listeners": {"transparent": [], "explicit": "e", "admin": "a"},
        "firewall": {"enabled": false}, "ca": {"path": "c", "sha256": "s"},
        "audit": {"path": "a", "seq": 1, "hash": "h", "problem": EVIL},
        "counts": {}, "tunnels": 0, "pending": 0,
    });
    let policy_v = json!({
        "dir": "/p", "hash": "h", "rules": 1, "mode": "enforce", "loaded_at": "t",
        "rule_list": [{"id": format!("r{EVIL}"), "action": "allow", "priority": 0,
                       "summary": EVIL}],
    });
    let check_v = json!({
        "method": "GET", "scheme": "https", "host": "h", "port": 443, "path": format!("/{EVIL}"),
        "decision": "deny", "rule_id": EVIL, "explanation": EVIL, "policy_hash": "h",
        "obligations": {"rate": EVIL},
    });
    for (v, render) in [
        (status_v, status as fn(&Value) -> String),
        (policy_v, policy),
        (check_v, check),
    ] {
        let out = render_safely(&v, render);
        assert_inert(&out);
        assert!(out.contains(EVIL_SHOWN), "{out}");
    }
}

#[test]
fn policy_show_columns_line_up_whatever_the_rule_ids() {
    let v = json!({
        "dir": "/p", "hash": "h", "rules": 2, "mode": "enforce", "loaded_at": "t",
        "rule_list": [
            {"id": "a-rule-id-much-longer-than-twenty-eight-characters", "action": "allow",
             "priority": 1000000, "summary": "hosts a.test"},
            {"id": "x", "action": "ask", "priority": -5, "summary": "hosts b.test"},
        ],
    });
    let out = policy(&v);
    let rows: Vec<&str> = out.lines().skip_while(|l| !l.starts_with("RULE")).collect();
    assert_eq!(rows.len(), 3, "{out}");
    let at = |l: &str, s: &str| l.find(s).unwrap_or_else(|| panic!("{s} in {l}"));
    assert_eq!(at(rows[0], "MATCHES"), at(rows[1], "hosts a.test"), "{out}");
    assert_eq!(at(rows[0], "MATCHES"), at(rows[2], "hosts b.test"), "{out}");
    assert_eq!(at(rows[0], "ACTION"), at(rows[2], "ask"), "{out}");
}

#[test]
fn dns_lines_name_the_agent_and_a_close_is_placed_when_it_ended() {
    let q = json!({
        "kind": "query", "started": "2026-01-02T03:04:05.678Z", "protocol": "dns",
        "host": "x.test", "port": 53, "decision": "deny", "rule": "default",
        "error_code": "policy_denied", "agent_uid": 5200,
        "dns": {"qtype": "A", "rcode": "NOERROR", "answers": ["198.18.0.1"]},
    });
    let out = event(&q);
    assert!(out.starts_with("03:04:05.678 "), "{out}");
    assert!(out.contains("agent=5200"), "{out}");
    let close = json!({
        "kind": "close", "started": "2026-01-02T03:04:05.678Z", "protocol": "tcp",
        "host": "x.test", "port": 22, "decision": "allow", "ms": 61_500.25, "end": "closed",
    });
    let out = event(&close);
    assert!(out.starts_with("03:05:07.178 "), "{out}");
    let rejected = json!({
        "kind": "connection", "started": "2026-01-02T03:04:05.678Z", "protocol": "tls",
        "host": "x.test", "port": 443, "decision": "error", "error_code": "client_rejected_ca",
    });
    let out = event(&rejected);
    assert!(out.contains("agenshield proxy doctor"), "{out}");
    assert!(!out.contains("README (Trust)"), "{out}");
}

#[test]
fn a_refusal_check_shows_its_hint_and_how_the_stub_answers() {
    let v = json!({
        "method": "DNS", "scheme": "dns", "host": "x.test", "port": 53, "path": "",
        "decision": "deny", "rule_id": "default", "explanation": "no rule could allow",
        "answer": "synthetic", "hint": "no rule covers x.test", "policy_hash": "h",
    });
    let out = check(&v);
    assert!(out.contains("a synthetic address"), "{out}");
    assert!(out.contains("hint          no rule covers x.test"), "{out}");
}

#[test]
fn plain_output_is_unchanged() {
    let v = json!([{"id": "p1", "since": "2026-01-02T03:04:05Z", "agent_uid": 5200,
        "method": "GET", "host": "café.test", "port": 443, "path": "/日本", "rule_id": "ask"}]);
    assert_eq!(render_safely(&v, pending), pending(&v));
}

#[test]
fn status_shows_each_export_sink_and_the_rate_store_and_what_they_lack() {
    let v = json!({
        "version": "1", "pid": 1, "uptime_secs": 5,
        "policy": {"hash": "h", "rules": 1, "mode": "enforce", "dir": "/p", "loaded_at": "t"},
        "listeners": {"transparent": [], "explicit": "e", "admin": "a"},
        "firewall": {"enabled": false}, "ca": {"path": "c", "sha256": "s"},
        "audit": {"path": "a", "seq": 90, "hash": "h", "export": [
            {"name": "siem", "url": "tls://relay.test:6514", "format": "ocsf", "shipped_seq": 90,
             "pending": 0, "connected": true, "down_since": null, "last_error": null},
            {"name": "backup", "url": "tcp://127.0.0.1:514", "format": "agenshield",
             "shipped_seq": 40, "pending": 50, "connected": false,
             "down_since": "2026-12-07T06:00:00.000Z",
             "last_error": {"reason": "connect", "at": "2026-12-07T06:00:01.000Z"}},
        ]},
        "ratelimit_store": {"store": "redis://127.0.0.1:6379/0", "on_store_error": "deny",
            "up": false, "connected": 1, "threads": 3, "down_since": "2026-12-07T06:00:02.000Z",
            "last_error": {"reason": "timeout", "message": "no answer in time",
                           "at": "2026-12-07T06:00:03.000Z"}},
        "counts": {}, "tunnels": 0, "pending": 0,
    });
    let out = render_safely(&v, status);
    assert!(
        out.contains(
            "audit export  siem tls://relay.test:6514 (ocsf)  shipped 90  pending 0  connected"
        ),
        "{out}"
    );
    assert!(
        out.contains("audit export  backup tcp://127.0.0.1:514 (agenshield)  shipped 40  pending 50  RECEIVER DOWN since 2026-12-07T06:00:00.000Z; records wait in the log  last failure connect at 2026-12-07T06:00:01.000Z"),
        "{out}"
    );
    assert!(
        out.contains("rate store    redis://127.0.0.1:6379/0  DOWN since 2026-12-07T06:00:02.000Z; fleet-limited requests are refused  on_store_error deny  last failure timeout at 2026-12-07T06:00:03.000Z: no answer in time"),
        "{out}"
    );
    // Without sinks or a store, no such lines.
    let mut bare = v.clone();
    bare["audit"]["export"] = json!([]);
    bare["ratelimit_store"] = json!(null);
    let out = render_safely(&bare, status);
    assert!(
        !out.contains("audit export") && !out.contains("rate store"),
        "{out}"
    );
}
