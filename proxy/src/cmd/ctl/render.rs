//! Human output for `ctl`: aligned, one fact per line, nothing the JSON does not also say.
//! Every renderer here is called through `escape::render_safely` (by `print` and `tail`): it
//! reads a value whose strings are escaped and what it returns is escaped again, so a path,
//! a host or an error from the daemon can never drive the operator's terminal.

use serde_json::Value;

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

fn list(v: &Value) -> String {
    match v.as_array() {
        Some(a) if !a.is_empty() => a
            .iter()
            .map(|x| {
                x.as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| x.to_string())
            })
            .collect::<Vec<_>>()
            .join(", "),
        _ => "-".into(),
    }
}

fn duration(secs: u64) -> String {
    let (d, h, m, s) = (secs / 86400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m {s}s"),
        (0, _, _) => format!("{h}h {m}m"),
        _ => format!("{d}d {h}h"),
    }
}

pub(super) fn status(v: &Value) -> String {
    let p = &v["policy"];
    let c = &v["counts"];
    let fw = &v["firewall"];
    let firewall = if fw["enabled"].as_bool() == Some(true) {
        format!(
            "{} (agent uids {})",
            s(&fw["state"]),
            list(&fw["agent_uids"])
        )
    } else {
        "redirect disabled in the config".into()
    };
    let last_error = match p["last_error"].as_object() {
        Some(e) => format!(
            "FAILED at {}: {}",
            e.get("at").map(s).unwrap_or("-"),
            e.get("message").map(s).unwrap_or("-")
        ),
        None => format!("ok ({})", s(&p["loaded_at"])),
    };
    let w = &p["watch"];
    let watch = match (w["active"].as_bool(), w["error"].as_str()) {
        (Some(true), None) => format!("watching {}", s(&p["dir"])),
        (Some(true), Some(e)) => format!("watching {} ({e})", s(&p["dir"])),
        (_, e) => format!(
            "NOT WATCHING: {}; SIGHUP or ctl reload apply edits at once",
            e.unwrap_or("unknown")
        ),
    } + &match w["rearmed"].as_u64() {
        Some(n) if n > 0 => format!("; directory replaced {n}x, watch moved"),
        _ => String::new(),
    };
    [
        format!(
            "agenshield {}   pid {}   up {}",
            s(&v["version"]),
            v["pid"],
            duration(v["uptime_secs"].as_u64().unwrap_or(0))
        ),
        format!("transparent   {}", list(&v["listeners"]["transparent"])),
        format!("explicit      {}", s(&v["listeners"]["explicit"])),
        format!(
            "DNS stub      {}",
            match v["listeners"]["dns"].as_array() {
                Some(a) if a.is_empty() => "off".to_string(),
                _ => list(&v["listeners"]["dns"]),
            }
        ),
        format!(
            "metrics       {}",
            match v["listeners"]["metrics"].as_str() {
                Some(m) => format!("http://{m}/metrics"),
                None => "off".to_string(),
            }
        ),
        format!(
            "admin socket  {}{}",
            s(&v["listeners"]["admin"]),
            match v["listeners"]["admin_https"].as_str() {
                Some(a) => format!("\nadmin HTTPS   https://{a} (client certificates)"),
                None => String::new(),
            }
        ),
        format!("firewall      {firewall}"),
        format!(
            "CA            {}  SHA-256 {}",
            s(&v["ca"]["path"]),
            s(&v["ca"]["sha256"])
        ),
        match v["audit"].as_object() {
            Some(a) => format!(
                "audit log     {}  record {}  hash {}{}",
                a.get("path").map(s).unwrap_or("-"),
                a.get("seq").cloned().unwrap_or_default(),
                a.get("hash").map(s).unwrap_or("-"),
                match a.get("problem").and_then(|p| p.as_str()) {
                    Some(why) =>
                        format!("\n              NOT RECORDING: {why}; requests are refused"),
                    None => String::new(),
                }
            ),
            None => "audit log     off".into(),
        },
        export_lines(&v["audit"]["export"]).join("\n"),
        store_line(&v["ratelimit_store"]),
        format!(
            "policy        {}  {} rules  {}  loaded {}",
            s(&p["hash"]),
            p["rules"],
            s(&p["mode"]),
            s(&p["loaded_at"])
        ),
        format!("policy dir    {}", s(&p["dir"])),
        format!("last reload   {last_error}"),
        format!("hot reload    {watch}"),
        source_lines(p).join("\n"),
        format!(
            "requests      allowed {}  denied {}  limited {}  errors {}",
            c["allowed"], c["denied"], c["limited"], c["errors"]
        ),
        format!(
            "connections   {}   tunnels open {}   pending approvals {}",
            c["connections"], v["tunnels"], v["pending"]
        ),
        budget_lines(&v["budgets"]).join("\n"),
    ]
    .into_iter()
    .filter(|l| !l.is_empty())
    .collect::<Vec<_>>()
    .join("\n")
}

