//! `[upstream] proxy`: the operator's own HTTP proxy, through which every upstream connection
//! then goes (`CONNECT` for TLS and raw TCP, absolute-form requests for plain HTTP).

use std::fmt;

use base64::Engine as _;
use http::HeaderValue;
use percent_encoding::percent_decode_str;
use serde::Deserialize;

/// Why `upstream.proxy` is not a proxy address we take. Never shows the password.
#[derive(Debug, thiserror::Error)]
pub enum ProxyUrlError {
    #[error("{shown:?} is not a URL like \"http://proxy.corp:3128\": {error}")]
    NotAUrl {
        /// The text, password hidden.
        shown: String,
        error: url::ParseError,
    },
    #[error(
        "an https:// proxy (TLS to the proxy itself) is not supported; give its http:// \
         address: TLS to every origin still runs end to end inside the CONNECT tunnel and is \
         verified by AgenShield"
    )]
    Https,
    #[error("the scheme must be http://, not {0}://")]
    Scheme(String),
    #[error("give the proxy's address only: no path, query or fragment")]
    NotJustTheAddress,
    #[error("the proxy's host is missing")]
    NoHost,
    #[error("the proxy's user name or password is not UTF-8")]
    NotUtf8,
}

/// `http://[user:password@]host[:port]` (port 80 when left out, as the URL says).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct UpstreamProxy {
    /// A name or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
    /// `user:password`, percent-decoded. Sent only to the proxy, never shown or logged.
    credentials: Option<String>,
}

impl UpstreamProxy {
    pub fn parse(text: &str) -> Result<UpstreamProxy, ProxyUrlError> {
        let url = url::Url::parse(text).map_err(|error| ProxyUrlError::NotAUrl {
            shown: shown(text),
            error,
        })?;
        match url.scheme() {
            "http" => {}
            "https" => return Err(ProxyUrlError::Https),
            other => return Err(ProxyUrlError::Scheme(other.to_string())),
        }
        if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
            return Err(ProxyUrlError::NotJustTheAddress);
        }
        let host = match url.host() {
            Some(url::Host::Domain(name)) => name.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(ProxyUrlError::NoHost),
        };
        let port = url.port_or_known_default().unwrap_or(80);
        let decode = |s: &str| {
            percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| ProxyUrlError::NotUtf8)
        };
        let credentials = match (url.username(), url.password()) {
            ("", None) => None,
            (user, password) => Some(format!(
                "{}:{}",
                decode(user)?,
                decode(password.unwrap_or(""))?
            )),
        };
        Ok(UpstreamProxy {
            host,
            port,
            credentials,
        })
    }

    /// `host:port` as a request target or a `Host` value (IPv6 in brackets).
    pub fn authority(&self) -> String {
        authority(&self.host, self.port)
    }

    /// What must never reach the agent or a log: `user:password` and the password alone
    /// (empty when no credentials were given). The redactor finds each also base64-encoded,
    /// as `Proxy-Authorization` carries them.
    pub fn credential_texts(&self) -> Vec<String> {
        let Some(creds) = &self.credentials else {
            return Vec::new();
        };
        let mut out = vec![creds.clone()];
        if let Some((_, password)) = creds.split_once(':') {
            out.push(password.to_string());
        }
        out
    }

    /// `Proxy-Authorization` (Basic) when credentials were given; marked sensitive.
    pub fn authorization(&self) -> Option<HeaderValue> {
        let creds = self.credentials.as_ref()?;
        let encoded = base64::engine::general_purpose::STANDARD.encode(creds);
        let mut value = HeaderValue::from_str(&format!("Basic {encoded}")).ok()?;
        value.set_sensitive(true);
        Some(value)
    }
}

/// `host:port`, with an IPv6 address in brackets.
pub fn authority(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The URL without its password: `http://host:port`, `http://user:***@host:port`.
impl fmt::Display for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let user = self
            .credentials
            .as_deref()
            .map(|c| c.split(':').next().unwrap_or_default());
        match user {
            Some(user) => write!(f, "http://{user}:***@{}", self.authority()),
            None => write!(f, "http://{}", self.authority()),
        }
    }
}

impl fmt::Debug for UpstreamProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UpstreamProxy({self})")
    }
}

impl TryFrom<String> for UpstreamProxy {
    type Error = ProxyUrlError;

    fn try_from(text: String) -> Result<UpstreamProxy, ProxyUrlError> {
        UpstreamProxy::parse(&text)
    }
}

/// A URL as an error message may show it: the password (if any) hidden.
fn shown(text: &str) -> String {
    match (text.find("://"), text.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &text[..s + 3], &text[at..]),
        _ => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_an_operator_writes() {
        let p = UpstreamProxy::parse("http://proxy.corp:3128").expect("parse");
        assert_eq!((p.host.as_str(), p.port), ("proxy.corp", 3128));
        assert!(p.authorization().is_none());
        assert_eq!(p.to_string(), "http://proxy.corp:3128");
        let p = UpstreamProxy::parse("http://10.0.0.5").expect("parse");
        assert_eq!((p.host.as_str(), p.port), ("10.0.0.5", 80));
        let p = UpstreamProxy::parse("http://[fd00::5]:8080/").expect("parse");
        assert_eq!(p.authority(), "[fd00::5]:8080");
    }

    #[test]
    fn credentials_are_sent_decoded_and_never_shown() {
        let p = UpstreamProxy::parse("http://svc%40corp:p%3Ass@proxy.corp:3128").expect("parse");
        let auth = p.authorization().expect("authorization");
        assert!(auth.is_sensitive());
        let b64 = base64::engine::general_purpose::STANDARD.encode("svc@corp:p:ss");
        assert_eq!(auth.to_str().expect("ascii"), format!("Basic {b64}"));
        assert_eq!(p.to_string(), "http://svc@corp:***@proxy.corp:3128");
        assert!(!format!("{p:?}").contains("p:ss"));
    }

    #[test]
    fn refuses_what_it_cannot_honour_and_hides_passwords_in_errors() {
        for bad in [
            "https://proxy.corp:3128",
            "socks5://proxy.corp:1080",
            "http://proxy.corp:3128/path",
            "http://proxy.corp:3128/?q=1",
            "proxy.corp:3128",
            "http://",
        ] {
            assert!(UpstreamProxy::parse(bad).is_err(), "{bad}");
        }
        let e = UpstreamProxy::parse("http://u:hunter2@bad host:1")
            .expect_err("bad")
            .to_string();
        assert!(!e.contains("hunter2"), "{e}");
    }
}
