//! `ctl policy suggest`: learn mode. Reads the audit log's refusals by policy and, under
//! `mode = "report"`, its would-be refusals, and drafts allow rules for them, one per host
//! (and one per raw TCP host): the schemes, ports and methods seen, paths generalised to
//! their first segment (`/repos/a/b` → `/repos/**`), each annotated with how often it was
//! seen. A DNS refusal counts for its host's rule; a host only looked up gets a rule for
//! HTTPS on 443, marked as assumed. What an explicit deny rule refused is never drafted
//! (allowing it would work against that rule): the draft names the rule instead. The draft
//! is checked by the policy loader before it is shown, and `--write` puts it only where it is
//! not loaded, so nothing is allowed until the operator reviews and moves it into the policy
//! directory.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::escape::escape;
use super::{output, Config, OK};

/// More distinct path patterns than this for one host become `/**`.
const MAX_PATHS: usize = 12;

/// What to draft from.
pub(super) struct Ask {
    pub since: Option<std::time::Duration>,
    pub agent: Option<u32>,
    pub write: Option<PathBuf>,
}

/// What was refused for one host (and kind: HTTP or raw TCP).
#[derive(Default)]
struct Seen {
    schemes: BTreeSet<&'static str>,
    ports: BTreeSet<u16>,
    methods: BTreeMap<String, usize>,
    paths: BTreeMap<String, usize>,
    /// Connections and requests.
    count: usize,
    /// DNS questions for the host.
    lookups: usize,
}

pub(super) fn run(cfg: &Config, ask: Ask) -> u8 {
    let Some(live) = &cfg.audit_path else {
        return output::bad_input(
            "the audit log is off (audit.enabled = false): there is nothing to learn from",
        );
    };
    if let Some(path) = &ask.write {
        if let Err(why) = writable(cfg, path) {
            return output::bad_input(why);
        }
    }
    let files = agenshield_proxy::audit::verify::rotation_set(live, cfg.audit.keep);
    let cutoff = ask.since.map(|d| OffsetDateTime::now_utc() - d);
    let mut records = Vec::new();
    for f in &files {
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return output::failed(format!("reading the audit log {}: {e}", f.display())),
        };
        records.extend(
            text.lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()),
        );
    }
    let picked: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| learnable(r))
        .filter(|r| ask.agent.is_none_or(|a| r["agent_uid"] == a))
        .filter(|r| {
            cutoff.is_none_or(|c| {
                r["started"]
                    .as_str()
                    .and_then(|s| OffsetDateTime::parse(s, &Rfc3339).ok())
                    .is_some_and(|t| t >= c)
            })
        })
        .collect();
    let text = draft(&picked, &ask, cutoff);
    // The draft must load as it is (and lint clean) before anyone sees it.
    let check =
        agenshield_proxy::policy::Policy::from_sources(&[agenshield_proxy::policy::PolicySource {
            name: "suggested.toml".into(),
            text: text.clone(),
        }]);
    if let Err(e) = check {
        return output::failed(format!("the draft does not load, which is a bug: {e}"));
    }
    if picked.is_empty() {
        eprintln!(
            "agenshield: no refused or would-be-refused decisions in {} file(s) of the audit log",
            files.len()
        );
    }
    match &ask.write {
        None => output::line(text.trim_end()),
        Some(path) => {
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()));
            if let Err(e) = written {
                return output::failed(format!("writing {}: {e}", path.display()));
            }
            eprintln!(
                "agenshield: wrote {} rule(s) to {}; review them, then move the file into {}",
                text.matches("[[rule]]").count(),
                path.display(),
                cfg.policies.display()
            );
        }
    }
    OK
}

/// A decision of the policy's that refused, or that only report mode let through: a request,
/// a connection or a DNS question.
fn learnable(r: &serde_json::Value) -> bool {
    let kind = r["kind"].as_str();
    if !matches!(kind, Some("request" | "connection" | "query")) {
        return false;
    }
    r["would_deny"] == true || (r["decision"] == "deny" && r["error_code"] == "policy_denied")
}

