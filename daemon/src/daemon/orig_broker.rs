//! Lookups asked of the root supervisor, for a split daemon whose lookups need root: original
//! destinations where every call does (pf's `DIOCNATLOOK` on macOS), and conntrack's original
//! tuple of a connection (ctnetlink needs `CAP_NET_ADMIN`), asked on Linux only when the
//! agent's socket was not found where the proxy saw it (nf_nat moved its source port).
//!
//! The worker sends the accepted socket itself (`SCM_RIGHTS`) over a Unix datagram pair,
//! never addresses: the supervisor reads both ends' addresses from the socket, refuses a
//! socket that was not accepted on one of its transparent listeners (or, for a tuple, on the
//! DNS stub's TCP listener), asks the firewall (or conntrack), and answers or says why not. One question at a time per worker; an answer
//! that takes longer than `TIMEOUT` fails the lookup (a destination: the connection is
//! closed; a tuple: its owner stays unknown and it is refused).

use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixDatagram;
use std::sync::Mutex;
use std::time::Duration;

use agenshield_pf::privsep as os;
use agenshield_pf::{OrigDst, OrigDstError, OrigTuple};
use serde::{Deserialize, Serialize};

/// How long the worker waits for an answer.
const TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize, Deserialize)]
struct Question {
    id: u64,
    #[serde(default)]
    ask: Ask,
}

/// What a question asks about the socket it carries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Ask {
    /// Its original destination.
    #[default]
    Dst,
    /// Conntrack's original tuple (`src` and `dst` in the answer; neither: not tracked).
    Tuple,
}

#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    id: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    dst: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    src: Option<SocketAddr>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    err: Option<String>,
}

/// The worker's side: an `OrigDst` that asks the supervisor.
pub struct BrokeredOrigDst {
    sock: Mutex<(UnixDatagram, u64)>,
    /// Where the worker finds original destinations itself (Linux: `SO_ORIGINAL_DST` works
    /// unprivileged), asking the supervisor only for conntrack tuples. `None`: it asks for
    /// both.
    own_dst: Option<Box<dyn OrigDst>>,
}

impl BrokeredOrigDst {
    /// Asks the supervisor for everything.
    pub fn new(sock: UnixDatagram) -> std::io::Result<BrokeredOrigDst> {
        sock.set_read_timeout(Some(TIMEOUT))?;
        Ok(BrokeredOrigDst {
            sock: Mutex::new((sock, 0)),
            own_dst: None,
        })
    }

    /// Finds original destinations with `own`, asks the supervisor for conntrack tuples.
    pub fn tuples_only(sock: UnixDatagram, own: Box<dyn OrigDst>) -> std::io::Result<Self> {
        Ok(BrokeredOrigDst {
            own_dst: Some(own),
            ..Self::new(sock)?
        })
    }

    /// One question about `sock`, and the supervisor's answer to it.
    fn ask(&self, sock: BorrowedFd<'_>, ask: Ask) -> Result<Answer, OrigDstError> {
        let mut guard = self
            .sock
            .lock()
            .map_err(|_| lookup_err(BrokerError::Poisoned))?;
        guard.1 += 1;
        let id = guard.1;
        let question = serde_json::to_vec(&Question { id, ask })
            .map_err(|e| lookup_err(BrokerError::Encode(e)))?;
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
            return match answer.err {
                Some(err) => Err(lookup_err(BrokerError::Refused(err))),
                None => Ok(answer),
            };
        }
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
    #[error("{0} is not a transparent listener (nor, for a tuple, the DNS stub's): not looked up")]
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
        local: SocketAddr,
        peer: SocketAddr,
    ) -> Result<SocketAddr, OrigDstError> {
        if let Some(own) = &self.own_dst {
            return own.orig_dst(sock, local, peer);
        }
        self.ask(sock, Ask::Dst)?
            .dst
            .ok_or_else(|| lookup_err(BrokerError::NoAnswer))
    }

    fn orig_tuple(
        &self,
        sock: BorrowedFd<'_>,
        _local: SocketAddr,
        _peer: SocketAddr,
    ) -> Result<Option<OrigTuple>, OrigDstError> {
        let answer = self.ask(sock, Ask::Tuple)?;
        Ok(match (answer.src, answer.dst) {
            (Some(src), Some(dst)) => Some(OrigTuple { src, dst }),
            _ => None,
        })
    }

    fn name(&self) -> &'static str {
        match &self.own_dst {
            None => "supervisor",
            Some(_) => "so_original_dst, conntrack tuples from the supervisor",
        }
    }
}

/// Where the sockets the supervisor answers about were accepted; a socket accepted anywhere
/// else is refused.
#[derive(Debug, Clone, Default)]
pub struct Listening {
    /// The transparent listeners: both questions.
    pub transparent: Vec<SocketAddr>,
    /// The DNS stub's TCP listeners: tuples only (the worker reads their destinations).
    pub dns: Vec<SocketAddr>,
}