/// Token budgets' spend in their current windows, one counter a line.
fn budget_lines(b: &Value) -> Vec<String> {
    let Some(list) = b.as_array() else {
        return Vec::new();
    };
    list.iter()
        .enumerate()
        .map(|(i, x)| {
            format!(
                "{}rule:{} {} ({})  {} of {} tokens per {}  resets {}",
                if i == 0 {
                    "token budgets "
                } else {
                    "              "
                },
                s(&x["rule"]),
                s(&x["who"]),
                s(&x["scope"]),
                x["spent"],
                x["limit"],
                s(&x["per"]),
                s(&x["resets"])
            )
        })
        .collect()
}

/// `[[audit.export]]`: one line per sink (none without sinks).
fn export_lines(sinks: &Value) -> Vec<String> {
    let Some(sinks) = sinks.as_array() else {
        return Vec::new();
    };
    sinks
        .iter()
        .map(|x| {
            let state = if x["connected"].as_bool() == Some(true) {
                "connected".to_string()
            } else {
                match x["down_since"].as_str() {
                    Some(t) => format!("RECEIVER DOWN since {t}; records wait in the log"),
                    None => "not connected yet".to_string(),
                }
            };
            let last = match x["last_error"].as_object() {
                Some(e) => format!(
                    "  last failure {} at {}",
                    e.get("reason").map(s).unwrap_or("-"),
                    e.get("at").map(s).unwrap_or("-")
                ),
                None => String::new(),
            };
            format!(
                "audit export  {} {} ({})  shipped {}  pending {}  {state}{last}",
                s(&x["name"]),
                s(&x["url"]),
                s(&x["format"]),
                x["shipped_seq"],
                x["pending"]
            )
        })
        .collect()
}

/// `[ratelimit] store`: whether the fleet's store answers (empty without one).
fn store_line(st: &Value) -> String {
    if !st.is_object() {
        return String::new();
    }
    let state = if st["up"].as_bool() == Some(true) {
        format!("up ({}/{} connections)", st["connected"], st["threads"])
    } else {
        let then = match st["on_store_error"].as_str() {
            Some("deny") => "fleet-limited requests are refused",
            _ => "fleet limits count in this daemon's own buckets",
        };
        match st["down_since"].as_str() {
            Some(t) => format!("DOWN since {t}; {then}"),
            None => format!(
                "connecting ({}/{} connections)",
                st["connected"], st["threads"]
            ),
        }
    };
    let last = match st["last_error"].as_object() {
        Some(e) => format!(
            "  last failure {} at {}: {}",
            e.get("reason").map(s).unwrap_or("-"),
            e.get("at").map(s).unwrap_or("-"),
            e.get("message").map(s).unwrap_or("-")
        ),
        None => String::new(),
    };
    format!(
        "rate store    {}  {state}  on_store_error {}{last}",
        s(&st["store"]),
        s(&st["on_store_error"])
    )
}

/// `[policy.source]`: the bundle in force, the last sync and error, and what of the local
/// directory a deny-only bundle left out. `p`: the policy object (`/v1/policy`, or
/// `/v1/status`'s `policy`). One empty line when there is no source.
fn source_lines(p: &Value) -> Vec<String> {
    let src = &p["source"];
    if !src.is_object() {
        return vec![String::new()];
    }
    let mut out = vec![
        format!("policy source {}", s(&src["url"])),
        match src["revision"].as_u64() {
            Some(rev) => format!(
                "bundle        revision {rev}  sha256 {}  local {}  from {}  made {}",
                s(&src["sha256"]),
                s(&src["local"]),
                s(&src["from"]),
                s(&src["created_at"])
            ),
            None => "bundle        none yet".to_string(),
        },
        format!("last sync     {}", s(&src["last_sync"])),
        match src["last_error"].as_object() {
            Some(e) => format!(
                "sync error    {} at {}: {}",
                e.get("reason").map(s).unwrap_or("-"),
                e.get("at").map(s).unwrap_or("-"),
                e.get("message").map(s).unwrap_or("-")
            ),
            None => "sync error    none".to_string(),
        },
    ];
    if p["unavailable"].as_bool() == Some(true) {
        out.push(
            "REFUSING ALL  no policy until the first verified bundle (require_first_sync)"
                .to_string(),
        );
    }
    if let Some(dropped) = p["local_dropped"].as_array() {
        for d in dropped {
            out.push(format!("local ignored {}", s(d)));
        }
    }
    out
}

