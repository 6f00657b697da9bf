//! Original destinations asked of the root supervisor, for a split daemon whose lookup needs
//! root on every call (pf's `DIOCNATLOOK` on macOS).
//!
//! The worker sends the accepted socket itself (`SCM_RIGHTS`) over a Unix datagram pair,
//! never addresses: the supervisor reads both ends' addresses from the socket, refuses a
//! socket that was not accepted on one of its transparent listeners, asks the firewall, and
//! answers with the destination or an error. One question at a time per worker; an answer
//! that takes longer than `TIMEOUT` fails the connection (closed, like any lookup failure).

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;
use std::time::Duration;

use agenshield_pf::privsep as os;
use agenshield_pf::{OrigDst, OrigDstError};
use serde::{Deserialize, Serialize};

/// How long the worker waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
struct Question {
    id: u64,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dst: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    err: Option<String>,
}

/// The worker's side: an `OrigDst` that asks the supervisor.
pub struct BrokeredOrigDst {
    sock: Mutex<(UnixDatagram, u64)>,
}

impl BrokeredOrigDst {
    pub fn new(sock: UnixDatagram) -> std::io::Result<BrokeredOrigDst> {
        sock.set_read_timeout(Some(TIMEOUT))?;
        Ok(BrokeredOrigDst {
            sock: Mutex::new((sock, 0)),
        })
    }
}

/// What went wrong between the worker and the supervisor (the worker's side reports it as an
/// `OrigDstError::Lookup`; the supervisor's side sends its text in the answer).
#[derive(Debug, thiserror::Error)]
enum BrokerError {
    #[error("the supervisor channel is poisoned")]
    Poisoned,
    #[error(transparent)]
    Encode(serde_json::Error),
    #[error("unreadable answer from the supervisor: {0}")]
    Unreadable(#[source] serde_json::Error),
    /// The supervisor's answer: its [`BrokerError`] as text.
    #[error("{0}")]
    Refused(String),
    #[error("the supervisor gave no answer")]
    NoAnswer,
    #[error("expected one socket, got {0}")]
    NotOneSocket(usize),
    #[error(transparent)]
    SocketAddrs(std::io::Error),
    #[error("{0} is not a transparent listener: not looked up")]
    NotOurs(SocketAddr),
    #[error(transparent)]
    Lookup(OrigDstError),
}

fn lookup_err(e: BrokerError) -> OrigDstError {
    OrigDstError::Lookup(std::io::Error::other(e))
}

impl OrigDst for BrokeredOrigDst {
    fn orig_dst(
        &self,
        sock: BorrowedFd<'_>,
        _local: SocketAddr,
        _peer: SocketAddr,
    ) -> Result<SocketAddr, OrigDstError> {
        let mut guard = self
            .sock
            .lock()
            .map_err(|_| lookup_err(BrokerError::Poisoned))?;
        guard.1 += 1;
        let id = guard.1;
        let question =
            serde_json::to_vec(&Question { id }).map_err(|e| lookup_err(BrokerError::Encode(e)))?;
        os::send_fds(&guard.0, &question, &[sock]).map_err(OrigDstError::Lookup)?;
        let mut buf = [0u8; 512];
        loop {
            let n = guard.0.recv(&mut buf).map_err(OrigDstError::Lookup)?;
            let answer: Answer = serde_json::from_slice(&buf[..n])
                .map_err(|e| lookup_err(BrokerError::Unreadable(e)))?;
            // An answer to an earlier question that timed out: skip it.
            if answer.id < id {
                continue;
            }
            return match (answer.dst, answer.err) {
                (Some(dst), _) => Ok(dst),
                (None, err) => Err(lookup_err(
                    err.map_or(BrokerError::NoAnswer, BrokerError::Refused),
                )),
            };
        }
    }

    fn name(&self) -> &'static str {
        "supervisor"
    }
}

/// The supervisor's side: answers until the worker's end goes away. `listeners`: the
/// transparent listeners' addresses; a socket accepted anywhere else is refused.
pub fn serve(sock: UnixDatagram, listeners: Vec<SocketAddr>, lookup: Box<dyn OrigDst>) {
    loop {
        let (question, fds) = match os::recv_fds(&sock) {
            Ok(q) => q,
            Err(e) => {
                if e.kind() != std::io::ErrorKind::UnexpectedEof {
                    tracing::warn!("supervisor: original-destination channel: {e}");
                }
                return;
            }
        };
        let id = serde_json::from_slice::<Question>(&question).map_or(0, |q| q.id);
        let answer = match answer(&fds, &listeners, lookup.as_ref()) {
            Ok(dst) => Answer {
                id,
                dst: Some(dst),
                err: None,
            },
            Err(e) => Answer {
                id,
                dst: None,
                err: Some(e.to_string()),
            },
        };
        drop(fds);
        let Ok(bytes) = serde_json::to_vec(&answer) else {
            continue;
        };
        if let Err(e) = sock.send(&bytes) {
            tracing::warn!("supervisor: answering an original-destination lookup: {e}");
            return;
        }
    }
}

fn answer(
    fds: &[std::os::fd::OwnedFd],
    listeners: &[SocketAddr],
    lookup: &dyn OrigDst,
) -> Result<SocketAddr, BrokerError> {
    let [fd] = fds else {
        return Err(BrokerError::NotOneSocket(fds.len()));
    };
    let (local, peer) = os::socket_addrs(fd.as_fd()).map_err(BrokerError::SocketAddrs)?;
    let ours = listeners
        .iter()
        .any(|l| l.port() == local.port() && (l.ip().is_unspecified() || l.ip() == local.ip()));
    if !ours {
        return Err(BrokerError::NotOurs(local));
    }
    lookup
        .orig_dst(fd.as_fd(), local, peer)
        .map_err(BrokerError::Lookup)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenshield_pf::FixedOrigDst;

    fn pair() -> (UnixDatagram, UnixDatagram) {
        let (a, b) = os::datagram_pair().expect("pair");
        (UnixDatagram::from(a), UnixDatagram::from(b))
    }

    #[test]
    fn a_socket_accepted_on_a_listener_gets_the_supervisors_answer() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = listener.local_addr().expect("addr");
        let (worker, supervisor) = pair();
        let want: SocketAddr = "203.0.113.9:443".parse().expect("addr");
        std::thread::spawn(move || serve(supervisor, vec![at], Box::new(FixedOrigDst(want))));
        let broker = BrokeredOrigDst::new(worker).expect("broker");
        let _client = std::net::TcpStream::connect(at).expect("connect");
        let (accepted, peer) = listener.accept().expect("accept");
        let got = broker.orig_dst(accepted.as_fd(), at, peer).expect("answer");
        assert_eq!(got, want);
        // Twice: the channel carries one question after another.
        assert_eq!(
            broker.orig_dst(accepted.as_fd(), at, peer).expect("again"),
            want
        );
    }

    #[test]
    fn a_socket_from_elsewhere_is_refused() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = listener.local_addr().expect("addr");
        let other: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let (worker, supervisor) = pair();
        std::thread::spawn(move || {
            serve(
                supervisor,
                vec![other],
                Box::new(FixedOrigDst("203.0.113.9:443".parse().expect("addr"))),
            )
        });
        let broker = BrokeredOrigDst::new(worker).expect("broker");
        let _client = std::net::TcpStream::connect(at).expect("connect");
        let (accepted, peer) = listener.accept().expect("accept");
        let err = broker
            .orig_dst(accepted.as_fd(), at, peer)
            .expect_err("refused");
        assert!(
            err.to_string().contains("not a transparent listener"),
            "{err}"
        );
    }
}