impl Listening {
    fn answers(&self, ask: Ask, local: SocketAddr) -> bool {
        let on = |l: &SocketAddr| {
            l.port() == local.port() && (l.ip().is_unspecified() || l.ip() == local.ip())
        };
        self.transparent.iter().any(on) || (ask == Ask::Tuple && self.dns.iter().any(on))
    }
}

/// The supervisor's side: answers until the worker's end goes away.
pub fn serve(sock: UnixDatagram, listeners: Listening, lookup: Box<dyn OrigDst>) {
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
        let (id, ask) =
            serde_json::from_slice::<Question>(&question).map_or((0, Ask::Dst), |q| (q.id, q.ask));
        let answer = match answer(&fds, &listeners, lookup.as_ref(), ask) {
            Ok((src, dst)) => Answer {
                id,
                dst,
                src,
                err: None,
            },
            Err(e) => Answer {
                id,
                dst: None,
                src: None,
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

/// The answer to `ask` about the one socket in `fds`: `(src, dst)`, the source only for a
/// tuple (`(None, None)`: conntrack does not track the connection).
type Ends = (Option<SocketAddr>, Option<SocketAddr>);

fn answer(
    fds: &[std::os::fd::OwnedFd],
    listeners: &Listening,
    lookup: &dyn OrigDst,
    ask: Ask,
) -> Result<Ends, BrokerError> {
    let [fd] = fds else {
        return Err(BrokerError::NotOneSocket(fds.len()));
    };
    let (local, peer) = os::socket_addrs(fd.as_fd()).map_err(BrokerError::SocketAddrs)?;
    if !listeners.answers(ask, local) {
        return Err(BrokerError::NotOurs(local));
    }
    match ask {
        Ask::Dst => lookup
            .orig_dst(fd.as_fd(), local, peer)
            .map(|dst| (None, Some(dst)))
            .map_err(BrokerError::Lookup),
        Ask::Tuple => lookup
            .orig_tuple(fd.as_fd(), local, peer)
            .map(|t| t.map_or((None, None), |t| (Some(t.src), Some(t.dst))))
            .map_err(BrokerError::Lookup),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agenshield_pf::FixedOrigDst;

    fn only(transparent: SocketAddr) -> Listening {
        Listening {
            transparent: vec![transparent],
            dns: Vec::new(),
        }
    }

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
        std::thread::spawn(move || serve(supervisor, only(at), Box::new(FixedOrigDst(want))));
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

    /// A lookup that knows one conntrack tuple (and no destination).
    struct KnownTuple(OrigTuple);

    impl OrigDst for KnownTuple {
        fn orig_dst(
            &self,
            _sock: BorrowedFd<'_>,
            _local: SocketAddr,
            _peer: SocketAddr,
        ) -> Result<SocketAddr, OrigDstError> {
            Err(OrigDstError::Unsupported("asked for a destination"))
        }

        fn orig_tuple(
            &self,
            _sock: BorrowedFd<'_>,
            _local: SocketAddr,
            _peer: SocketAddr,
        ) -> Result<Option<OrigTuple>, OrigDstError> {
            Ok(Some(self.0))
        }

        fn name(&self) -> &'static str {
            "known tuple"
        }
    }

    /// Linux's split: the worker reads destinations itself and asks the supervisor only for
    /// conntrack tuples; a lookup that tracks nothing answers `None`.
    #[test]
    fn tuples_are_asked_of_the_supervisor_and_destinations_are_not() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let at = listener.local_addr().expect("addr");
        let tuple = OrigTuple {
            src: "127.0.0.1:41234".parse().expect("addr"),
            dst: "127.0.0.2:8443".parse().expect("addr"),
        };
        let (worker, supervisor) = pair();
        std::thread::spawn(move || serve(supervisor, only(at), Box::new(KnownTuple(tuple))));
        let own: SocketAddr = "203.0.113.9:443".parse().expect("addr");
        let broker =
            BrokeredOrigDst::tuples_only(worker, Box::new(FixedOrigDst(own))).expect("broker");
        let _client = std::net::TcpStream::connect(at).expect("connect");
        let (accepted, peer) = listener.accept().expect("accept");
        assert_eq!(
            broker.orig_dst(accepted.as_fd(), at, peer).expect("own"),
            own
        );
        assert_eq!(
            broker
                .orig_tuple(accepted.as_fd(), at, peer)
                .expect("answer"),
            Some(tuple)
        );

        let (worker, supervisor) = pair();
        std::thread::spawn(move || serve(supervisor, only(at), Box::new(FixedOrigDst(own))));
        let broker = BrokeredOrigDst::new(worker).expect("broker");
        assert_eq!(
            broker
                .orig_tuple(accepted.as_fd(), at, peer)
                .expect("answer"),
            None
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
                only(other),
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