pub(super) fn stats(v: &Value) -> String {
    let c = &v["counts"];
    let l = &v["leaf_certificates"];
    [
        format!("connections      {}", c["connections"]),
        format!("allowed          {}", c["allowed"]),
        format!("denied           {}", c["denied"]),
        format!("rate limited     {}", c["limited"]),
        format!("errors           {}", c["errors"]),
        format!(
            "secrets          injected {}  leaks refused {}  out of scope {}",
            c["secret_injections"], c["secret_leaks"], c["secret_scope"]
        ),
        format!(
            "policy reloads   ok {}  failed {}",
            c["reloads_ok"], c["reloads_failed"]
        ),
        format!(
            "leaf certs       minted {}  cache hits {}  misses {}",
            l["minted"], l["cache_hits"], l["cache_misses"]
        ),
        format!("pending          {}", v["pending"]),
    ]
    .join("\n")
}

pub(super) fn policy(v: &Value) -> String {
    let mut out = vec![
        format!("policy dir    {}", s(&v["dir"])),
        format!("hash          {}", s(&v["hash"])),
        format!("rules         {}", v["rules"]),
        format!("mode          {}", s(&v["mode"])),
        format!("loaded        {}", s(&v["loaded_at"])),
    ];
    if let Some(e) = v["last_error"].as_object() {
        out.push(format!(
            "last reload   FAILED: {}",
            e.get("message").map(s).unwrap_or("-")
        ));
    }
    out.extend(source_lines(v).into_iter().filter(|l| !l.is_empty()));
    if let Some(rules) = v["rule_list"].as_array() {
        out.push(String::new());
        // Each column as wide as its widest cell, so no id or priority pushes the rest.
        let width = |head: &str, cell: &dyn Fn(&Value) -> String| {
            rules
                .iter()
                .map(|r| cell(r).chars().count())
                .chain([head.len()])
                .max()
                .unwrap_or(0)
        };
        let id = |r: &Value| s(&r["id"]).to_string();
        let action = |r: &Value| s(&r["action"]).to_string();
        let priority = |r: &Value| r["priority"].to_string();
        let (w_id, w_action, w_priority) = (
            width("RULE", &id),
            width("ACTION", &action),
            width("PRIORITY", &priority),
        );
        out.push(format!(
            "{:<w_id$}  {:<w_action$}  {:>w_priority$}  MATCHES",
            "RULE", "ACTION", "PRIORITY"
        ));
        for r in rules {
            out.push(format!(
                "{:<w_id$}  {:<w_action$}  {:>w_priority$}  {}",
                id(r),
                action(r),
                priority(r),
                s(&r["summary"])
            ));
        }
    }
    out.join("\n")
}

pub(super) fn check(v: &Value) -> String {
    let hint = v["hint"]
        .as_str()
        .map(|h| format!("\nhint          {h}"))
        .unwrap_or_default();
    if v["scheme"] == "dns" {
        let answered = match (v["answer"].as_str(), s(&v["decision"])) {
            (Some("synthetic"), "ask") => {
                "a synthetic address (198.18.0.0/15), answered locally: no resolver is asked; \
                 the connection to it waits for an operator"
            }
            (Some("synthetic"), _) => {
                "a synthetic address (198.18.0.0/15), answered locally: no resolver is asked; \
                 the connection to it is refused naming the rule"
            }
            (Some("nxdomain"), _) | (None, "deny") => {
                "NXDOMAIN, answered locally: no resolver is asked"
            }
            _ => "answered from the proxy's resolver (private addresses removed)",
        };
        return [
            format!("DNS {}", s(&v["host"])),
            format!("decision      {}", s(&v["decision"]).to_uppercase()),
            format!("answer        {answered}"),
            format!(
                "rule          {}",
                v["rule_id"]
                    .as_str()
                    .unwrap_or(agenshield_proxy::record::NO_RULE)
            ),
            format!("explanation   {}{hint}", s(&v["explanation"])),
            format!("policy        {}", s(&v["policy_hash"])),
        ]
        .join("\n");
    }
    let mut out = vec![
        format!(
            "{} {}://{}:{}{}",
            s(&v["method"]),
            s(&v["scheme"]),
            s(&v["host"]),
            v["port"],
            s(&v["path"])
        ),
        format!(
            "decision      {}{}",
            s(&v["decision"]).to_uppercase(),
            if v["reported_deny"].as_bool() == Some(true) {
                " (report mode: would be denied)"
            } else {
                ""
            }
        ),
        format!(
            "rule          {}",
            v["rule_id"]
                .as_str()
                .unwrap_or(agenshield_proxy::record::NO_RULE)
        ),
        format!("explanation   {}{hint}", s(&v["explanation"])),
    ];
    if let Some(o) = v["obligations"].as_object() {
        let parts: Vec<String> = o
            .iter()
            .filter(|(_, x)| !x.is_null())
            .map(|(k, x)| format!("{k} {x}"))
            .collect();
        if !parts.is_empty() {
            out.push(format!("obligations   {}", parts.join("; ")));
        }
    }
    out.push(format!("policy        {}", s(&v["policy_hash"])));
    out.join("\n")
}

