//! Telling the service manager the daemon is ready: systemd's `Type=notify` waits for
//! `READY=1` on `$NOTIFY_SOCKET`, sent once every listener is bound and served, so units
//! ordered after ours (and `systemctl start`) wait for a proxy that answers.
//!
//! A split daemon's worker does not talk to systemd (the unit keeps `NotifyAccess=main`: only
//! the root supervisor may): it tells the supervisor on their control socket, and the
//! supervisor sends `READY=1`. Without `NOTIFY_SOCKET` (a start by hand, launchd, a test)
//! nothing is sent.

use tokio::io::AsyncWriteExt;

/// The line a worker writes to its supervisor once it serves.
pub const READY_LINE: &str = "{\"ready\":true}\n";

/// Who hears that this process is serving.
pub enum Readiness {
    /// The service manager, if it asked (`NOTIFY_SOCKET`).
    ServiceManager,
    /// The supervisor of this worker, on their control socket.
    Supervisor(tokio::net::unix::OwnedWriteHalf),
}

impl Readiness {
    pub async fn ready(self) {
        match self {
            Readiness::ServiceManager => notify_service_manager(),
            Readiness::Supervisor(mut w) => {
                if let Err(e) = w.write_all(READY_LINE.as_bytes()).await {
                    tracing::warn!("telling the supervisor the worker is ready: {e}");
                }
            }
        }
    }
}

/// `READY=1` to `$NOTIFY_SOCKET`, when it is set. The variable stays (removing it while other
/// threads may read the environment is not sound); what this process starts later may
/// inherit it, and systemd ignores their messages (`NotifyAccess=main`). The worker of a split
/// daemon is started without it.
pub fn notify_service_manager() {
    #[cfg(target_os = "linux")]
    {
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return;
        }
        match sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
            Ok(()) => tracing::debug!("told the service manager we are ready"),
            Err(e) => tracing::warn!("telling the service manager we are ready: {e}"),
        }
    }
}
