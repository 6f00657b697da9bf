//! `[approvals] webhook`: each request that starts to wait is POSTed, signed, to a person's
//! chat or pager. Off the request's path: the request task only queues a copy (a full queue
//! drops the notice, counted, never the request); a delivery task POSTs it over our rustls
//! (one connection per POST, HTTP/1.1), retrying a bounded number of times, never past the
//! request's expiry. A delivery that fails for good is logged once and counted; the request
//! still waits for `ctl pending approve|deny` as without a webhook.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use prometheus::{IntCounterVec, Opts, Registry};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use time::OffsetDateTime;
use tokio::sync::{mpsc, Semaphore};

use super::notice::{self, SIGNATURE_HEADER, TIMESTAMP_HEADER};
use super::{Notify, PendingRequest};
use crate::config::WebhookConfig;
use crate::secrets::Vault;
use crate::upstream::trust::UpstreamTrust;

/// Notices queued for delivery; more are dropped (counted) until the queue drains.
const QUEUE: usize = 256;
/// POSTs in flight at once.
const IN_FLIGHT: usize = 8;
/// An answer's body is read (and dropped) up to this many bytes.
const MAX_ANSWER: usize = 64 * 1024;

/// How one notice ended, the `result` label of `approval_webhook_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// The receiver answered 2xx.
    Sent,
    /// Every attempt failed (unreachable, TLS, non-2xx, no key), or the request expired
    /// first.
    Failed,
    /// The queue was full: never attempted.
    Dropped,
}

impl Delivery {
    const ALL: [Delivery; 3] = [Delivery::Sent, Delivery::Failed, Delivery::Dropped];

    fn as_str(self) -> &'static str {
        match self {
            Delivery::Sent => "sent",
            Delivery::Failed => "failed",
            Delivery::Dropped => "dropped",
        }
    }
}

/// Why the webhook cannot start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum WebhookError {
    #[error("approvals.ca: {0}")]
    Trust(String),
    #[error(
        "approvals.hmac_secret: no secret {0:?} in the store (agenshield proxy ctl secrets set \
         {0}): every webhook POST is signed with it"
    )]
    NoKey(String),
}

/// Why one attempt failed (logged; never with the URL, which may itself be a credential).
#[derive(Debug, thiserror::Error)]
enum AttemptError {
    #[error("no secret {0:?} in the store to sign with")]
    NoKey(String),
    #[error("{0}")]
    Unreachable(String),
    #[error("the receiver answered HTTP {0}")]
    Status(u16),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

#[derive(Clone)]
struct Counts(IntCounterVec);

impl Counts {
    fn register(r: &Registry, namespace: &str) -> Counts {
        let c = IntCounterVec::new(
            Opts::new(
                "approval_webhook_total",
                "Pending-approval notices by how their webhook delivery ended: sent (2xx), \
                 failed (every attempt failed or the request expired first), dropped (the \
                 queue was full). The request waits for an operator either way.",
            )
            .namespace(namespace),
            &["result"],
        )
        .expect("valid metric definition");
        r.register(Box::new(c.clone())).expect("unique metric name");
        for d in Delivery::ALL {
            c.with_label_values(&[d.as_str()]);
        }
        Counts(c)
    }

    fn inc(&self, d: Delivery) {
        self.0.with_label_values(&[d.as_str()]).inc();
    }
}

/// The request side: queues a copy of each held request.
pub(crate) struct Webhook {
    tx: mpsc::Sender<PendingRequest>,
    counts: Counts,
}

impl Notify for Webhook {
    fn held(&self, req: &PendingRequest) {
        if self.tx.try_send(req.clone()).is_err() {
            self.counts.inc(Delivery::Dropped);
            tracing::warn!(pending = %req.id, "approval webhook: {QUEUE} notices already queued; this one is not sent (the request still waits for ctl pending)");
        }
    }
}

/// What a delivery needs.
struct Sender {
    cfg: WebhookConfig,
    tls: Arc<ClientConfig>,
    vault: Arc<Vault>,
    counts: Counts,
}

/// Starts the delivery task (on the current runtime) and returns the request side.
/// `extra_ca`: `upstream.extra_ca`, trusted besides the system roots when `approvals.ca` is
/// not set.
pub(crate) fn start(
    cfg: &WebhookConfig,
    extra_ca: &[PathBuf],
    vault: Arc<Vault>,
    registry: &Registry,
    namespace: &str,
) -> Result<Webhook, WebhookError> {
    if vault.current().get(&cfg.hmac_secret).is_none() {
        return Err(WebhookError::NoKey(cfg.hmac_secret.clone()));
    }
    let trust = match &cfg.ca {
        Some(ca) => UpstreamTrust::load(std::slice::from_ref(ca)),
        None => UpstreamTrust::load(extra_ca),
    }
    .map_err(|e| WebhookError::Trust(e.to_string()))?;
    let mut tls = trust
        .client_config()
        .map_err(|e| WebhookError::Trust(e.to_string()))?;
    tls.alpn_protocols = vec![b"http/1.1".to_vec()];
    let counts = Counts::register(registry, namespace);
    let sender = Arc::new(Sender {
        cfg: cfg.clone(),
        tls: Arc::new(tls),
        vault,
        counts: counts.clone(),
    });
    let (tx, rx) = mpsc::channel(QUEUE);
    tokio::spawn(deliver_all(sender, rx));
    tracing::info!(
        host = cfg.url.host_str().unwrap_or(""),
        "approval webhook: each pending request is POSTed, signed with secret {:?}",
        cfg.hmac_secret
    );
    Ok(Webhook { tx, counts })
}

async fn deliver_all(sender: Arc<Sender>, mut rx: mpsc::Receiver<PendingRequest>) {
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(req) = rx.recv().await {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            let result = sender.deliver(&req).await;
            sender.counts.inc(result);
            drop(permit);
        });
    }
}

