//! Seatbelt (macOS sandbox) profiles, rendered as text by pure functions so every byte is
//! golden-tested on any platform. Two profiles:
//!
//! - [`agent_profile`]: the backstop for the agent user in transparent mode (pf sends its TCP
//!   to the proxy). It leaves TCP destinations alone, refuses UDP other than DNS and every
//!   listener, and keeps the agent away from AgenShield's own files.
//! - [`exec_profile`]: for `agenshield proxy exec -- CMD` (run as `sandbox-exec -p PROFILE
//!   CMD…`). The same file denials, and outbound network only to the proxy's explicit listener.
//!
//! What the rules rely on (SBPL, the Sandbox Profile Language, is undocumented by Apple; these
//! are the public sources, not copied):
//! - Precedence: for one operation, the last matching rule wins, so a broad rule comes first
//!   and its exceptions after it. The "proxied" profiles gemini-cli shipped
//!   (`packages/cli/src/utils/sandbox-macos-permissive-proxied.sb`: `(allow default)`,
//!   `(deny network-outbound)`, then `(allow network-outbound (remote tcp "localhost:8877"))`)
//!   and its later deny-default version (an `(allow file-read*)` overridden further down by
//!   `(deny file-read* file-write* (literal "/var/run/docker.sock") …)`) depend on it.
//! - Addresses: `(remote tcp "HOST:PORT")`, `(remote udp "*:53")`, `(remote ip)`, `(local ip
//!   "*:*")`; HOST must be `*` or `localhost` (libsandbox's parser refuses anything else:
//!   "host must be * or localhost"), so a profile cannot name an IP address. Codex's
//!   `seatbelt_local_network_policy.sbpl` uses the `localhost:*` forms.
//! - Unix sockets are network operations too: `(remote unix-socket (path-literal P))`, which
//!   is how profiles allow `/private/var/run/mDNSResponder`, the system resolver's socket.
//! - A TCP listener needs both `network-bind` and `network-inbound`; refusing both is
//!   belt and braces.
//! - Seatbelt matches the resolved path: `/var`, `/tmp` and `/etc` are symlinks into
//!   `/private`, so each path is named both ways (as gemini-cli's profile does for
//!   `/var/run/docker.sock`).
//!
//! Seatbelt checks the address a process passes to `connect()`, before pf's `rdr` rewrites
//! it. A profile that limited TCP destinations would therefore refuse the very connections pf
//! redirects to the proxy; in transparent mode the redirect, not the profile, is the network
//! guard, and [`agent_profile`] leaves TCP alone.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Paths the sandboxed process may neither read nor change (absolute; resolve symlinks
/// first when the path exists: Seatbelt compares the resolved path).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Protected {
    /// Single files: the CA key (`ca-key.pem`), the daemon's config file.
    pub files: Vec<PathBuf>,
    /// Directories and everything below them: the vault, the policies.
    pub dirs: Vec<PathBuf>,
    /// Unix sockets it may not connect to: the admin socket.
    pub sockets: Vec<PathBuf>,
}

/// A path that cannot go into a profile.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SeatbeltError {
    #[error("{0:?}: a sandbox profile needs an absolute path")]
    NotAbsolute(PathBuf),
    #[error(
        "{0:?}: a sandbox profile cannot name a path that is not UTF-8 or holds control characters"
    )]
    Unprintable(PathBuf),
}

/// The agent user's backstop profile for transparent mode.
///
/// `dns` lists the resolvers the agent may send UDP to: a loopback resolver is allowed on its
/// own port (`localhost:PORT`); any other address can only be expressed as `*:PORT` (SBPL
/// names no IP addresses), and pf's anchor narrows it to the configured resolvers. Empty: no
/// UDP at all.
pub fn agent_profile(protected: &Protected, dns: &[SocketAddr]) -> Result<String, SeatbeltError> {
    let mut p = header(
        "agent backstop (transparent mode)",
        "The agent user's TCP is not restricted here: Seatbelt checks the address given to\n\
         ; connect() before pf's rdr rewrites it, so limiting TCP destinations would refuse the\n\
         ; connections pf redirects to the proxy. The redirect is the network guard; this profile\n\
         ; refuses what the redirect does not cover.",
    );
    p.push_str("\n; UDP: DNS only, to the resolvers named below.\n");
    p.push_str("(deny network-outbound (remote udp))\n");
    let targets = dns_targets(dns);
    if targets.is_empty() {
        p.push_str("; (no resolver configured: no UDP at all)\n");
    } else {
        p.push_str("(allow network-outbound");
        for t in &targets {
            let _ = write!(p, "\n    (remote udp \"{t}\")");
        }
        p.push_str(")\n");
    }
    no_listeners(&mut p);
    protect(&mut p, protected)?;
    Ok(p)
}

