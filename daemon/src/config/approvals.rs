//! `[approvals]` (how long a held request waits, and the webhook that tells a person about
//! it) and the admin API's HTTPS listener with client certificates (`[listen] admin_https`,
//! `client_ca`, `admin_https_cert`, `admin_https_key`): their file model, checks and the
//! effective settings with every path absolute.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::forms;

/// Longest `approvals.webhook_timeout` (one POST, connect to answer).
pub const MAX_WEBHOOK_TIMEOUT: Duration = Duration::from_secs(60);
/// Most `approvals.webhook_retries` (attempts after the first; each waits 1 s, 2 s, 4 s…).
pub const MAX_WEBHOOK_RETRIES: u32 = 5;

/// Requests held by `ask` rules, and who is told about them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Approvals {
    /// How long a held request waits for an operator; then it is denied.
    #[serde(deserialize_with = "forms::duration")]
    pub timeout: Duration,
    /// `https://…`: each new pending request is POSTed here as signed JSON. The URL is
    /// never logged (an incoming-webhook URL is itself the credential): only its host is.
    #[serde(deserialize_with = "webhook_url")]
    pub webhook: Option<url::Url>,
    /// The vault secret whose value is the webhook's HMAC-SHA256 key (required with
    /// `webhook`).
    pub hmac_secret: Option<String>,
    /// A PEM file of CAs the webhook server's certificate may chain to, besides the system
    /// roots (in place of `upstream.extra_ca`, which is used when this is not set).
    pub ca: Option<PathBuf>,
    /// One POST (connect, TLS, answer) must finish within this.
    #[serde(deserialize_with = "forms::duration")]
    pub webhook_timeout: Duration,
    /// Attempts after a failed first one (never past the request's expiry).
    pub webhook_retries: u32,
}

impl Default for Approvals {
    fn default() -> Self {
        Approvals {
            timeout: Duration::from_secs(60),
            webhook: None,
            hmac_secret: None,
            ca: None,
            webhook_timeout: Duration::from_secs(10),
            webhook_retries: 2,
        }
    }
}

/// The effective webhook settings, when `approvals.webhook` is set.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub url: url::Url,
    pub hmac_secret: String,
    pub ca: Option<PathBuf>,
    pub timeout: Duration,
    pub retries: u32,
}

impl Approvals {
    /// The webhook, once [`Approvals::check`] passed.
    pub fn webhook(&self) -> Option<WebhookConfig> {
        Some(WebhookConfig {
            url: self.webhook.clone()?,
            hmac_secret: self.hmac_secret.clone()?,
            ca: self.ca.clone(),
            timeout: self.webhook_timeout,
            retries: self.webhook_retries,
        })
    }

    /// What the section may not say.
    pub(super) fn check(&self) -> Result<(), ApprovalsError> {
        if self.timeout.is_zero() {
            return Err(ApprovalsError::NoTime);
        }
        if self.webhook.is_none() {
            if self.hmac_secret.is_some() || self.ca.is_some() {
                return Err(ApprovalsError::WithoutWebhook);
            }
            return Ok(());
        }
        if self.hmac_secret.as_deref().is_none_or(str::is_empty) {
            return Err(ApprovalsError::NoKey);
        }
        if self.webhook_timeout < Duration::from_secs(1)
            || self.webhook_timeout > MAX_WEBHOOK_TIMEOUT
        {
            return Err(ApprovalsError::Timeout);
        }
        if self.webhook_retries > MAX_WEBHOOK_RETRIES {
            return Err(ApprovalsError::Retries);
        }
        Ok(())
    }

    /// Paths made absolute by the config's rule.
    pub(super) fn resolved(self, relative: &dyn Fn(&Path) -> PathBuf) -> Approvals {
        Approvals {
            ca: self.ca.as_deref().map(relative),
            ..self
        }
    }
}

/// `approvals.webhook`: `https://` only, with a host, no credentials and no fragment.
fn webhook_url<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<url::Url>, D::Error> {
    let text = String::deserialize(d)?;
    parse_webhook(&text)
        .map(Some)
        .map_err(serde::de::Error::custom)
}