impl Sender {
    /// Every attempt for one notice; how it ended.
    async fn deliver(&self, req: &PendingRequest) -> Delivery {
        let name = match req.asked.agent_uid {
            Some(uid) => tokio::task::spawn_blocking(move || user_name(uid))
                .await
                .ok()
                .flatten(),
            None => None,
        };
        let body = Bytes::from(notice::body(req, name.as_deref()));
        let mut last = None;
        for attempt in 0..=self.cfg.retries {
            if attempt > 0 {
                let pause = Duration::from_secs(1 << (attempt - 1).min(5));
                let left = req.expires - OffsetDateTime::now_utc();
                if left <= time::Duration::ZERO || left < pause {
                    break;
                }
                tokio::time::sleep(pause).await;
            }
            let outcome = tokio::time::timeout(self.cfg.timeout, self.post(body.clone()))
                .await
                .unwrap_or(Err(AttemptError::Timeout(self.cfg.timeout)));
            match outcome {
                Ok(()) => {
                    tracing::debug!(pending = %req.id, attempt, "approval webhook: delivered");
                    return Delivery::Sent;
                }
                Err(e) => {
                    tracing::debug!(pending = %req.id, attempt, "approval webhook: attempt failed: {e}");
                    last = Some(e);
                }
            }
        }
        let why = last.map_or_else(
            || "the request expired first".to_string(),
            |e| e.to_string(),
        );
        tracing::warn!(
            pending = %req.id,
            host = self.cfg.url.host_str().unwrap_or(""),
            "approval webhook: not delivered ({why}); the request still waits: agenshield proxy ctl pending approve {}",
            req.id
        );
        Delivery::Failed
    }

    /// One signed POST; `Ok` on a 2xx answer.
    async fn post(&self, body: Bytes) -> Result<(), AttemptError> {
        let key = {
            let secrets = self.vault.current();
            let secret = secrets
                .get(&self.cfg.hmac_secret)
                .ok_or_else(|| AttemptError::NoKey(self.cfg.hmac_secret.clone()))?;
            secret.value.clone()
        };
        let timestamp = OffsetDateTime::now_utc().unix_timestamp().max(0) as u64;
        let signature = notice::sign(key.expose(), timestamp, &body);
        drop(key);
        let url = &self.cfg.url;
        let fail = |e: &dyn std::fmt::Display| AttemptError::Unreachable(e.to_string());
        let host = url.host_str().ok_or_else(|| fail(&"no host"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<std::net::SocketAddr> = match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![std::net::SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| fail(&format!("resolving {bare}: {e}")))?
                .collect(),
        };
        let tcp = tokio::net::TcpStream::connect(&addrs[..])
            .await
            .map_err(|e| fail(&format!("connecting to {bare}:{port}: {e}")))?;
        let name = ServerName::try_from(bare.to_string()).map_err(|e| fail(&e))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| fail(&format!("TLS with {bare}: {e}")))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| fail(&e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let req = Request::post(path)
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json")
            .header(
                header::USER_AGENT,
                concat!("agenshield/", env!("CARGO_PKG_VERSION")),
            )
            .header(TIMESTAMP_HEADER, timestamp.to_string())
            .header(SIGNATURE_HEADER, signature)
            .body(Full::new(body))
            .map_err(|e| fail(&e))?;
        let resp = send.send_request(req).await.map_err(|e| fail(&e))?;
        let status = resp.status();
        // Read (a bounded part of) the answer so the receiver sees a clean close.
        let _ = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await;
        if !status.is_success() {
            return Err(AttemptError::Status(status.as_u16()));
        }
        Ok(())
    }
}

/// The user name of `uid`, from the user database.
fn user_name(uid: u32) -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .map(|u| u.name)
}
