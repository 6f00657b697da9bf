//! Talking to the daemon's admin API: its Unix socket, or (`--remote`) its HTTPS listener
//! with a client certificate (`remote.rs`).

use std::path::{Path, PathBuf};

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::UnixStream;

use super::remote::Remote;

#[derive(Debug, thiserror::Error)]
pub enum CtlError {
    #[error("the daemon is not running (no one answers on {0})")]
    NotRunning(PathBuf),
    #[error("permission denied on {0}: run as root or as a member of agenshield-admin")]
    NoAccess(PathBuf),
    #[error("{0}")]
    Refused(String),
    /// The daemon answered 400: the request itself was bad.
    #[error("{0}")]
    BadInput(String),
    #[error("talking to the daemon: {0}")]
    Protocol(String),
    /// `--remote`: no connection, or the TLS handshake failed (a certificate refused).
    #[error("{0}")]
    Unreachable(String),
}

pub struct Client {
    target: Target,
}

enum Target {
    Socket(PathBuf),
    Remote(Box<Remote>),
}

impl Client {
    pub fn new(socket: &Path) -> Client {
        Client {
            target: Target::Socket(socket.to_path_buf()),
        }
    }

    /// The daemon's HTTPS admin listener at `remote`.
    pub fn remote(remote: Remote) -> Client {
        Client {
            target: Target::Remote(Box::new(remote)),
        }
    }

    /// Sends one request; the response body is left to the caller (it may stream).
    pub async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<(StatusCode, Incoming), CtlError> {
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        self.send_raw(method, path, Bytes::from(bytes), "application/json")
            .await
    }

    /// Sends `body` as is (a secret value, say: it is never copied into a JSON string).
    pub async fn send_raw(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        content_type: &'static str,
    ) -> Result<(StatusCode, Incoming), CtlError> {
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(
                http::header::HOST,
                match &self.target {
                    Target::Socket(_) => "agenshield".to_string(),
                    Target::Remote(r) => r.authority(),
                },
            )
            .header(http::header::CONTENT_TYPE, content_type)
            .body(Full::new(body))
            .map_err(|e| CtlError::Protocol(e.to_string()))?;
        let resp = match &self.target {
            Target::Socket(socket) => {
                let stream = UnixStream::connect(socket)
                    .await
                    .map_err(|e| match e.kind() {
                        std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                            CtlError::NotRunning(socket.clone())
                        }
                        std::io::ErrorKind::PermissionDenied => CtlError::NoAccess(socket.clone()),
                        _ => CtlError::Protocol(format!("{}: {e}", socket.display())),
                    })?;
                exchange(stream, req).await?
            }
            Target::Remote(remote) => exchange(remote.connect().await?, req)
                .await
                .map_err(|e| remote.closed(&e))?,
        };
        let status = resp.status();
        if status == StatusCode::FORBIDDEN {
            let text = resp
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            return Err(CtlError::Refused(error_text(&text)));
        }
        Ok((status, resp.into_body()))
    }

    /// Sends a request and reads a JSON answer; a non-2xx answer becomes `Err` with the
    /// daemon's message.
    pub async fn json(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, CtlError> {
        let (status, body) = self.send(method, path, body).await?;
        read_json(status, body).await
    }
}

/// One request on a fresh HTTP/1.1 connection over `io`.
async fn exchange<T>(io: T, req: Request<Full<Bytes>>) -> Result<http::Response<Incoming>, CtlError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| CtlError::Protocol(e.to_string()))?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
        .send_request(req)
        .await
        .map_err(|e| CtlError::Protocol(e.to_string()))
}

/// A JSON answer; a non-2xx answer becomes `Err` with the daemon's message.
pub(super) async fn read_json(
    status: StatusCode,
    body: Incoming,
) -> Result<serde_json::Value, CtlError> {
    let bytes = body
        .collect()
        .await
        .map_err(|e| CtlError::Protocol(e.to_string()))?
        .to_bytes();
    if status == StatusCode::BAD_REQUEST {
        return Err(CtlError::BadInput(error_text(&bytes)));
    }
    if !status.is_success() {
        return Err(CtlError::Refused(error_text(&bytes)));
    }
    serde_json::from_slice(&bytes).map_err(|e| CtlError::Protocol(format!("bad JSON: {e}")))
}

fn error_text(bytes: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(bytes)
        .ok()
        .and_then(|v| v["error"].as_str().map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(bytes).trim().to_string())
}