/// The profile for `agenshield proxy exec`: outbound network only to `proxy` (the explicit
/// listener), plus the same denials as [`agent_profile`].
///
/// No DNS: the child hands host names to the proxy (CONNECT host:port, absolute URIs) and the
/// proxy resolves them, so name lookups are refused, UDP port 53 and the system resolver's
/// socket (`/private/var/run/mDNSResponder`) included. A lookup would only serve to connect
/// around the proxy, and queries themselves can carry data out. Unix-domain sockets are
/// refused as well: a local daemon (Docker's, say) could carry traffic out.
///
/// A loopback listener is named `localhost:PORT`; SBPL cannot name another address, so a
/// listener on any other address is allowed as `*:PORT` (any host, that port).
pub fn exec_profile(protected: &Protected, proxy: SocketAddr) -> Result<String, SeatbeltError> {
    let mut p = header(
        "agenshield proxy exec",
        "The command may connect to the proxy's explicit listener and nowhere else.",
    );
    let host = if proxy.ip().is_loopback() {
        "localhost"
    } else {
        "*"
    };
    p.push_str(
        "\n; Outbound: everything is refused (TCP, UDP, DNS, Unix-domain sockets), then the\n\
         ; proxy's explicit listener is allowed; the later rule wins.\n",
    );
    if !proxy.ip().is_loopback() {
        let _ = writeln!(
            p,
            "; The listener is on {}, which SBPL cannot name: any host on its port is allowed.",
            proxy.ip()
        );
    }
    p.push_str("(deny network-outbound)\n");
    let _ = writeln!(
        p,
        "(allow network-outbound (remote tcp \"{host}:{}\"))",
        proxy.port()
    );
    no_listeners(&mut p);
    protect(&mut p, protected)?;
    Ok(p)
}

fn header(what: &str, note: &str) -> String {
    format!(
        "(version 1)\n\
         ; AgenShield Seatbelt profile: {what} (generated by agenshield).\n\
         ; For one operation the last matching rule wins: broad rules first, exceptions after.\n\
         ; {note}\n\
         (allow default)\n"
    )
}

fn no_listeners(p: &mut String) {
    p.push_str(
        "\n; No listeners: binding an IP socket (TCP or UDP) and accepting TCP are refused.\n\
         (deny network-bind (local ip))\n\
         (deny network-inbound (local tcp))\n",
    );
}

/// Denials for AgenShield's own files, last so nothing earlier can re-allow them.
fn protect(p: &mut String, protected: &Protected) -> Result<(), SeatbeltError> {
    let mut filters = Vec::new();
    for f in &protected.files {
        for s in spellings(f)? {
            filters.push(format!("(literal {s})"));
        }
    }
    for d in &protected.dirs {
        for s in spellings(d)? {
            filters.push(format!("(subpath {s})"));
        }
    }
    let mut sockets = Vec::new();
    for s in &protected.sockets {
        for sp in spellings(s)? {
            filters.push(format!("(literal {sp})"));
            sockets.push(format!("(remote unix-socket (path-literal {sp}))"));
        }
    }
    if filters.is_empty() {
        return Ok(());
    }
    p.push_str(
        "\n; AgenShield's own files: the CA key, the config, the vault, the policies and the admin\n\
         ; socket. Neither read nor written, and the socket not connected to.\n\
         (deny file-read* file-write*",
    );
    for f in &filters {
        let _ = write!(p, "\n    {f}");
    }
    p.push_str(")\n");
    if !sockets.is_empty() {
        p.push_str("(deny network-outbound");
        for s in &sockets {
            let _ = write!(p, "\n    {s}");
        }
        p.push_str(")\n");
    }
    Ok(())
}

/// `"*:53"` / `"localhost:15053"`, deduplicated, in the order given.
fn dns_targets(dns: &[SocketAddr]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for sa in dns {
        let host = if sa.ip().is_loopback() {
            "localhost"
        } else {
            "*"
        };
        let t = format!("{host}:{}", sa.port());
        if !out.contains(&t) {
            out.push(t);
        }
    }
    out
}

/// The path as SBPL string literals: as given, and under `/private` when it starts in one of
/// the symlinked top-level directories (`/var`, `/tmp`, `/etc`).
fn spellings(path: &Path) -> Result<Vec<String>, SeatbeltError> {
    let s = path
        .to_str()
        .filter(|s| !s.chars().any(char::is_control))
        .ok_or_else(|| SeatbeltError::Unprintable(path.to_path_buf()))?;
    if !path.is_absolute() {
        return Err(SeatbeltError::NotAbsolute(path.to_path_buf()));
    }
    let mut out = vec![quote(s)];
    for top in ["/var", "/tmp", "/etc"] {
        if s == top || s.starts_with(&format!("{top}/")) {
            out.push(quote(&format!("/private{s}")));
        }
    }
    Ok(out)
}

/// An SBPL (Scheme) string literal: backslash and double quote escaped.
fn quote(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            q.push('\\');
        }
        q.push(c);
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_and_named_under_private() {
        assert_eq!(
            spellings(Path::new("/var/run/a.sock")).expect("ok"),
            vec!["\"/var/run/a.sock\"", "\"/private/var/run/a.sock\""]
        );
        assert_eq!(
            spellings(Path::new("/opt/x\"y\\z")).expect("ok"),
            vec!["\"/opt/x\\\"y\\\\z\""]
        );
        assert_eq!(
            spellings(Path::new("/variable/x")).expect("ok"),
            vec!["\"/variable/x\""]
        );
        assert!(matches!(
            spellings(Path::new("rel/x")),
            Err(SeatbeltError::NotAbsolute(_))
        ));
        assert!(matches!(
            spellings(Path::new("/a\nb")),
            Err(SeatbeltError::Unprintable(_))
        ));
    }

    #[test]
    fn dns_targets_name_loopback_resolvers_and_ports() {
        let dns: Vec<SocketAddr> = ["10.0.0.2:53", "1.1.1.1:53", "127.0.0.1:15053", "[::1]:53"]
            .iter()
            .map(|s| s.parse().expect("addr"))
            .collect();
        assert_eq!(
            dns_targets(&dns),
            vec!["*:53", "localhost:15053", "localhost:53"]
        );
    }
}
