//! The admin API: HTTP/1.1 with JSON over a Unix socket. Every connection's peer credentials
//! are checked (root, the daemon's own uid and the admin group are served; an agent uid is
//! refused even if the socket's mode is loosened). The same routes over HTTPS with client
//! certificates when `listen.admin_https` is set (`https.rs`).

mod auth;
mod caller;
mod https;
mod mcp;
mod routes;
mod secrets;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{UnixListener, UnixStream};

pub(crate) use auth::AdminAuth;
pub use https::{check_tls as check_https_tls, HttpsError};
pub(crate) use https::{serve as serve_https, AdminHttps};

use caller::Caller;

use crate::proxy::Proxy;

// The group whose members may use the admin socket (and the explicit listener).
pub use crate::admission::ADMIN_GROUP;

/// What `status` reports beyond the proxy's own state.
pub(crate) struct DaemonInfo {
    pub started: Instant,
    pub transparent: Vec<std::net::SocketAddr>,
    pub explicit: std::net::SocketAddr,
    pub dns: Vec<std::net::SocketAddr>,
    pub metrics: Option<std::net::SocketAddr>,
    pub socket: PathBuf,
    /// The HTTPS listener's address, when `listen.admin_https` is set.
    pub admin_https: Option<std::net::SocketAddr>,
    pub firewall: Option<crate::control::firewall_view::FirewallView>,
    /// The CA certificate's file.
    pub ca_path: PathBuf,
}

pub(crate) struct Admin {
    pub proxy: Arc<Proxy>,
    pub info: DaemonInfo,
    auth: AdminAuth,
}

/// Binds the socket (replacing a stale one, refusing to displace a live daemon) with mode
/// 0660 and, when the admin group exists, group ownership by it.
pub(crate) async fn bind(path: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if served(path).await {
            anyhow::bail!(
                "another daemon is serving the admin socket {} (stop it first, or give this \
                 one another listen.admin)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding admin socket {}", path.display()))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    if let Ok(Some(group)) = nix::unistd::Group::from_name(ADMIN_GROUP) {
        match nix::unistd::chown(path, None, Some(group.gid)) {
            Ok(()) => {}
            // A daemon run by a user outside the group may not give the socket to it: the
            // socket stays with the user's own group (0660), which root and the user can
            // still use. Said once, with the fix; not a reason to refuse to start.
            Err(nix::errno::Errno::EPERM) => tracing::warn!(
                "the admin socket {} stays with this user's group: only members of {ADMIN_GROUP} \
                 may give it to {ADMIN_GROUP}, so its members cannot use this daemon's ctl \
                 (root and this user can). To share it: sudo usermod -aG {ADMIN_GROUP} $USER, \
                 then log in again",
                path.display()
            ),
            Err(e) => {
                return Err(anyhow::Error::new(e)
                    .context(format!("giving {} to group {ADMIN_GROUP}", path.display())))
            }
        }
    }
    Ok(listener)
}

/// A daemon answers on the admin socket `path` (then `bind` refuses to displace it).
pub async fn served(path: &Path) -> bool {
    UnixStream::connect(path).await.is_ok()
}

pub(crate) async fn serve(listener: UnixListener, admin: Arc<Admin>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("admin accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let admin = admin.clone();
        tokio::spawn(async move {
            let verdict = stream
                .peer_cred()
                .map_err(|e| auth::Refused::NoCredentials(e.to_string()))
                .and_then(|cred| {
                    admin
                        .auth
                        .check(cred.uid(), cred.gid())
                        .map(|()| Caller::Local { uid: cred.uid() })
                });
            let svc = service_fn(move |req| {
                let admin = admin.clone();
                let verdict = verdict.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(match verdict {
                        Ok(caller) => routes::route(&admin, &caller, req).await,
                        Err(why) => {
                            tracing::warn!("admin socket: refused: {why}");
                            routes::forbidden(&why.to_string())
                        }
                    })
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!("admin connection ended: {e}");
            }
        });
    }
}

impl Admin {
    pub(crate) fn new(proxy: Arc<Proxy>, info: DaemonInfo, auth: AdminAuth) -> Admin {
        Admin { proxy, info, auth }
    }
}
