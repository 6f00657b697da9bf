//! `[[audit.export]]`: where the audit log is shipped (`audit/export/`). One table per sink;
//! unknown keys are errors, and what a value must satisfy beyond its type is checked here
//! ([`check`]), so a sink that could never work stops the daemon at start, not at 3 a.m.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::forms;

/// One sink.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditExport {
    /// The sink's name: its metrics label and its cursor file's. Default: its index ("0"…).
    #[serde(default)]
    pub name: Option<String>,
    #[serde(rename = "type")]
    pub kind: ExportKind,
    /// `tcp://host:port` (RFC 5424 over TCP, octet-counted) or `tls://host:port` (RFC 5425).
    pub url: SyslogUrl,
    /// `agenshield` (default): the local JSONL line byte for byte; `ocsf`: its OCSF 1.3.0 form.
    #[serde(default)]
    pub format: ExportFormat,
    /// The RFC 5424 HOSTNAME of every message. Default: `/etc/machine-id`, else the host name.
    #[serde(default)]
    pub host_id: Option<String>,
    /// `tls://` only: the CA that signs the receiver's certificate (default: system roots).
    #[serde(default)]
    pub ca: Option<PathBuf>,
    /// `tls://` only: a client certificate chain and its key (PEM), both or neither.
    #[serde(default)]
    pub client_cert: Option<PathBuf>,
    #[serde(default)]
    pub client_key: Option<PathBuf>,
    /// How long rotation waits for this sink to ship a file it would delete; past it the
    /// file goes and its unshipped records are counted (`…_dropped_total`). 0: never waits.
    #[serde(default = "default_max_hold", deserialize_with = "forms::duration")]
    pub max_hold: Duration,
    /// Where the sink's position is kept. Default: beside the audit log,
    /// `<log>.export-<name>.cursor`.
    #[serde(default)]
    pub cursor: Option<PathBuf>,
}

fn default_max_hold() -> Duration {
    Duration::from_secs(3600)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    Syslog,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    #[default]
    Agenshield,
    Ocsf,
}

impl ExportFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            ExportFormat::Agenshield => "agenshield",
            ExportFormat::Ocsf => "ocsf",
        }
    }
}

/// How the receiver is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Tcp,
    Tls,
}

/// `tcp://host:port` or `tls://host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub struct SyslogUrl {
    pub transport: Transport,
    /// A name or an IP address (IPv6 without brackets).
    pub host: String,
    pub port: u16,
}

impl std::fmt::Display for SyslogUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scheme = match self.transport {
            Transport::Tcp => "tcp",
            Transport::Tls => "tls",
        };
        write!(f, "{scheme}://{}", super::authority(&self.host, self.port))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SyslogUrlError {
    #[error("{0:?} is not a URL; write tcp://host:port or tls://host:port")]
    NotAUrl(String),
    #[error("{0:?}: the scheme must be tcp or tls (udp loses records)")]
    Scheme(String),
    #[error("{0:?}: a port is needed (rsyslog listens on 514 for tcp, 6514 for tls)")]
    NoPort(String),
    #[error("{0:?}: only scheme, host and port (no user, path or query)")]
    NotJustTheAddress(String),
}

impl TryFrom<String> for SyslogUrl {
    type Error = SyslogUrlError;

    fn try_from(text: String) -> Result<SyslogUrl, SyslogUrlError> {
        let url = url::Url::parse(&text).map_err(|_| SyslogUrlError::NotAUrl(text.clone()))?;
        let transport = match url.scheme() {
            "tcp" => Transport::Tcp,
            "tls" => Transport::Tls,
            _ => return Err(SyslogUrlError::Scheme(text)),
        };
        if !matches!(url.path(), "" | "/")
            || url.query().is_some()
            || url.fragment().is_some()
            || !url.username().is_empty()
            || url.password().is_some()
        {
            return Err(SyslogUrlError::NotJustTheAddress(text));
        }
        let host = match url.host() {
            Some(url::Host::Domain(name)) => name.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(SyslogUrlError::NotAUrl(text)),
        };
        let port = url
            .port()
            .ok_or_else(|| SyslogUrlError::NoPort(text.clone()))?;
        Ok(SyslogUrl {
            transport,
            host,
            port,
        })
    }
}

/// A sink its table does not describe well enough.
#[derive(Debug, thiserror::Error)]
pub enum AuditExportError {
    #[error("audit.export[{0}]: name {1:?} must be 1-32 letters, digits, '-' or '_'")]
    Name(usize, String),
    #[error("audit.export: two sinks are named {0:?}")]
    DuplicateName(String),
    #[error("audit.export[{0}]: host_id must be 1-255 printable ASCII characters without spaces")]
    HostId(usize),
    #[error("audit.export[{0}]: ca, client_cert and client_key apply to tls:// only")]
    TlsKeysOnTcp(usize),
    #[error("audit.export[{0}]: client_cert and client_key go together")]
    HalfAClientCert(usize),
    #[error("audit.export[{0}]: max_hold must be at most 7d")]
    HoldTooLong(usize),
    #[error("audit.export needs the audit log (audit.enabled = true)")]
    NoLog,
}

