//! What the proxy knows about one client connection: where it came from, where it was
//! headed, its TLS side once intercepted, and its owner. Plain facts, beneath every layer
//! that reads them (the accept loops, the pipeline, the DNS stub).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use super::ListenerKind;

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
    pub identity: Result<String, String>,
}

#[derive(Debug, Clone)]
pub(crate) struct ConnCtx {
    pub id: u64,
    pub client: SocketAddr,
    pub listener: ListenerKind,
    pub dest: Dest,
    pub tls: Option<TlsSide>,
    /// The local user that opened the connection (audit), when the OS could tell.
    pub agent_uid: Option<u32>,
}