/// Whose request it was: the agent's uid, or `-` when the OS could not tell.
pub(super) fn agent(uid: &Value) -> String {
    uid.as_u64().map_or_else(|| "-".into(), |u| u.to_string())
}

/// The requests `ask` rules hold: who asks (agent uid), what (method, host, port, path) and
/// under which rule, so the operator approves knowing all that `--remember` would cover.
pub(super) fn pending(v: &Value) -> String {
    let Some(items) = v.as_array().filter(|a| !a.is_empty()) else {
        return "no requests are waiting for approval".into();
    };
    let rows: Vec<[String; 7]> = items
        .iter()
        .map(|p| {
            let date = |k: &str| {
                let t = s(&p[k]);
                t.get(..19).unwrap_or(t).to_string()
            };
            [
                s(&p["id"]).to_string(),
                date("since"),
                date("expires"),
                agent_name(p),
                s(&p["method"]).to_string(),
                format!("{}:{}{}", s(&p["host"]), p["port"], s(&p["path"])),
                s(&p["rule_id"]).to_string(),
            ]
        })
        .collect();
    let head = [
        "ID",
        "SINCE",
        "EXPIRES",
        "AGENT",
        "METHOD",
        "DESTINATION",
        "RULE",
    ];
    let widths: Vec<usize> = (0..head.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([head[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 7]| {
        let mut l: Vec<String> = cells[..6]
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        l.push(cells[6].to_string());
        l.join("  ")
    };
    let mut out = vec![line(head)];
    for r in &rows {
        out.push(line([&r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6]]));
    }
    out.push(
        "approve with `agenshield proxy ctl pending approve ID`; unanswered by EXPIRES, it is \
         refused (ask_timeout)"
            .into(),
    );
    out.join("\n")
}

/// The agent of a pending request: uid and user name (`5200 (ash_default_agent)`), the uid
/// alone when it has no name on this machine, `-` when the OS could not tell.
fn agent_name(p: &Value) -> String {
    let Some(uid) = p["agent_uid"].as_u64().and_then(|u| u32::try_from(u).ok()) else {
        return "-".into();
    };
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(user)) => format!("{uid} ({})", user.name),
        _ => uid.to_string(),
    }
}

/// When a record's line is placed in time: when its decision was made (`started`), and for
/// a `close` when the tunnel ended (`started` + `ms`). `None` when the record has no time.
pub(super) fn when(v: &Value) -> Option<time::OffsetDateTime> {
    let started = time::OffsetDateTime::parse(
        v["started"].as_str()?,
        &time::format_description::well_known::Rfc3339,
    )
    .ok()?;
    let lasted = match (v["kind"].as_str(), v["ms"].as_f64()) {
        (Some("close"), Some(ms)) if ms.is_finite() && ms >= 0.0 => {
            time::Duration::seconds_f64(ms / 1000.0)
        }
        _ => time::Duration::ZERO,
    };
    Some(started + lasted)
}

