//! Which listener accepted a connection: the `listener` of its records.

/// Which listener accepted the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ListenerKind {
    Transparent,
    Explicit,
    /// The agent's DNS stub.
    Dns,
}