fn parse_webhook(text: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(text).map_err(|e| format!("approvals.webhook: {e}"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "approvals.webhook: scheme {}:// is not taken (https:// only: the request it \
             describes must not cross the network in clear)",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("approvals.webhook: no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("approvals.webhook: credentials in the URL are not taken".into());
    }
    if url.fragment().is_some() {
        return Err("approvals.webhook: no fragment".into());
    }
    Ok(url)
}

/// The admin API over HTTPS, each client proving itself with a certificate.
#[derive(Debug, Clone)]
pub struct AdminHttpsConfig {
    pub addr: SocketAddr,
    /// PEM CAs a client certificate must chain to.
    pub client_ca: PathBuf,
    /// The listener's certificate chain (PEM, leaf first) and its private key (PEM).
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[listen]`'s keys for the HTTPS admin listener, as written.
pub(super) struct AdminHttpsKeys {
    pub addr: Option<SocketAddr>,
    pub client_ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl AdminHttpsKeys {
    pub(super) fn check(
        self,
        relative: &dyn Fn(&Path) -> PathBuf,
    ) -> Result<Option<AdminHttpsConfig>, ApprovalsError> {
        let Some(addr) = self.addr else {
            if self.client_ca.is_some() || self.cert.is_some() || self.key.is_some() {
                return Err(ApprovalsError::HttpsKeysAlone);
            }
            return Ok(None);
        };
        let client_ca = self.client_ca.ok_or(ApprovalsError::NoClientCa)?;
        let (Some(cert), Some(key)) = (self.cert, self.key) else {
            return Err(ApprovalsError::NoServerCert);
        };
        Ok(Some(AdminHttpsConfig {
            addr,
            client_ca: relative(&client_ca),
            cert: relative(&cert),
            key: relative(&key),
        }))
    }
}

/// What `[approvals]` and the HTTPS admin listener's keys may not say.
#[derive(Debug, thiserror::Error)]
pub enum ApprovalsError {
    #[error("approvals.timeout must be more than 0s")]
    NoTime,
    #[error(
        "approvals.hmac_secret is required with approvals.webhook: every POST is signed \
         (the name of a vault secret, e.g. hmac_secret = \"approvals-webhook\")"
    )]
    NoKey,
    #[error("approvals.hmac_secret and approvals.ca are only taken with approvals.webhook")]
    WithoutWebhook,
    #[error("approvals.webhook_timeout must be between 1s and 60s")]
    Timeout,
    #[error("approvals.webhook_retries must be at most {MAX_WEBHOOK_RETRIES}")]
    Retries,
    #[error(
        "listen.admin_https needs listen.client_ca: the PEM CA a client certificate must \
         chain to (the listener admits no one without one)"
    )]
    NoClientCa,
    #[error(
        "listen.admin_https needs listen.admin_https_cert and listen.admin_https_key: the \
         listener's certificate chain and private key (PEM)"
    )]
    NoServerCert,
    #[error(
        "listen.client_ca, admin_https_cert and admin_https_key are only taken with \
         listen.admin_https"
    )]
    HttpsKeysAlone,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Approvals, String> {
        let a: Approvals = toml::from_str(text).map_err(|e| e.to_string())?;
        a.check().map_err(|e| e.to_string())?;
        Ok(a)
    }

    #[test]
    fn a_webhook_needs_https_and_a_key() {
        let a = parse(
            "webhook = \"https://hooks.example/services/T/B/X\"\nhmac_secret = \"hook-key\"\n",
        )
        .expect("valid");
        let w = a.webhook().expect("webhook");
        assert_eq!(w.retries, 2);
        assert_eq!(w.timeout, Duration::from_secs(10));
        for bad in [
            "webhook = \"http://hooks.example/x\"\nhmac_secret = \"k\"",
            "webhook = \"https://u:p@hooks.example/x\"\nhmac_secret = \"k\"",
            "webhook = \"https://hooks.example/x\"",
            "webhook = \"https://hooks.example/x\"\nhmac_secret = \"k\"\nwebhook_retries = 9",
            "webhook = \"https://hooks.example/x\"\nhmac_secret = \"k\"\nwebhook_timeout = \"0s\"",
            "hmac_secret = \"k\"",
            "webhook = \"https://hooks.example/x\"\nhmac_secret = \"k\"\ncolour = 1",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("timeout = \"30s\"")
            .expect("valid")
            .webhook()
            .is_none());
    }

    #[test]
    fn the_https_listener_needs_a_client_ca_and_its_certificate() {
        let rel = |p: &Path| Path::new("/etc/ash").join(p);
        let keys = |ca: bool, cert: bool| AdminHttpsKeys {
            addr: Some(([127, 0, 0, 1], 15443).into()),
            client_ca: ca.then(|| PathBuf::from("clients.pem")),
            cert: cert.then(|| PathBuf::from("admin.pem")),
            key: cert.then(|| PathBuf::from("admin-key.pem")),
        };
        let ok = keys(true, true).check(&rel).expect("valid").expect("set");
        assert_eq!(ok.client_ca, Path::new("/etc/ash/clients.pem"));
        assert!(matches!(
            keys(false, true).check(&rel),
            Err(ApprovalsError::NoClientCa)
        ));
        assert!(matches!(
            keys(true, false).check(&rel),
            Err(ApprovalsError::NoServerCert)
        ));
        let alone = AdminHttpsKeys {
            addr: None,
            ..keys(true, false)
        };
        assert!(matches!(
            alone.check(&rel),
            Err(ApprovalsError::HttpsKeysAlone)
        ));
    }
}
