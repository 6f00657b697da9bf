//! A decision's record is built one way: from the fields every record of its connection
//! shares (ids, addresses, owner, SNI), made once and already redacted (at accept; again once
//! the TLS side or, on the explicit listener, a request's destination is known; per question
//! on the DNS stub), with one constructor per outcome instead of a struct literal per call
//! site.
//!
//! Redacted with the secret set in force when it was made: `redacted_with` tells whether
//! that set is still the one in force, so a record is never built from a base redacted with
//! a set a secret has since joined.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use super::{
    Dest, DnsFacts, ListenerKind, Protocol, Record, RecordKind, Refusal, Relayed, RequestId,
    Verdict,
};

/// What hides secret values in text the agent wrote (the secret set in force).
pub(crate) trait Redact: Send + Sync + 'static {
    fn redact<'a>(&self, text: &'a str) -> Cow<'a, str>;
}

/// What sets one record apart from the others of its connection: its id, when its decision
/// started, and the policy it was made under.
#[derive(Debug, Clone)]
pub(crate) struct Stamp {
    pub id: RequestId,
    /// RFC 3339, UTC, milliseconds (`crate::clock`).
    pub started: Arc<str>,
    /// The policy's hash.
    pub policy: Arc<str>,
}

/// The fields every record of one connection shares, redacted.
#[derive(Debug, Clone)]
pub(crate) struct RecordBase {
    conn_id: u64,
    listener: ListenerKind,
    client: SocketAddr,
    agent_uid: Option<u32>,
    /// The destination, `host:port`.
    dst: Arc<str>,
    sni: Option<Arc<str>>,
    /// The destination's host.
    host: Arc<str>,
    port: u16,
    redacted_with: Weak<dyn Redact>,
}

impl RecordBase {
    /// The base of connection `conn_id`'s records, its text redacted with `set`.
    pub(crate) fn new<R: Redact>(
        conn_id: u64,
        listener: ListenerKind,
        client: SocketAddr,
        agent_uid: Option<u32>,
        dest: &Dest,
        sni: Option<&str>,
        set: &Arc<R>,
    ) -> RecordBase {
        let weak: Weak<R> = Arc::downgrade(set);
        RecordBase {
            conn_id,
            listener,
            client,
            agent_uid,
            dst: set.redact(&dest.to_string()).into(),
            sni: sni.map(|s| set.redact(s).into()),
            host: set.redact(&dest.host.to_string()).into(),
            port: dest.port,
            redacted_with: weak,
        }
    }

    /// Whether it was redacted with `set`.
    pub(crate) fn redacted_with<R: Redact>(&self, set: &Arc<R>) -> bool {
        std::ptr::addr_eq(self.redacted_with.as_ptr(), Arc::as_ptr(set))
    }

    /// The destination's host, as records show it.
    pub(crate) fn host(&self) -> &Arc<str> {
        &self.host
    }

    /// A record of `kind` about `host`, not decided yet (`Error`): the caller's outcome fills
    /// in the rest.
    fn record(&self, kind: RecordKind, protocol: Protocol, host: Arc<str>, at: Stamp) -> Record {
        Record {
            kind,
            protocol,
            started: at.started,
            request_id: at.id,
            conn_id: self.conn_id,
            listener: self.listener,
            client: self.client,
            agent_uid: self.agent_uid,
            dst: self.dst.clone(),
            sni: self.sni.clone(),
            host,
            port: self.port,
            method: None,
            path: None,
            upgrade: None,
            decision: Verdict::Error,
            rule: None,
            policy: at.policy,
            status: None,
            error_code: None,
            upstream: None,
            secrets: Vec::new(),
            bytes_up: 0,
            bytes_down: 0,
            ms: 0.0,
            incomplete: false,
            would_deny: false,
            limit_scope: None,
            budget: None,
            end: None,
            dns: None,
            dlp: None,
            mcp: None,
            reason: None,
        }
    }

    /// An HTTP request's record, about `host` (the target's, once known, else the
    /// destination's): the caller fills in what its phases learned.
    pub(crate) fn request(&self, protocol: Protocol, host: Option<Arc<str>>, at: Stamp) -> Record {
        let host = host.unwrap_or_else(|| self.host.clone());
        self.record(RecordKind::Request, protocol, host, at)
    }

    /// A connection decided as a whole by `rule` (raw TCP, passthrough TLS) about `host`:
    /// undecided until it is dialed (`Record::allowed`) or refused (`Record::refused`).
    pub(crate) fn decided(
        &self,
        protocol: Protocol,
        host: Arc<str>,
        rule: Option<Arc<str>>,
        at: Stamp,
    ) -> Record {
        Record {
            rule,
            ..self.record(RecordKind::Connection, protocol, host, at)
        }
    }

    /// A connection refused before anything about it was decided (by admission, by the HTTP
    /// server, in its TLS handshake): `r`'s verdict, code and message (redacted by the
    /// caller).
    pub(crate) fn refused(&self, protocol: Protocol, r: &Refusal, at: Stamp) -> Record {
        let host = self.host.clone();
        self.record(RecordKind::Connection, protocol, host, at)
            .refused(r)
    }

    /// One DNS question about `host` and its answer.
    pub(crate) fn query(&self, host: Arc<str>, facts: DnsFacts, at: Stamp) -> Record {
        Record {
            dns: Some(facts),
            ..self.record(RecordKind::Query, Protocol::Dns, host, at)
        }
    }
}

impl Record {
    /// Refused by `r`: its verdict, error code and message (redacted by the caller).
    pub(crate) fn refused(mut self, r: &Refusal) -> Record {
        self.decision = r.verdict;
        self.error_code = Some(r.code);
        self.limit_scope = r.limit_scope;
        self.reason = Some(r.message.clone());
        self
    }

    /// The close record of the tunnel this record's decision opened: what `relayed` moved
    /// over `ms`, and how it ended.
    pub(crate) fn ended(&self, relayed: &Relayed, ms: f64) -> Record {
        self.closed(relayed.up, relayed.down, ms, relayed.end)
    }
}
