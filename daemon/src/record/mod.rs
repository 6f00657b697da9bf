//! The vocabulary every layer speaks: the record of one decision, the single shape from which
//! the log line, the `ctl tail` event, the audit entry and the metrics are all derived
//! (`docs/audit.md` documents it, and `docs/audit.schema.json` pins it), with its kinds,
//! verdicts and error codes. Outcomes are enums here; they become strings only when a record
//! is serialised or labelled.
//!
//! The bottom of the crate: this module imports nothing else from it, so every layer (the
//! engines, the data path, control) can import it without an import pointing up.

mod base;
mod budget;
mod conn;
mod dlp;
mod end;
mod error_code;
mod listener;
pub(crate) mod log;
mod mcp;
mod refusal;

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RecordType;
use serde::{Serialize, Serializer};

pub(crate) use base::{RecordBase, Redact, Stamp};
pub(crate) use budget::BudgetFacts;
pub(crate) use conn::{ConnCtx, Dest, DestHost, HostMismatch, TlsSide};
pub(crate) use dlp::{DlpAction, DlpFacts, DlpFinding, DlpPlace, DlpVerdict};
pub(crate) use end::{End, Relayed};
pub(crate) use error_code::ErrorCode;
pub(crate) use listener::ListenerKind;
pub(crate) use mcp::{McpFacts, McpRefusedMessage};
pub(crate) use refusal::{LimitScope, Refusal};

/// Shown where a rule id would be when no rule was consulted (a malformed request, a failed
/// handshake): in logs, metrics and tail. The audit log writes `null`.
pub const NO_RULE: &str = "-";

/// What a record is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum RecordKind {
    /// One HTTP request (plain or intercepted), with its response.
    Request,
    /// A connection decided as a whole: raw TCP, or one that ended before any request (a TLS
    /// handshake that failed, a request the HTTP server could not parse, a CONNECT refused).
    Connection,
    /// The end of a tunnel a decision allowed (raw TCP, an upgraded connection): its bytes
    /// and duration. Carries the id of that decision.
    Close,
    /// One DNS question the agent's DNS stub answered (or refused).
    Query,
}

impl RecordKind {
    /// The audit log's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            RecordKind::Request => "request",
            RecordKind::Connection => "connection",
            RecordKind::Close => "close",
            RecordKind::Query => "query",
        }
    }
}

/// What the agent speaks: one spelling everywhere (audit, `ctl tail`, metrics labels). A
/// record names what its decision saw (`Http`, `Https`, `Tcp`, `Tls`, `Dns`,
/// `TlsPassthrough`: the audit schema's set); an open connection, as the connection gauges
/// count it, names its wire protocol (`H1`, `H2`, `Ws`, `Tcp`, `TlsPassthrough`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Protocol {
    /// Plain HTTP (transparent, or an absolute URI on the explicit listener).
    Http,
    /// HTTP inside TLS we intercepted.
    Https,
    /// A connection serving HTTP/1.1 (plain or intercepted).
    H1,
    /// A connection serving HTTP/2.
    H2,
    /// A connection switched to WebSocket.
    Ws,
    /// Bytes that are neither TLS nor HTTP, relayed as they are.
    Tcp,
    /// A TLS handshake, when the connection ended in it.
    Tls,
    /// A query to the agent's DNS stub.
    Dns,
    /// TLS spliced to its server name without interception (`tls = "passthrough"`).
    #[serde(rename = "tls-passthrough")]
    TlsPassthrough,
}

impl Protocol {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Https => "https",
            Protocol::H1 => "h1",
            Protocol::H2 => "h2",
            Protocol::Ws => "ws",
            Protocol::Tcp => "tcp",
            Protocol::Tls => "tls",
            Protocol::Dns => "dns",
            Protocol::TlsPassthrough => "tls-passthrough",
        }
    }
}

/// What was decided: one spelling everywhere (audit, `ctl tail`, metrics labels).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Verdict {
    Allow,
    /// Refused: by policy, by the secret guard, or because the request was malformed or
    /// named something it may not (host mismatch, a forbidden address).
    Deny,
    /// Refused by a limit: a rule's rate or concurrency cap, the daemon's connection limit.
    Limited,
    /// An `ask` rule held it and an operator approved (now or earlier, remembered).
    AskApproved,
    AskDenied,
    AskTimeout,
    /// Allowed or not yet decided, then failed: upstream errors, TLS handshakes that failed,
    /// an unavailable secret or audit log.
    Error,
}