/// One record of `ctl tail`, on one line: when (UTC), the decision, and what it was about.
pub(super) fn event(v: &Value) -> String {
    let time = match when(v) {
        Some(t) => format!(
            "{:02}:{:02}:{:02}.{:03}",
            t.hour(),
            t.minute(),
            t.second(),
            t.millisecond()
        ),
        None => s(&v["started"]).to_string(),
    };
    let hostport = match v["host"].as_str() {
        Some(h) if h.contains(':') => format!("[{h}]:{}", v["port"]),
        Some(h) => format!("{h}:{}", v["port"]),
        None => "-".into(),
    };
    let rule = v["rule"]
        .as_str()
        .unwrap_or(agenshield_proxy::record::NO_RULE);
    let error = v["error_code"]
        .as_str()
        .map(|c| format!(" error={c}"))
        .unwrap_or_default();
    let secrets = match list(&v["secrets"]).as_str() {
        "-" => String::new(),
        names => format!(" secrets={}", names.replace(", ", ",")),
    };
    let proto = s(&v["protocol"]);
    // Whose decision it was (the agent's uid), and a report-mode pass that enforcing
    // would refuse.
    let agent = v["agent_uid"]
        .as_u64()
        .map(|u| format!(" agent={u}"))
        .unwrap_or_default();
    let would = if v["would_deny"] == true {
        " (report mode: would deny)"
    } else {
        ""
    };
    // An MCP exchange: its JSON-RPC method and tool.
    let mcp = match (v["mcp"]["method"].as_str(), v["mcp"]["tool"].as_str()) {
        (Some(m), Some(t)) => format!(" mcp={m}:{t}"),
        (Some(m), None) => format!(" mcp={m}"),
        (None, _) if v["mcp"].is_object() => " mcp=response".into(),
        _ => String::new(),
    };
    // What follows the rule on a decision line.
    let tail = format!("{mcp}{secrets}{agent}{would}");
    let decision = s(&v["decision"]);
    let what = match s(&v["kind"]) {
        "close" => format!(
            "{:<12} {:>3} {:<6} {proto}://{hostport}  closed ({}) up={} down={} ms={}",
            "closed",
            "",
            "",
            s(&v["end"]),
            v["bytes_up"],
            v["bytes_down"],
            v["ms"]
        ),
        _ if v["error_code"] == "client_rejected_ca" => format!(
            "{decision:<12} {:>3} {:<6} {hostport}  the client rejected the AgenShield CA for \
             {}: this tool does not trust the CA; `agenshield proxy doctor` names the fix (docs/install.md: \
             \"The agent's tools trust the proxy\"){error}{agent}",
            "",
            "TLS",
            v["sni"].as_str().unwrap_or(s(&v["host"])),
        ),
        "query" => {
            let answers = list(&v["dns"]["answers"]);
            format!(
                "{decision:<12} {:>3} {:<6} dns://{}  {} {}  answers={}  rule={rule}{error}{tail}",
                "",
                "DNS",
                s(&v["host"]),
                s(&v["dns"]["qtype"]),
                s(&v["dns"]["rcode"]),
                answers.replace(", ", ","),
            )
        }
        "connection" if v["method"].is_null() => format!(
            "{decision:<12} {:>3} {:<6} {proto}://{hostport}  rule={rule}{error}{tail}",
            "",
            proto.to_uppercase(),
        ),
        _ => format!(
            "{decision:<12} {:>3} {:<6} {proto}://{hostport}{}  rule={rule}{error}{tail}",
            v["status"],
            s(&v["method"]),
            s(&v["path"]),
        ),
    };
    format!("{time} {what}")
}

/// `{"kind": "file", "path": …}` as a phrase.
fn store(v: &Value) -> String {
    match (s(&v["kind"]), &v["service"]) {
        ("file", _) => format!("file vault {}", s(&v["path"])),
        ("keychain", svc) => format!("keychain {} (service {})", s(&v["path"]), s(svc)),
        (kind, _) => format!("{kind} {}", s(&v["path"])),
    }
}

pub(super) fn secrets(v: &Value) -> String {
    let Some(items) = v["secrets"].as_array().filter(|a| !a.is_empty()) else {
        return format!("no secrets in {}", store(&v["store"]));
    };
    let row = |cols: [&str; 8]| {
        format!(
            "{:<24} {:<8} {:<28} {:<20} {:<20} {:>6}  {:<20} {}",
            cols[0], cols[1], cols[2], cols[3], cols[4], cols[5], cols[6], cols[7]
        )
    };
    let mut out = vec![row([
        "NAME",
        "KIND",
        "BOUND BY",
        "UPDATED",
        "LAST USED",
        "USES",
        "EXPIRES",
        "RATE",
    ])];
    let mut notes = Vec::new();
    for x in items {
        let date = |k: &str| {
            let t = s(&x[k]);
            t.get(..19).unwrap_or(t).to_string()
        };
        let name = s(&x["name"]);
        out.push(row([
            name,
            s(&x["kind"]),
            &list(&x["rules"]),
            &date("updated"),
            &date("last_used"),
            &x["uses"].to_string(),
            &date("expires"),
            s(&x["rate"]),
        ]));
        if let Some(src) = x["source"].as_str() {
            notes.push(format!("{name}: fetched from {src}"));
        }
        if let Some(e) = x["error"].as_str() {
            notes.push(format!("{name}: the last fetch failed: {e}"));
        }
    }
    out.extend(notes);
    out.push(format!("store: {}", store(&v["store"])));
    out.join("\n")
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
