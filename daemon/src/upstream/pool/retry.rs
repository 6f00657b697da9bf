//! When a request is sent again: only when the upstream provably did not process it, and at
//! most [`ATTEMPTS`] times in all.

use http::Request;

use super::h2_client::Unprocessed;
use super::PoolError;
use crate::body::ProxyBody;

/// Times a request is sent at most: the first, and again while the upstream provably did not
/// process it. More than two: a host's connections are opened together and loaded evenly, so
/// they reach a server's per-connection request limit together, and a request sent again after
/// one connection's `GOAWAY` can meet the next one's. Bounded so that an upstream refusing
/// every stream costs a few round trips, not a loop.
pub(super) const ATTEMPTS: u32 = 5;

/// A request that failed on its connection.
pub(super) enum Failed {
    /// The connection closed (or was going away) before the request was written: it comes
    /// back whole.
    NotSent(Box<Request<ProxyBody>>, PoolError),
    /// Sent, not processed, but its body is gone. Sent again only if it was kept.
    Unprocessed(Unprocessed, PoolError),
    /// The upstream may have processed it.
    Other(PoolError),
}

impl Failed {
    pub(super) fn into_error(self) -> PoolError {
        match self {
            Failed::NotSent(_, e) | Failed::Unprocessed(_, e) | Failed::Other(e) => e,
        }
    }
}

/// Why a request was sent again: the `reason` of `upstream_retries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retry {
    /// A pooled connection closed (or was going away) before taking it.
    NotSent,
    /// The upstream reset its stream with `REFUSED_STREAM`.
    Refused,
    /// Its stream was above the last stream id of the upstream's `GOAWAY`.
    GoAway,
}

impl Retry {
    pub(crate) const ALL: [Retry; 3] = [Retry::NotSent, Retry::Refused, Retry::GoAway];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Retry::NotSent => "not_sent",
            Retry::Refused => "refused",
            Retry::GoAway => "goaway",
        }
    }
}

impl From<Unprocessed> for Retry {
    fn from(why: Unprocessed) -> Retry {
        match why {
            Unprocessed::RefusedStream => Retry::Refused,
            Unprocessed::AboveGoAway => Retry::GoAway,
        }
    }
}