impl Verdict {
    pub(crate) const ALL: [Verdict; 7] = [
        Verdict::Allow,
        Verdict::Deny,
        Verdict::Limited,
        Verdict::AskApproved,
        Verdict::AskDenied,
        Verdict::AskTimeout,
        Verdict::Error,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Deny => "deny",
            Verdict::Limited => "limited",
            Verdict::AskApproved => "ask_approved",
            Verdict::AskDenied => "ask_denied",
            Verdict::AskTimeout => "ask_timeout",
            Verdict::Error => "error",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Verdict> {
        Verdict::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// Let through: the agent got what it asked for (or its tunnel was opened).
    pub(crate) fn is_allowed(self) -> bool {
        matches!(self, Verdict::Allow | Verdict::AskApproved)
    }
}

/// 64 random bits, shown as 16 hex digits: the id the agent sees in a refusal, and the one
/// that ties a close record to its decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestId(u64);

impl RequestId {
    pub(crate) fn random() -> RequestId {
        RequestId(rand::random())
    }

    #[cfg(test)]
    pub(crate) fn fixed(n: u64) -> RequestId {
        RequestId(n)
    }
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl Serialize for RequestId {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One decision (or the end of the tunnel it opened). Text that came from the agent (host,
/// SNI, method, path, destination) is redacted with the secret set before it is put here;
/// query values are redacted unless `audit.query_values = "keep"`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Record {
    pub kind: RecordKind,
    pub protocol: Protocol,
    /// When the request's head (or the connection) arrived: RFC 3339, UTC, milliseconds.
    pub started: Arc<str>,
    pub request_id: RequestId,
    pub conn_id: u64,
    pub listener: ListenerKind,
    pub client: SocketAddr,
    /// The local user that opened the connection, when the OS told us.
    pub agent_uid: Option<u32>,
    /// Where the agent was headed: the original destination (`ip:port`), or the CONNECT /
    /// absolute-URI authority on the explicit listener.
    pub dst: Arc<str>,
    pub sni: Option<Arc<str>>,
    /// The host the decision was about (normalized), and its port.
    pub host: Arc<str>,
    pub port: u16,
    /// Request records only.
    pub method: Option<String>,
    /// The normalized path (and query); request records only.
    pub path: Option<String>,
    /// The protocol a request asked to switch to (`websocket`), on its record and its close.
    pub upgrade: Option<Arc<str>>,
    pub decision: Verdict,
    /// The deciding rule: its id, `default` when the policy's default decided, `None` when no
    /// policy decision was reached (a malformed request, a failed handshake).
    pub rule: Option<Arc<str>>,
    pub policy: Arc<str>,
    /// The status the agent got (request records).
    pub status: Option<u16>,
    pub error_code: Option<ErrorCode>,
    /// The address we dialed, which the agent never chose.
    pub upstream: Option<SocketAddr>,
    /// Names (never values) of the secrets injected or swapped into the request.
    pub secrets: Vec<Arc<str>>,
    pub bytes_up: u64,
    pub bytes_down: u64,
    /// Request: head to end of response. Connection: accept to decision. Close: the
    /// tunnel's whole life. Milliseconds, to the microsecond.
    #[serde(serialize_with = "micros")]
    pub ms: f64,
    /// The response did not complete: the client went away, or the upstream failed mid-body.
    pub incomplete: bool,
    /// Let through only because the policy is in report mode: enforcing, it would have been
    /// refused. Written only when true.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub would_deny: bool,
    /// Refused by a rate: whose bucket (`local`, `fleet`, `local_fallback`). Written only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_scope: Option<LimitScope>,
    /// Under a rule's token budget: this request's tokens and the budget's standing.
    /// Written only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetFacts>,
    /// Close records: how the tunnel ended.
    pub end: Option<End>,
    /// DNS query records only: the question and the answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsFacts>,
    /// Credentials found in the request (format and place, never a value), and what was
    /// done. Written only when one was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dlp: Option<DlpFacts>,
    /// Requests under a rule with `mcp`: the JSON-RPC method and tool decided. Written only then.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpFacts>,
    /// Why, in words, for the log line (a refusal's message, a failure's cause); redacted.
    #[serde(skip)]
    pub reason: Option<String>,
}

/// What a DNS query record adds: the question's type, the response code the agent got, and
/// the addresses it was given (after the private-address guard).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DnsFacts {
    /// `A`, `AAAA`, `HTTPS`, … as the question named it; `None` (written `-`) when no
    /// question could be read.
    #[serde(serialize_with = "qtype_name")]
    pub qtype: Option<RecordType>,
    /// Written `NOERROR`, `NXDOMAIN`, `REFUSED`, `SERVFAIL`, `FORMERR` or `NOTIMP`.
    #[serde(serialize_with = "rcode_name")]
    pub rcode: ResponseCode,
    pub answers: Vec<std::net::IpAddr>,
}

impl DnsFacts {
    /// The question's type as records show it.
    pub(crate) fn qtype_str(&self) -> String {
        self.qtype
            .map_or_else(|| "-".to_string(), |t| t.to_string())
    }

    /// The response code as records show it.
    pub(crate) fn rcode_str(&self) -> &'static str {
        rcode_str(self.rcode)
    }
}

/// The response code as dig prints it.
pub(crate) fn rcode_str(rcode: ResponseCode) -> &'static str {
    match rcode {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::NotImp => "NOTIMP",
        _ => "OTHER",
    }
}

fn qtype_name<S: Serializer>(t: &Option<RecordType>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.collect_str(t),
        None => s.serialize_str("-"),
    }
}

