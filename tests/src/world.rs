//! The loopback world most end-to-end tests share, built in one place: one TLS upstream with a
//! CA of its own, and a daemon that trusts that CA, resolves the upstream's names to loopback
//! and takes every transparent connection as headed to the upstream. A test file keeps only
//! what is particular to it (its policy, its secrets, a helper of its own).

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use crate::curl::{curl, CurlOut};
use crate::daemon::{Daemon, DaemonOptions};
use crate::pki::{client_config, TestCa};
use crate::upstream::{SeenRequest, Upstream, UpstreamOptions};
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The upstream half of a [`World`]: a TLS upstream with a leaf for `sans` from a fresh CA,
/// that CA written where a daemon can read it. Start the daemon with [`ApiUpstream::world`]
/// once what the daemon needs (its options, a server of the test's own) is known.
pub struct ApiUpstream {
    pub up: Upstream,
    /// The upstream's own CA: it signs the upstream's leaf (and any other a test mints).
    pub ca: TestCa,
    /// `ca` on disk, for the daemon's `extra_ca`.
    pub ca_file: PathBuf,
    /// Holds `ca_file`; keep it as long as the daemon runs.
    pub dir: tempfile::TempDir,
    /// The names on the leaf (IP addresses left out).
    names: Vec<String>,
}

impl ApiUpstream {
    /// `opts.tls` is set here; the rest of `opts` is the caller's.
    pub async fn start(ca_name: &str, sans: &[&str], opts: UpstreamOptions) -> ApiUpstream {
        let ca = TestCa::new(ca_name);
        let up = Upstream::start(UpstreamOptions {
            tls: Some(ca.leaf(sans)),
            ..opts
        })
        .await;
        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("upstream-ca.pem");
        ca.write_pem(&ca_file).expect("write CA");
        let names = sans
            .iter()
            .filter(|s| s.parse::<IpAddr>().is_err())
            .map(|s| s.to_string())
            .collect();
        ApiUpstream {
            up,
            ca,
            ca_file,
            dir,
            names,
        }
    }

    /// A daemon under `policy` (`main.toml`) that trusts this upstream, resolves every name on
    /// its leaf to loopback and sends every transparent connection to it.
    pub fn daemon_options(&self, policy: &str) -> DaemonOptions {
        DaemonOptions {
            policies: vec![("main.toml".into(), policy.into())],
            extra_ca: vec![self.ca_file.clone()],
            hosts: self.names.iter().map(|n| (n.clone(), LOCAL)).collect(),
            orig_dst: Some(self.up.addr),
            ..Default::default()
        }
    }

    /// The daemon started with `opts` (most often `daemon_options` and a few of the test's).
    pub fn world(self, opts: DaemonOptions) -> World {
        let daemon = Daemon::start(opts);
        World {
            up: self.up,
            daemon,
            upstream_ca: self.ca,
            ca_file: self.ca_file,
            _dir: self.dir,
        }
    }
}

/// A running daemon in front of a TLS upstream on loopback (see the module's text).
pub struct World {
    pub up: Upstream,
    pub daemon: Daemon,
    /// The upstream's own CA: what a client that must not be intercepted trusts.
    pub upstream_ca: TestCa,
    /// `upstream_ca` on disk (trusted by the daemon).
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
}

impl World {
    /// The upstream for `sans` (its CA named `ca_name`) and a daemon under `policy` in front of
    /// it: [`ApiUpstream::start`], then [`ApiUpstream::world`] with its `daemon_options`.
    pub async fn start(ca_name: &str, sans: &[&str], up: UpstreamOptions, policy: &str) -> World {
        let api = ApiUpstream::start(ca_name, sans, up).await;
        let opts = api.daemon_options(policy);
        api.world(opts)
    }

    /// The upstream's port (the port every URL of the test names).
    pub fn port(&self) -> u16 {
        self.up.addr.port()
    }

    /// `scheme://host:PORT{path}` on the upstream's port.
    pub fn url(&self, scheme: &str, host: &str, path: &str) -> String {
        format!("{scheme}://{host}:{}{path}", self.port())
    }

    /// curl's options to reach `host` through the transparent listener as the agent does: the
    /// name leads to the listener (as the firewall would make it), and only our CA is trusted.
    pub fn via_transparent(&self, host: &str) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.daemon.ca_path.display().to_string(),
            "--connect-to".into(),
            format!(
                "{host}:{}:127.0.0.1:{}",
                self.port(),
                self.daemon.transparent.port()
            ),
        ]
    }

    /// curl's options to use the explicit proxy listener, trusting only our CA.
    pub fn via_explicit(&self) -> Vec<String> {
        vec![
            "--cacert".into(),
            self.daemon.ca_path.display().to_string(),
            "--proxy".into(),
            format!("http://{}", self.daemon.explicit),
        ]
    }

    /// curl as the agent behind the transparent listener.
    pub async fn transparent(
        &self,
        scheme: &str,
        host: &str,
        path: &str,
        extra: &[&str],
    ) -> CurlOut {
        let url = self.url(scheme, host, path);
        self.curl(self.via_transparent(host), extra, &url, false)
            .await
    }

    /// curl using the explicit proxy listener.
    pub async fn explicit(&self, scheme: &str, host: &str, path: &str, extra: &[&str]) -> CurlOut {
        let url = self.url(scheme, host, path);
        self.curl(self.via_explicit(), extra, &url, false).await
    }

    /// The same request through both listeners: [transparent, explicit].
    pub async fn both(&self, scheme: &str, host: &str, path: &str, extra: &[&str]) -> [CurlOut; 2] {
        [
            self.transparent(scheme, host, path, extra).await,
            self.explicit(scheme, host, path, extra).await,
        ]
    }

    /// curl with `via` (one of the `via_…`), then `extra`, then `url`.
    pub async fn curl(
        &self,
        via: Vec<String>,
        extra: &[&str],
        url: &str,
        body_to_null: bool,
    ) -> CurlOut {
        let mut args: Vec<&str> = via.iter().map(String::as_str).collect();
        args.extend_from_slice(extra);
        args.push(url);
        curl(&args, body_to_null).await
    }

    /// TLS to the transparent listener as the agent opens it for `host`, offering `alpn`,
    /// trusting only our CA.
    pub async fn tls(&self, host: &str, alpn: &[&[u8]]) -> TlsStream<TcpStream> {
        let tls = tokio_rustls::TlsConnector::from(client_config(&[&self.daemon.ca_pem], alpn));
        let tcp = TcpStream::connect(self.daemon.transparent)
            .await
            .expect("connect");
        let name = ServerName::try_from(host.to_string()).expect("name");
        tls.connect(name, tcp).await.expect("TLS to the proxy")
    }

    /// A directory of the test's own, removed with the world.
    pub fn scratch(&self) -> &std::path::Path {
        self._dir.path()
    }

    /// Every request the upstream received, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.up.requests()
    }
}