/// The explicit deny rule that refused `r` (not the policy's default): an allow rule drafted
/// for it would work against that rule, so it is named instead.
fn denied_by_rule(r: &serde_json::Value) -> Option<&str> {
    r["rule"].as_str().filter(|rule| {
        *rule != agenshield_proxy::policy::DEFAULT_RULE
            && *rule != agenshield_proxy::record::NO_RULE
    })
}

/// Not a file the daemon would load: not in the policy directory, not already there.
fn writable(cfg: &Config, path: &Path) -> Result<(), String> {
    if path.exists() {
        return Err(format!(
            "{} exists; name a new file (nothing is overwritten)",
            path.display()
        ));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parent = std::fs::canonicalize(parent)
        .map_err(|e| format!("cannot write into {}: {e}", parent.display()))?;
    if let Ok(policies) = std::fs::canonicalize(&cfg.policies) {
        if parent.starts_with(&policies) {
            return Err(format!(
                "{} is in the policy directory, where it would be loaded at once; write it \
                 elsewhere and move it in after review",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The generalised form of a path: `/`, `/first`, or `/first/**`.
fn pattern(path: &str) -> String {
    let path = path.split('?').next().unwrap_or("/");
    let mut segs = path.split('/').filter(|s| !s.is_empty());
    match (segs.next(), segs.next()) {
        (None, _) => "/".into(),
        (Some(first), None) => format!("/{first}"),
        (Some(first), Some(_)) => format!("/{first}/**"),
    }
}

/// A TOML string.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// The TOML draft.
fn draft(picked: &[&serde_json::Value], ask: &Ask, cutoff: Option<OffsetDateTime>) -> String {
    let mut hosts: BTreeMap<(String, bool), Seen> = BTreeMap::new();
    // (host, rule) → decisions an explicit deny rule made.
    let mut denied: BTreeMap<(String, String), usize> = BTreeMap::new();
    let mut lookups: Vec<&str> = Vec::new();
    for r in picked {
        let Some(host) = r["host"].as_str() else {
            continue;
        };
        if let Some(rule) = denied_by_rule(r) {
            *denied
                .entry((host.to_string(), rule.to_string()))
                .or_default() += 1;
            continue;
        }
        if r["kind"] == "query" {
            lookups.push(host);
            continue;
        }
        let tcp = r["protocol"] == "tcp";
        let seen = hosts.entry((host.to_string(), tcp)).or_default();
        seen.count += 1;
        if let Some(port) = r["port"].as_u64().and_then(|p| u16::try_from(p).ok()) {
            seen.ports.insert(port);
        }
        match r["protocol"].as_str() {
            Some("https") => {
                seen.schemes.insert("https");
            }
            Some("http") => {
                seen.schemes.insert("http");
            }
            _ => {}
        }
        if let Some(m) = r["method"].as_str() {
            *seen.methods.entry(m.to_string()).or_default() += 1;
        }
        if let Some(p) = r["path"].as_str() {
            *seen.paths.entry(pattern(p)).or_default() += 1;
        }
    }
    // A lookup counts for its host's rule (HTTP, else raw TCP); a host only looked up gets
    // one of its own.
    for host in lookups {
        let key = if hosts.contains_key(&(host.to_string(), false))
            || !hosts.contains_key(&(host.to_string(), true))
        {
            (host.to_string(), false)
        } else {
            (host.to_string(), true)
        };
        hosts.entry(key).or_default().lookups += 1;
    }
    let mut out = String::new();
    let since = cutoff
        .map(|c| c.replace_nanosecond(0).unwrap_or(c))
        .and_then(|c| c.format(&Rfc3339).ok())
        .map(|c| format!(" since {c}"))
        .unwrap_or_default();
    let agent = ask
        .agent
        .map(|a| format!(" for agent {a}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "# Drafted by `agenshield proxy ctl policy suggest` from {} refused or would-be-refused\n\
         # decisions in the audit log{since}{agent}. Review every rule (each allows all it\n\
         # lists), then move this file into the policy directory.\nversion = 1",
        picked.len()
    );
    let mut ids = BTreeSet::new();
    for ((host, tcp), seen) in &hosts {
        let mut id: String = format!("suggested{}:{host}", if *tcp { ":tcp" } else { "" })
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "._:-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .take(agenshield_proxy::policy::MAX_RULE_ID_LEN)
            .collect();
        while !ids.insert(id.clone()) {
            id.push('-');
        }
        let list = |items: Vec<String>| items.join(", ");
        let only_looked_up = seen.count == 0;
        let _ = match (seen.count, seen.lookups) {
            (0, n) => writeln!(
                out,
                "\n# {n} DNS lookup(s), no connection seen: HTTPS on 443 is assumed; adjust to \
                 what it needs"
            ),
            (n, 0) => writeln!(out, "\n# {n} decision(s)"),
            (n, l) => writeln!(out, "\n# {n} decision(s), {l} DNS lookup(s)"),
        };
        let _ = writeln!(
            out,
            "[[rule]]\nid = {}\nhosts = [{}]",
            quoted(&id),
            quoted(host)
        );
        if *tcp {
            let _ = writeln!(out, "schemes = [\"tcp\"]");
        } else if only_looked_up {
            let _ = writeln!(out, "schemes = [\"https\"]\nports = [443]");
        } else if !seen.schemes.is_empty() {
            let s = seen.schemes.iter().map(|s| quoted(s)).collect();
            let _ = writeln!(out, "schemes = [{}]", list(s));
        }
        if !seen.ports.is_empty() {
            let p = seen.ports.iter().map(u16::to_string).collect();
            let _ = writeln!(out, "ports = [{}]", list(p));
        }
        if !seen.methods.is_empty() {
            let m = seen.methods.keys().map(|m| quoted(m)).collect();
            let counts: Vec<String> = seen
                .methods
                .iter()
                .map(|(m, n)| format!("{} {n}", escape(m)))
                .collect();
            let _ = writeln!(out, "methods = [{}]   # {}", list(m), counts.join(", "));
        }
        if !seen.paths.is_empty() {
            if seen.paths.len() > MAX_PATHS {
                let _ = writeln!(
                    out,
                    "paths = [\"/**\"]   # {} distinct path prefixes: narrow this by hand",
                    seen.paths.len()
                );
            } else {
                let p = seen.paths.keys().map(|p| quoted(p)).collect();
                let counts: Vec<String> = seen
                    .paths
                    .iter()
                    .map(|(p, n)| format!("{} {n}", escape(p)))
                    .collect();
                let _ = writeln!(out, "paths = [{}]   # {}", list(p), counts.join(", "));
            }
        }
        if let Some(a) = ask.agent {
            let _ = writeln!(out, "agents = [{a}]");
        }
        let _ = writeln!(out, "action = \"allow\"");
    }
    if !denied.is_empty() {
        let _ = writeln!(
            out,
            "\n# Not drafted: refused by an explicit deny rule (an allow rule here would work \
             against it;\n# change that rule if it should pass):"
        );
        for ((host, rule), n) in &denied {
            let _ = writeln!(
                out,
                "#   {} denied by rule {} ({n} decision(s))",
                escape(host),
                escape(rule)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_generalise_to_their_first_segment() {
        assert_eq!(pattern("/"), "/");
        assert_eq!(pattern("/user"), "/user");
        assert_eq!(pattern("/repos/a/b?x=[redacted]"), "/repos/**");
        assert_eq!(pattern("//repos//a"), "/repos/**");
    }

    #[test]
    fn a_draft_groups_by_host_counts_and_loads() {
        let recs: Vec<serde_json::Value> = [
            r#"{"kind":"request","protocol":"https","host":"api.test","port":443,"method":"GET","path":"/repos/a/b","decision":"allow","would_deny":true}"#,
            r#"{"kind":"request","protocol":"https","host":"api.test","port":443,"method":"POST","path":"/repos/c","decision":"allow","would_deny":true}"#,
            r#"{"kind":"request","protocol":"https","host":"api.test","port":443,"method":"GET","path":"/user","decision":"deny","error_code":"policy_denied"}"#,
            r#"{"kind":"connection","protocol":"tcp","host":"db.test","port":5432,"decision":"deny","error_code":"policy_denied"}"#,
            r#"{"kind":"request","protocol":"https","host":"x.test","port":443,"method":"GET","path":"/","decision":"deny","error_code":"secret_leak"}"#,
            r#"{"kind":"close","protocol":"tcp","host":"y.test","port":1,"decision":"allow","would_deny":true}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
        let picked: Vec<&serde_json::Value> = recs.iter().filter(|r| learnable(r)).collect();
        assert_eq!(picked.len(), 4, "not a leak refusal, not a close");
        let ask = Ask {
            since: None,
            agent: Some(1001),
            write: None,
        };
        let text = draft(&picked, &ask, None);
        assert!(text.contains("hosts = [\"api.test\"]\nschemes = [\"https\"]\nports = [443]\nmethods = [\"GET\", \"POST\"]   # GET 2, POST 1\npaths = [\"/repos/**\", \"/user\"]   # /repos/** 2, /user 1\nagents = [1001]\naction = \"allow\""), "{text}");
        assert!(text.contains("id = \"suggested:tcp:db.test\"\nhosts = [\"db.test\"]\nschemes = [\"tcp\"]\nports = [5432]"), "{text}");
        let p = agenshield_proxy::policy::Policy::from_sources(&[
            agenshield_proxy::policy::PolicySource {
                name: "s.toml".into(),
                text,
            },
        ]);
        assert!(p.is_ok(), "{p:?}");
    }

    #[test]
    fn dns_refusals_join_their_hosts_rule_and_explicit_denials_are_named_not_drafted() {
        let recs: Vec<serde_json::Value> = [
            r#"{"kind":"query","protocol":"dns","host":"denied.test","port":53,"decision":"deny","error_code":"policy_denied","rule":"default"}"#,
            r#"{"kind":"request","protocol":"https","host":"denied.test","port":443,"method":"GET","path":"/","decision":"deny","error_code":"policy_denied","rule":"default"}"#,
            r#"{"kind":"query","protocol":"dns","host":"only.test","port":53,"decision":"deny","error_code":"policy_denied","rule":"default"}"#,
            r#"{"kind":"query","protocol":"dns","host":"db.test","port":53,"decision":"deny","error_code":"policy_denied","rule":"default"}"#,
            r#"{"kind":"connection","protocol":"tcp","host":"db.test","port":5432,"decision":"deny","error_code":"policy_denied","rule":"default"}"#,
            r#"{"kind":"query","protocol":"dns","host":"paste.test","port":53,"decision":"deny","error_code":"policy_denied","rule":"no-paste"}"#,
            r#"{"kind":"request","protocol":"https","host":"paste.test","port":443,"method":"POST","path":"/x","decision":"deny","error_code":"policy_denied","rule":"no-paste"}"#,
        ]
        .iter()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
        let picked: Vec<&serde_json::Value> = recs.iter().filter(|r| learnable(r)).collect();
        assert_eq!(picked.len(), recs.len());
        let ask = Ask {
            since: None,
            agent: None,
            write: None,
        };
        let at = time::Date::from_calendar_date(2026, time::Month::January, 2)
            .and_then(|d| d.with_hms_nano(3, 4, 5, 123_456_789))
            .expect("date")
            .assume_utc();
        let text = draft(&picked, &ask, Some(at));
        assert!(
            text.contains("since 2026-01-02T03:04:05Z."),
            "seconds: {text}"
        );
        assert_eq!(
            text.matches("hosts = [\"denied.test\"]").count(),
            1,
            "{text}"
        );
        assert!(
            text.contains(
                "# 1 decision(s), 1 DNS lookup(s)\n[[rule]]\nid = \"suggested:denied.test\""
            ),
            "{text}"
        );
        assert!(
            text.contains("hosts = [\"only.test\"]\nschemes = [\"https\"]\nports = [443]\naction"),
            "{text}"
        );
        assert!(text.contains("id = \"suggested:tcp:db.test\""), "{text}");
        assert_eq!(
            text.matches("db.test\"]").count(),
            1,
            "the lookup joins the tcp rule: {text}"
        );
        assert!(!text.contains("hosts = [\"paste.test\"]"), "{text}");
        assert!(
            text.contains("#   paste.test denied by rule no-paste (2 decision(s))"),
            "{text}"
        );
        let p = agenshield_proxy::policy::Policy::from_sources(&[
            agenshield_proxy::policy::PolicySource {
                name: "s.toml".into(),
                text,
            },
        ]);
        assert!(p.is_ok(), "{p:?}");
    }
}
