//! What the proxy knows about one client connection: where it came from, where it was
//! headed, its TLS side once intercepted, and its owner. Plain facts, beneath every layer
//! that reads them (the accept loops, the pipeline, the DNS stub).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use std::sync::Arc;

use super::{ListenerKind, RecordBase, Redact};

/// Where the client was headed before we looked inside: the original destination of a
/// redirected connection (an address), or the authority of a CONNECT / absolute-URI request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DestHost {
    Ip(IpAddr),
    /// Already normalized (lowercase, no trailing dot).
    Name(String),
}

impl fmt::Display for DestHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DestHost::Ip(ip) => write!(f, "{ip}"),
            DestHost::Name(n) => f.write_str(n),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dest {
    pub host: DestHost,
    pub port: u16,
}

impl Dest {
    pub(crate) fn from_addr(addr: SocketAddr) -> Dest {
        Dest {
            host: DestHost::Ip(addr.ip()),
            port: addr.port(),
        }
    }
}

impl fmt::Display for Dest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            DestHost::Ip(IpAddr::V6(v6)) => write!(f, "[{v6}]:{}", self.port),
            h => write!(f, "{h}:{}", self.port),
        }
    }
}

/// The TLS side of an intercepted connection.
#[derive(Debug, Clone)]
pub(crate) struct TlsSide {
    pub sni: Option<String>,
    /// The host this connection may talk to: the SNI, else the destination. `Err` holds why
    /// the SNI and the destination disagree; every request on it is then refused.
    pub identity: Result<String, HostMismatch>,
}

/// A TLS server name that disagrees with the CONNECT host the tunnel was opened for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TLS server name {sni} does not match the CONNECT host {host}")]
pub(crate) struct HostMismatch {
    pub sni: String,
    pub host: String,
}

/// The facts are read freely; they change only through the `with_*` methods, which make the
/// base of its records again.
#[derive(Debug, Clone)]
pub(crate) struct ConnCtx {
    pub id: u64,
    pub client: SocketAddr,
    pub listener: ListenerKind,
    pub dest: Dest,
    pub tls: Option<TlsSide>,
    /// The local user that opened the connection (audit), when the OS could tell.
    pub agent_uid: Option<u32>,
    /// What every record of the connection shares, redacted with `set` as it was made.
    base: RecordBase,
}

impl ConnCtx {
    /// A connection accepted (`id`), its text redacted with `set` for its records.
    pub(crate) fn new<R: Redact>(
        id: u64,
        client: SocketAddr,
        listener: ListenerKind,
        dest: Dest,
        agent_uid: Option<u32>,
        set: &Arc<R>,
    ) -> ConnCtx {
        let base = RecordBase::new(id, listener, client, agent_uid, &dest, None, set);
        ConnCtx {
            id,
            client,
            listener,
            dest,
            tls: None,
            agent_uid,
            base,
        }
    }

    /// The base of its records, redacted with `set` (again, when `set` is not the one it
    /// was made with).
    pub(crate) fn base<R: Redact>(&self, set: &Arc<R>) -> std::borrow::Cow<'_, RecordBase> {
        if self.base.redacted_with(set) {
            std::borrow::Cow::Borrowed(&self.base)
        } else {
            std::borrow::Cow::Owned(self.rebased(set))
        }
    }

    fn rebased<R: Redact>(&self, set: &Arc<R>) -> RecordBase {
        let sni = self.tls.as_ref().and_then(|t| t.sni.as_deref());
        RecordBase::new(
            self.id,
            self.listener,
            self.client,
            self.agent_uid,
            &self.dest,
            sni,
            set,
        )
    }

    /// The same connection, served as `listener`'s.
    pub(crate) fn with_listener<R: Redact>(self, listener: ListenerKind, set: &Arc<R>) -> Self {
        let mut c = ConnCtx { listener, ..self };
        c.base = c.rebased(set);
        c
    }

    /// The same connection, headed for `dest` (a proxy request's).
    pub(crate) fn with_dest<R: Redact>(&self, dest: Dest, set: &Arc<R>) -> Self {
        let mut c = ConnCtx {
            dest,
            ..self.clone()
        };
        c.base = c.rebased(set);
        c
    }

    /// The same connection, its TLS intercepted.
    pub(crate) fn with_tls<R: Redact>(self, tls: TlsSide, set: &Arc<R>) -> Self {
        let mut c = ConnCtx {
            tls: Some(tls),
            ..self
        };
        c.base = c.rebased(set);
        c
    }
}
