//! How a tunnel (raw TCP, passthrough TLS, an upgraded connection) ended: the `end` of its
//! close record, and what it moved.

/// How a tunnel ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum End {
    /// One side closed.
    Closed,
    /// Nothing moved either way for the idle timeout.
    IdleTimeout,
    /// A read or write failed (a reset, say).
    Error,
    /// A policy change no longer allows it.
    Revoked,
    /// The secret guard refused a WebSocket message and closed the connection.
    Refused,
}

impl End {
    /// The audit log's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            End::Closed => "closed",
            End::IdleTimeout => "idle_timeout",
            End::Error => "error",
            End::Revoked => "revoked",
            End::Refused => "refused",
        }
    }
}

/// What a relay moved, and how it ended: what a close record adds to its decision's.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// Bytes from the agent's side to the upstream's.
    pub up: u64,
    /// Bytes from the upstream's side to the agent's.
    pub down: u64,
    pub end: End,
    /// The failure, when `end` is `Error`.
    pub error: Option<std::io::Error>,
}