/// Checks every sink.
pub(super) fn check(exports: &[AuditExport], enabled: bool) -> Result<(), AuditExportError> {
    if !exports.is_empty() && !enabled {
        return Err(AuditExportError::NoLog);
    }
    let mut names = std::collections::BTreeSet::new();
    for (i, e) in exports.iter().enumerate() {
        let name = e.sink_name(i);
        let name_ok = (1..=32).contains(&name.len())
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(AuditExportError::Name(i, name));
        }
        if !names.insert(name.clone()) {
            return Err(AuditExportError::DuplicateName(name));
        }
        if let Some(h) = &e.host_id {
            if !valid_host_id(h) {
                return Err(AuditExportError::HostId(i));
            }
        }
        let tls_keys = e.ca.is_some() || e.client_cert.is_some() || e.client_key.is_some();
        if e.url.transport == Transport::Tcp && tls_keys {
            return Err(AuditExportError::TlsKeysOnTcp(i));
        }
        if e.client_cert.is_some() != e.client_key.is_some() {
            return Err(AuditExportError::HalfAClientCert(i));
        }
        if e.max_hold > Duration::from_secs(7 * 24 * 3600) {
            return Err(AuditExportError::HoldTooLong(i));
        }
    }
    Ok(())
}

/// An RFC 5424 HOSTNAME: 1-255 printable US-ASCII characters (no space).
pub fn valid_host_id(h: &str) -> bool {
    (1..=255).contains(&h.len()) && h.bytes().all(|b| (33..=126).contains(&b))
}

impl AuditExport {
    /// Its name, or its index when it has none.
    pub fn sink_name(&self, index: usize) -> String {
        self.name.clone().unwrap_or_else(|| index.to_string())
    }

    /// The same sink with its paths taken relative to the config file.
    pub(super) fn resolved(mut self, relative: &dyn Fn(&Path) -> PathBuf) -> AuditExport {
        for p in [
            &mut self.ca,
            &mut self.client_cert,
            &mut self.client_key,
            &mut self.cursor,
        ] {
            if let Some(path) = p.as_mut() {
                *path = relative(path);
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> Result<Vec<AuditExport>, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Doc {
            export: Vec<AuditExport>,
        }
        let doc: Doc = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        check(&doc.export, true).map_err(|e| e.to_string())?;
        Ok(doc.export)
    }

    #[test]
    fn a_sink_parses_with_its_defaults() {
        let e =
            parse("[[export]]\ntype = \"syslog\"\nurl = \"tls://[::1]:6514\"\n").expect("parse");
        assert_eq!(e[0].url.transport, Transport::Tls);
        assert_eq!(e[0].url.host, "::1");
        assert_eq!(e[0].url.to_string(), "tls://[::1]:6514");
        assert_eq!(e[0].format, ExportFormat::Agenshield);
        assert_eq!(e[0].max_hold, Duration::from_secs(3600));
        assert_eq!(e[0].sink_name(0), "0");
    }

    #[test]
    fn mistakes_are_refused_with_the_key_named() {
        for (text, want) in [
            ("url = \"udp://h:514\"", "scheme"),
            ("url = \"tcp://h\"", "port"),
            ("url = \"tcp://h:514/x\"", "no user, path"),
            ("url = \"tcp://h:514\"\nformat = \"cef\"", "unknown variant"),
            ("url = \"tcp://h:514\"\nca = \"ca.pem\"", "tls:// only"),
            (
                "url = \"tls://h:1\"\nclient_cert = \"c.pem\"",
                "go together",
            ),
            ("url = \"tcp://h:514\"\nhost_id = \"a b\"", "host_id"),
            ("url = \"tcp://h:514\"\nname = \"a/b\"", "name"),
            ("url = \"tcp://h:514\"\nmax_hold = \"8d\"", "7d"),
            ("url = \"tcp://h:514\"\nhots = 1", "unknown field"),
        ] {
            let e = parse(&format!("[[export]]\ntype = \"syslog\"\n{text}\n")).expect_err(text);
            assert!(e.contains(want), "{text}: {e}");
        }
        let two = "[[export]]\ntype = \"syslog\"\nurl = \"tcp://h:1\"\nname = \"a\"\n\
                   [[export]]\ntype = \"syslog\"\nurl = \"tcp://h:2\"\nname = \"a\"\n";
        assert!(parse(two).expect_err("dup").contains("two sinks"));
    }
}
