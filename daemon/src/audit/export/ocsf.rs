//! The OCSF form of an audit record (`format = "ocsf"`), schema version [`OCSF_VERSION`]:
//! `request` → HTTP Activity (4002), `connection` and `close` → Network Activity (4001),
//! `query` → DNS Activity (4003), any other kind (the daemon's own records, and kinds added
//! later) → Base Event (0). Every event carries the whole agenshield record under `unmapped`,
//! so nothing the SIEM might need is lost in the mapping (its `seq`, `prev`, `hash` too).
//! The mapping, field by field, is in docs/audit.md; the e2e test `audit_export` validates
//! each class against the vendored schema (tests/data/ocsf-1.3.0/).
//!
//! Built from the line as written (the file is the source), never from the in-memory record:
//! what a SIEM gets is what the log says.

use serde_json::{json, Map, Value};

/// The OCSF schema version this maps to.
pub(crate) const OCSF_VERSION: &str = "1.3.0";

const NETWORK: u64 = 4;
const HTTP_ACTIVITY: u64 = 4002;
const NETWORK_ACTIVITY: u64 = 4001;
const DNS_ACTIVITY: u64 = 4003;

/// The OCSF event for one log line (a line that is not a record: a Base Event with the line
/// as `raw_data`).
pub(crate) fn event(line: &[u8], host_id: &str) -> Value {
    let Ok(Value::Object(r)) = serde_json::from_slice::<Value>(line) else {
        let mut e = base(0, 0, 99, "Other", None, host_id, None);
        e.insert(
            "raw_data".into(),
            Value::String(String::from_utf8_lossy(line).into_owned()),
        );
        e.insert(
            "message".into(),
            json!("an audit log line that is not a record"),
        );
        return Value::Object(e);
    };
    let kind = r.get("kind").and_then(Value::as_str).unwrap_or("");
    let e = match kind {
        "request" => http_activity(&r, host_id),
        "connection" | "close" => network_activity(&r, kind, host_id),
        "query" => dns_activity(&r, host_id),
        _ => {
            let mut e = base(0, 0, 99, kind, Some(&r), host_id, None);
            e.insert(
                "message".into(),
                Value::String(format!("agenshield {kind} record")),
            );
            e
        }
    };
    Value::Object(e)
}

/// What every event has: classification, time, severity, metadata, `unmapped`.
fn base(
    class_uid: u64,
    category_uid: u64,
    activity_id: u64,
    activity_name: &str,
    r: Option<&Map<String, Value>>,
    host_id: &str,
    profile: Option<&str>,
) -> Map<String, Value> {
    let mut e = Map::new();
    e.insert("class_uid".into(), json!(class_uid));
    e.insert("category_uid".into(), json!(category_uid));
    e.insert("activity_id".into(), json!(activity_id));
    e.insert("activity_name".into(), json!(activity_name));
    e.insert("type_uid".into(), json!(class_uid * 100 + activity_id));
    let time = r
        .and_then(|r| r.get("time"))
        .and_then(Value::as_str)
        .and_then(epoch_ms)
        .unwrap_or_else(now_ms);
    e.insert("time".into(), json!(time));
    e.insert("severity_id".into(), json!(1));
    e.insert("severity".into(), json!("Informational"));
    let mut metadata = json!({
        "version": OCSF_VERSION,
        "product": {
            "name": "AgenShield egress proxy",
            "vendor_name": "AgenShield",
            "version": env!("CARGO_PKG_VERSION"),
        },
        "log_name": "agenshield-audit",
        "log_provider": host_id,
    });
    if let Some(r) = r {
        if let Some(seq) = r.get("seq").and_then(Value::as_u64) {
            metadata["sequence"] = json!(seq);
        }
        if let Some(id) = r.get("request_id").and_then(Value::as_str) {
            metadata["uid"] = json!(id);
        }
        e.insert("unmapped".into(), Value::Object(r.clone()));
    }
    if let Some(p) = profile {
        metadata["profiles"] = json!([p]);
    }
    e.insert("metadata".into(), metadata);
    e
}

