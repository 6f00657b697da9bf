//! Approvals that reach a person: a webhook receiver (HTTPS on loopback, a test CA) that
//! keeps what it is sent, the receiver's side of the signature check, the PKI of the admin
//! HTTPS listener, and `ctl --remote`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

use crate::pki::{server_config, TestCa};

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

/// An HTTPS server on 127.0.0.1 that keeps every request and answers `status`. Stops on
/// drop.
pub struct WebhookReceiver {
    pub addr: SocketAddr,
    /// The CA its certificate chains to (PEM file), for `approvals.ca`.
    pub ca_file: PathBuf,
    got: Arc<Mutex<Vec<Received>>>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl WebhookReceiver {
    pub async fn start(status: u16) -> WebhookReceiver {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = TestCa::new("webhook receiver CA");
        let ca_file = dir.path().join("hook-ca.pem");
        ca.write_pem(&ca_file).expect("write CA");
        let tls = server_config(&ca.leaf(&["127.0.0.1"]), &[b"http/1.1"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(tls);
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let got = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let got = got.clone();
            async move {
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    let acceptor = acceptor.clone();
                    let got = got.clone();
                    tokio::spawn(async move {
                        let Ok(tls) = acceptor.accept(tcp).await else {
                            return;
                        };
                        let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                            let got = got.clone();
                            async move {
                                let path = req
                                    .uri()
                                    .path_and_query()
                                    .map(|p| p.to_string())
                                    .unwrap_or_default();
                                let headers = req.headers().clone();
                                let body = req
                                    .into_body()
                                    .collect()
                                    .await
                                    .map(|b| b.to_bytes())
                                    .unwrap_or_default();
                                got.lock().expect("lock").push(Received {
                                    path,
                                    headers,
                                    body,
                                });
                                let mut resp =
                                    http::Response::new(Full::new(Bytes::from_static(b"ok")));
                                *resp.status_mut() =
                                    http::StatusCode::from_u16(status).expect("status");
                                Ok::<_, std::convert::Infallible>(resp)
                            }
                        });
                        let _ = hyper::server::conn::http1::Builder::new()
                            .serve_connection(TokioIo::new(tls), svc)
                            .await;
                    });
                }
            }
        });
        WebhookReceiver {
            addr,
            ca_file,
            got,
            task,
            _dir: dir,
        }
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.got.lock().expect("lock").clone()
    }

    /// Waits (bounded) until `n` requests arrived.
    pub async fn wait_for(&self, n: usize, within: Duration) -> Vec<Received> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.received();
            if got.len() >= n || Instant::now() > deadline {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for WebhookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// HMAC-SHA256 (RFC 2104) of `msg` with `key`, as lowercase hex: the receiver's side,
/// written out here so the test checks the daemon against the definition, not its code.
pub fn hmac_sha256_hex(key: &[u8], msg: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(msg)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// Checks a received POST's signature as a receiver would: the timestamp header within
/// 5 minutes of now, and `sha256=HMAC(key, "<timestamp>.<body>")`.
pub fn signature_valid(got: &Received, key: &[u8]) -> Result<(), String> {
    let header = |name: &str| {
        got.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .ok_or_else(|| format!("no {name} header"))
    };
    let ts = header("x-agenshield-timestamp")?;
    let sig = header("x-agenshield-signature")?;
    let t: i64 = ts.parse().map_err(|_| format!("timestamp {ts:?}"))?;
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    if (now - t).abs() > 300 {
        return Err(format!("timestamp {t} is {}s from now", now - t));
    }
    let mut msg = ts.into_bytes();
    msg.push(b'.');
    msg.extend_from_slice(&got.body);
    let want = format!("sha256={}", hmac_sha256_hex(key, &msg));
    if sig != want {
        return Err(format!("signature {sig} != {want}"));
    }
    Ok(())
}

/// The admin HTTPS listener's PKI in `dir`: its server certificate (for 127.0.0.1) and the
/// CA of it (`server_ca.pem`, for `ctl --ca`), the client CA (`client_ca.pem`, for
/// `listen.client_ca`), an operator's client certificate (`alice.pem`, `alice-key.pem`) and
/// one from a CA the daemon does not trust (`mallory.pem`, `mallory-key.pem`).
pub struct AdminPki {
    pub dir: PathBuf,
}

impl AdminPki {
    pub fn write(dir: &Path) -> AdminPki {
        let server_ca = TestCa::new("admin listener CA");
        server_ca
            .write_pem(&dir.join("server_ca.pem"))
            .expect("write");
        server_ca
            .leaf(&["127.0.0.1"])
            .write_pems(&dir.join("admin.pem"), &dir.join("admin-key.pem"))
            .expect("write");
        let clients = TestCa::new("operators CA");
        clients
            .write_pem(&dir.join("client_ca.pem"))
            .expect("write");
        clients
            .client_leaf("alice")
            .write_pems(&dir.join("alice.pem"), &dir.join("alice-key.pem"))
            .expect("write");
        TestCa::new("operators CA")
            .client_leaf("mallory")
            .write_pems(&dir.join("mallory.pem"), &dir.join("mallory-key.pem"))
            .expect("write");
        AdminPki {
            dir: dir.to_path_buf(),
        }
    }

    /// The `[listen]` lines serving on `addr`.
    pub fn listen_lines(&self, addr: &str) -> Vec<String> {
        vec![
            format!("admin_https = {addr:?}"),
            format!("client_ca = {:?}", self.dir.join("client_ca.pem")),
            format!("admin_https_cert = {:?}", self.dir.join("admin.pem")),
            format!("admin_https_key = {:?}", self.dir.join("admin-key.pem")),
        ]
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// `agenshield proxy ctl --remote URL --cert --key --ca ARGS` (run with `prefix`, e.g. as
/// an agent user): (exit code, stdout, stderr).
pub fn ctl_remote(
    prefix: &[String],
    url: &str,
    cert: &Path,
    key: &Path,
    ca: &Path,
    args: &[&str],
) -> (i32, String, String) {
    let mut cmd = match prefix.split_first() {
        Some((p, rest)) => {
            let mut c = Command::new(p);
            c.args(rest).arg(crate::daemon::binary());
            c
        }
        None => Command::new(crate::daemon::binary()),
    };
    cmd.args(["proxy", "ctl", "--remote", url, "--cert"])
        .arg(cert)
        .arg("--key")
        .arg(key)
        .arg("--ca")
        .arg(ca)
        .args(args)
        // No config of ours is readable by another uid, nor needed: the listener is all.
        .env("AGENSHIELD_STATE_DIR", std::env::temp_dir());
    let out = cmd.output().expect("run ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