fn rcode_name<S: Serializer>(r: &ResponseCode, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(rcode_str(*r))
}

impl Record {
    /// The record of this tunnel's end, `bytes` relayed (up, down) over `ms`.
    pub(crate) fn closed(&self, up: u64, down: u64, ms: f64, end: End) -> Record {
        Record {
            kind: RecordKind::Close,
            bytes_up: up,
            bytes_down: down,
            ms,
            end: Some(end),
            reason: None,
            status: None,
            error_code: None,
            limit_scope: None,
            budget: None,
            ..self.clone()
        }
    }
}

/// Milliseconds rounded to the microsecond, so a record never shows float noise
/// (`0.30000000000000004`).
fn micros<S: Serializer>(ms: &f64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(rounded_ms(*ms))
}

/// Milliseconds to the microsecond, so `0.062` is written, not `0.06234100000000001`.
pub(crate) fn rounded_ms(ms: f64) -> f64 {
    (ms * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `docs/audit.schema.json` names every value the record can take, no more.
    #[test]
    fn the_published_schema_lists_exactly_the_values_records_take() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/audit.schema.json");
        let text = std::fs::read_to_string(path).expect("the schema");
        let schema: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let props = &schema["$defs"]["record"]["properties"];
        let listed = |field: &str| -> Vec<String> {
            let mut v: Vec<String> = props[field]["enum"]
                .as_array()
                .unwrap_or_else(|| panic!("{field} is an enum in the schema"))
                .iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect();
            v.sort();
            v
        };
        let sorted = |mut v: Vec<String>| {
            v.sort();
            v
        };
        assert_eq!(
            listed("decision"),
            sorted(
                Verdict::ALL
                    .iter()
                    .map(|v| v.as_str().to_string())
                    .collect()
            )
        );
        assert_eq!(
            listed("error_code"),
            sorted(
                ErrorCode::ALL
                    .iter()
                    .map(|c| c.as_str().to_string())
                    .collect()
            )
        );
        for c in ErrorCode::ALL {
            assert_eq!(json(&c), c.as_str(), "serialised as named");
        }
        assert_eq!(
            listed("protocol"),
            sorted(
                [
                    Protocol::Http,
                    Protocol::Https,
                    Protocol::Tcp,
                    Protocol::Tls,
                    Protocol::Dns,
                    Protocol::TlsPassthrough
                ]
                .iter()
                .map(json)
                .collect()
            )
        );
        assert_eq!(
            listed("kind"),
            sorted(
                [
                    RecordKind::Request,
                    RecordKind::Connection,
                    RecordKind::Close,
                    RecordKind::Query
                ]
                .iter()
                .map(json)
                .collect()
            )
        );
        assert_eq!(
            listed("end"),
            sorted(
                [
                    End::Closed,
                    End::IdleTimeout,
                    End::Error,
                    End::Revoked,
                    End::Refused
                ]
                .iter()
                .map(json)
                .collect()
            )
        );
    }

    /// A unit variant serialised: its JSON string.
    fn json<T: Serialize>(x: &T) -> String {
        serde_json::to_value(x)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}
