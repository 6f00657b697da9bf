//! The process's tracing subscriber: the log lines on stderr, filtered by `AGENSHIELD_LOG`
//! (`log_filter`), and beside them, whatever that filter says, the counter of the 431s h2
//! sends by itself (`conn::h2_own_431`), so that each is recorded.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

/// Why logging could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error(transparent)]
    Filter(#[from] crate::log_filter::FilterError),
    /// A subscriber was installed already.
    #[error("logging: {0}")]
    Init(#[source] tracing_subscriber::util::TryInitError),
}

/// Installs the subscriber. Errors: the log filter is set but unusable (`log_filter`).
/// How log lines on stderr are written (`--log-format`): `text` for people, `json` (one
/// object per line) for a log collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn init(format: LogFormat) -> Result<(), LoggingError> {
    let filter = crate::log_filter::from_env()?;
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false);
    let lines = match format {
        LogFormat::Json => lines.json().with_current_span(false).boxed(),
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
    };
    tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(crate::conn::h2_own_431::layer())
        .try_init()
        .map_err(LoggingError::Init)
}
