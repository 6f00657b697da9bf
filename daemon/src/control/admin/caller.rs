//! Who sent an admin request, as logs name them: a local user (the socket's peer
//! credentials) or a client certificate (the HTTPS listener).

use std::fmt;
use std::net::SocketAddr;

#[derive(Debug, Clone)]
pub(crate) enum Caller {
    /// Over the Unix socket.
    Local { uid: u32 },
    /// Over the HTTPS listener: the certificate the client proved it holds.
    Remote {
        addr: SocketAddr,
        /// The certificate's subject, `CN=…, O=…`.
        subject: String,
        /// SHA-256 of its DER, as `ctl ca` shows fingerprints.
        fingerprint: String,
    },
}

impl Caller {
    /// The local user, when the caller is one.
    pub(crate) fn uid(&self) -> Option<u32> {
        match self {
            Caller::Local { uid } => Some(*uid),
            Caller::Remote { .. } => None,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Local { uid } => write!(f, "uid {uid}"),
            Caller::Remote {
                addr,
                subject,
                fingerprint,
            } => write!(
                f,
                "client certificate {subject} (SHA-256 {fingerprint}) from {addr}"
            ),
        }
    }
}