/// What the decision records share: endpoints, traffic, duration, outcome.
fn decision(e: &mut Map<String, Value>, r: &Map<String, Value>) {
    let s = |k: &str| r.get(k).and_then(Value::as_str);
    let n = |k: &str| r.get(k).and_then(Value::as_u64);
    let verdict = s("decision").unwrap_or("error");
    let allowed = matches!(verdict, "allow" | "ask_approved");
    let failed = r.get("error_code").is_some_and(|c| !c.is_null());
    e.insert(
        "status_id".into(),
        json!(if allowed && !failed { 1 } else { 2 }),
    );
    e.insert(
        "status".into(),
        json!(if allowed && !failed {
            "Success"
        } else {
            "Failure"
        }),
    );
    if let Some(code) = s("error_code") {
        e.insert("status_code".into(), json!(code));
        e.insert("status_detail".into(), json!(code));
    }
    if !allowed {
        e.insert("severity_id".into(), json!(3));
        e.insert("severity".into(), json!("Medium"));
    }
    let (action_id, action) = if allowed {
        (1, "Allowed")
    } else {
        (2, "Denied")
    };
    e.insert("action_id".into(), json!(action_id));
    e.insert("action".into(), json!(action));
    let (disposition_id, disposition) = match verdict {
        "allow" => (1, "Allowed"),
        "ask_approved" => (8, "Approved"),
        "error" => (27, "Error"),
        _ => (2, "Blocked"),
    };
    e.insert("disposition_id".into(), json!(disposition_id));
    e.insert("disposition".into(), json!(disposition));
    if let Some(rule) = s("rule") {
        e.insert("firewall_rule".into(), json!({ "uid": rule, "name": rule }));
    }
    if let Some(client) = s("client").and_then(|c| c.parse::<std::net::SocketAddr>().ok()) {
        e.insert(
            "src_endpoint".into(),
            json!({ "ip": client.ip().to_string(), "port": client.port() }),
        );
    }
    if let Some(uid) = n("agent_uid") {
        e.insert(
            "actor".into(),
            json!({ "user": { "uid": uid.to_string() } }),
        );
    }
    let mut dst = Map::new();
    if let Some(host) = s("host").filter(|h| !h.is_empty()) {
        match host.parse::<std::net::IpAddr>() {
            Ok(ip) => dst.insert("ip".into(), json!(ip.to_string())),
            Err(_) => dst.insert("hostname".into(), json!(host)),
        };
    }
    if let Some(port) = n("port") {
        dst.insert("port".into(), json!(port));
    }
    if let Some(up) = s("upstream").and_then(|u| u.parse::<std::net::SocketAddr>().ok()) {
        dst.insert("ip".into(), json!(up.ip().to_string()));
    }
    if dst.contains_key("ip") || dst.contains_key("hostname") {
        e.insert("dst_endpoint".into(), Value::Object(dst));
    }
    e.insert(
        "traffic".into(),
        json!({
            "bytes_out": n("bytes_up").unwrap_or(0),
            "bytes_in": n("bytes_down").unwrap_or(0),
            "bytes": n("bytes_up").unwrap_or(0) + n("bytes_down").unwrap_or(0),
        }),
    );
    let mut conn = json!({ "direction_id": 2, "direction": "Outbound", "protocol_name": "tcp" });
    if let Some(id) = n("conn_id") {
        conn["uid"] = json!(id.to_string());
    }
    e.insert("connection_info".into(), conn);
    if let Some(started) = s("started").and_then(epoch_ms) {
        e.insert("start_time".into(), json!(started));
    }
    if let Some(ms) = r.get("ms").and_then(Value::as_f64) {
        e.insert("duration".into(), json!(ms.round() as u64));
    }
    let what = [
        s("method"),
        Some(verdict),
        s("host"),
        s("path"),
        s("error_code"),
    ];
    e.insert(
        "message".into(),
        json!(what.into_iter().flatten().collect::<Vec<_>>().join(" ")),
    );
}

fn http_activity(r: &Map<String, Value>, host_id: &str) -> Map<String, Value> {
    let s = |k: &str| r.get(k).and_then(Value::as_str);
    let method = s("method").unwrap_or("");
    let (activity_id, activity) = match method {
        "CONNECT" => (1, "Connect"),
        "DELETE" => (2, "Delete"),
        "GET" => (3, "Get"),
        "HEAD" => (4, "Head"),
        "OPTIONS" => (5, "Options"),
        "POST" => (6, "Post"),
        "PUT" => (7, "Put"),
        "TRACE" => (8, "Trace"),
        _ => (99, "Other"),
    };
    let mut e = base(
        HTTP_ACTIVITY,
        NETWORK,
        activity_id,
        activity,
        Some(r),
        host_id,
        Some("security_control"),
    );
    decision(&mut e, r);
    let scheme = if s("protocol") == Some("https") {
        "https"
    } else {
        "http"
    };
    let host = s("host").unwrap_or("");
    let port = r.get("port").and_then(Value::as_u64).unwrap_or(0);
    let full = s("path").unwrap_or("/");
    let (path, query) = match full.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (full, None),
    };
    let mut url = json!({
        "scheme": scheme,
        "hostname": host,
        "port": port,
        "path": path,
        "url_string": format!("{scheme}://{}{full}", crate::config::authority(host, u16::try_from(port).unwrap_or(0))),
    });
    if let Some(q) = query {
        url["query_string"] = json!(q);
    }
    e.insert(
        "http_request".into(),
        json!({ "http_method": method, "url": url }),
    );
    let status = r.get("status").and_then(Value::as_u64);
    // 0: no response was sent (the client went away first).
    e.insert(
        "http_response".into(),
        json!({ "code": status.unwrap_or(0) }),
    );
    if let Some(st) = status {
        e.insert("http_status".into(), json!(st));
    }
    e
}

