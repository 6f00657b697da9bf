//! Where a request is forwarded: the scheme, host and port the target phase checked (and
//! policy decided on), and how they are written in a URI.

use crate::policy::Scheme;

/// The upstream a request will be forwarded to, as policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    pub scheme: Scheme,
    /// Normalized: lowercase, no trailing dot, IPv6 without brackets.
    pub host: String,
    pub port: u16,
}

impl Target {
    /// `host[:port]` for a URI, the port omitted when it is the scheme's default.
    pub(crate) fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        if self.port == default_port(self.scheme) {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }

    pub(crate) fn scheme_str(&self) -> &'static str {
        match self.scheme {
            Scheme::Https => "https",
            _ => "http",
        }
    }
}

pub(crate) fn default_port(scheme: Scheme) -> u16 {
    match scheme {
        Scheme::Https => 443,
        _ => 80,
    }
}
