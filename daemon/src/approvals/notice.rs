//! What the webhook POSTs about a pending request, and its signature.
//!
//! The body is JSON: `id`, `agent` (`uid`, `name`), `method`, `url` (secrets redacted, query
//! values `[redacted]`), `host`, `rule`, `created`, `expires`, and `text`: one line that chat
//! incoming webhooks (Slack, Mattermost, Teams) display as the message.
//!
//! The signature: `X-AgenShield-Timestamp: <unix seconds>` and `X-AgenShield-Signature:
//! sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`. A receiver recomputes the MAC with the
//! shared key, compares in constant time and refuses a timestamp far from its clock (a
//! replayed POST carries an old one, and changing it breaks the MAC).

use serde::Serialize;

use super::PendingRequest;
use crate::clock::rfc3339;

/// The header carrying the MAC.
pub(crate) const SIGNATURE_HEADER: &str = "x-agenshield-signature";
/// The header carrying the time the MAC covers.
pub(crate) const TIMESTAMP_HEADER: &str = "x-agenshield-timestamp";

#[derive(Serialize)]
struct Agent<'a> {
    uid: Option<u32>,
    name: Option<&'a str>,
}

#[derive(Serialize)]
struct Notice<'a> {
    id: String,
    agent: Agent<'a>,
    method: &'a str,
    url: &'a str,
    host: &'a str,
    rule: &'a str,
    created: String,
    expires: String,
    text: String,
}

/// The JSON body for `req`; `agent_name`: the agent uid's user name, when known.
pub(crate) fn body(req: &PendingRequest, agent_name: Option<&str>) -> Vec<u8> {
    let a = &req.asked;
    let who = match (agent_name, a.agent_uid) {
        (Some(name), Some(uid)) => format!("agent {name} (uid {uid})"),
        (None, Some(uid)) => format!("agent uid {uid}"),
        _ => "an agent of unknown uid".to_string(),
    };
    let rule = if a.rule_id.is_empty() {
        crate::record::NO_RULE
    } else {
        &a.rule_id
    };
    let expires = rfc3339(req.expires);
    let text = format!(
        "AgenShield: {who} asks {} `{}` (rule {rule}). Approve before {expires}: \
         agenshield proxy ctl pending approve {} (or deny)",
        a.method,
        a.url.replace('`', "%60"),
        req.id
    );
    let notice = Notice {
        id: req.id.to_string(),
        agent: Agent {
            uid: a.agent_uid,
            name: agent_name,
        },
        method: &a.method,
        url: &a.url,
        host: &a.host,
        rule,
        created: rfc3339(req.since),
        expires,
        text: chat_safe(&text),
    };
    serde_json::to_vec(&notice).unwrap_or_else(|_| b"{}".to_vec())
}

/// One line, with what Slack reads as markup (`<!channel>`, links) escaped as its docs ask,
/// so an agent's path cannot ping a channel or forge a link.
fn chat_safe(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// `sha256=<hex>`: the HMAC-SHA256 with `key` of `"<timestamp>.<body>"`.
pub(crate) fn sign(key: &[u8], timestamp: u64, body: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, key);
    let mut ctx = ring::hmac::Context::with_key(&key);
    ctx.update(timestamp.to_string().as_bytes());
    ctx.update(b".");
    ctx.update(body);
    let tag = ctx.sign();
    let mut out = String::from("sha256=");
    for b in tag.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use time::OffsetDateTime;

    use super::*;
    use crate::approvals::{Asked, PendingId};

    fn pending(path: &str) -> PendingRequest {
        let since = OffsetDateTime::from_unix_timestamp(1_700_000_000).expect("time");
        PendingRequest {
            id: PendingId(7),
            since,
            expires: since + Duration::from_secs(60),
            asked: Asked {
                agent_uid: Some(1001),
                client: ([127, 0, 0, 1], 1).into(),
                method: "GET".into(),
                host: "api.test".into(),
                port: 443,
                path: path.into(),
                url: format!("https://api.test{path}?token=[redacted]"),
                rule_id: "ask-api".into(),
            },
        }
    }

    #[test]
    fn the_body_names_who_what_and_how_to_answer() {
        let b = body(&pending("/repos/x"), Some("ash_agent"));
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        assert_eq!(v["id"], "p7");
        assert_eq!(v["agent"]["uid"], 1001);
        assert_eq!(v["agent"]["name"], "ash_agent");
        assert_eq!(v["url"], "https://api.test/repos/x?token=[redacted]");
        assert_eq!(v["rule"], "ask-api");
        assert_eq!(v["created"], "2023-11-14T22:13:20.000Z");
        assert_eq!(v["expires"], "2023-11-14T22:14:20.000Z");
        let text = v["text"].as_str().expect("text");
        assert!(
            text.contains("agent ash_agent (uid 1001) asks GET"),
            "{text}"
        );
        assert!(text.contains("ctl pending approve p7"), "{text}");
        assert!(!text.contains('\n'));
    }

    #[test]
    fn an_agents_path_cannot_ping_a_channel() {
        let b = body(&pending("/<!channel>\n`x`"), None);
        let v: serde_json::Value = serde_json::from_slice(&b).expect("json");
        let text = v["text"].as_str().expect("text");
        assert!(text.contains("&lt;!channel&gt;"), "{text}");
        assert!(!text.contains('<') && !text.contains('\n'), "{text}");
        assert!(text.contains("agent uid 1001"), "{text}");
    }

    /// The MAC covers the timestamp, a dot and the body: a changed timestamp (a replay made
    /// to look fresh) does not verify. (The e2e test checks it against an HMAC written out
    /// from RFC 2104 over SHA-256, not this code.)
    #[test]
    fn the_signature_is_hmac_sha256_of_timestamp_dot_body() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k");
        let tag = ring::hmac::sign(&key, b"1700000000.{\"a\":1}");
        let hex: String = tag.as_ref().iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            sign(b"k", 1_700_000_000, b"{\"a\":1}"),
            format!("sha256={hex}")
        );
        assert_ne!(
            sign(b"k", 1_700_000_001, b"{\"a\":1}"),
            format!("sha256={hex}")
        );
    }
}