fn network_activity(r: &Map<String, Value>, kind: &str, host_id: &str) -> Map<String, Value> {
    let verdict = r.get("decision").and_then(Value::as_str).unwrap_or("error");
    let (activity_id, activity) = match (kind, verdict) {
        ("close", _) => (2, "Close"),
        (_, "allow" | "ask_approved") => (1, "Open"),
        (_, "error") => (4, "Fail"),
        _ => (5, "Refuse"),
    };
    let mut e = base(
        NETWORK_ACTIVITY,
        NETWORK,
        activity_id,
        activity,
        Some(r),
        host_id,
        Some("security_control"),
    );
    decision(&mut e, r);
    if let Some(proto) = r.get("protocol").and_then(Value::as_str) {
        e["connection_info"]["protocol_name"] = json!("tcp");
        e.insert("app_name".into(), json!(proto));
    }
    e
}

fn dns_activity(r: &Map<String, Value>, host_id: &str) -> Map<String, Value> {
    let mut e = base(
        DNS_ACTIVITY,
        NETWORK,
        6,
        "Traffic",
        Some(r),
        host_id,
        Some("security_control"),
    );
    decision(&mut e, r);
    e["connection_info"]["protocol_name"] = json!("udp");
    let dns = r.get("dns").cloned().unwrap_or(Value::Null);
    let qtype = dns.get("qtype").and_then(Value::as_str).unwrap_or("-");
    let mut query = json!({
        "hostname": r.get("host").and_then(Value::as_str).unwrap_or(""),
        "class": "IN",
    });
    if qtype != "-" {
        query["type"] = json!(qtype);
    }
    e.insert("query".into(), query);
    let answers: Vec<Value> = dns
        .get("answers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(|ip| {
                    let t = if ip.contains(':') { "AAAA" } else { "A" };
                    json!({ "rdata": ip, "type": t, "class": "IN" })
                })
                .collect()
        })
        .unwrap_or_default();
    e.insert("answers".into(), Value::Array(answers));
    let rcode = dns.get("rcode").and_then(Value::as_str).unwrap_or("OTHER");
    let (rcode_id, caption) = match rcode {
        "NOERROR" => (0, "NoError"),
        "FORMERR" => (1, "FormError"),
        "SERVFAIL" => (2, "ServError"),
        "NXDOMAIN" => (3, "NXDomain"),
        "NOTIMP" => (4, "NotImp"),
        "REFUSED" => (5, "Refused"),
        _ => (99, "Other"),
    };
    e.insert("rcode_id".into(), json!(rcode_id));
    e.insert("rcode".into(), json!(caption));
    e
}

/// RFC 3339 → milliseconds since the epoch.
fn epoch_ms(t: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

fn now_ms() -> i64 {
    i64::try_from(time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_gets_its_class_and_keeps_the_record() {
        let golden = include_str!("../../../tests/golden/audit-records.jsonl");
        let mut classes = std::collections::BTreeSet::new();
        for line in golden.lines() {
            let e = event(line.as_bytes(), "host-1");
            let class = e["class_uid"].as_u64().expect("class");
            let activity = e["activity_id"].as_u64().expect("activity");
            assert_eq!(e["type_uid"].as_u64(), Some(class * 100 + activity));
            assert_eq!(e["metadata"]["version"], OCSF_VERSION);
            let r: Value = serde_json::from_str(line).expect("json");
            assert_eq!(e["unmapped"], r, "the record whole");
            let want = match r["kind"].as_str() {
                Some("request") => 4002,
                Some("connection" | "close") => 4001,
                Some("query") => 4003,
                _ => 0,
            };
            assert_eq!(class, want, "{line}");
            classes.insert(class);
        }
        assert!(
            classes.contains(&4002) && classes.contains(&4001),
            "{classes:?}"
        );
        let junk = event(b"not json", "h");
        assert_eq!(junk["class_uid"], 0);
        assert_eq!(junk["raw_data"], "not json");
    }
}
