//! The loopback world most end-to-end tests share: one TLS upstream for `api.test` with a CA of
//! its own, and the options for a daemon that trusts that CA, resolves `api.test` to loopback
//! and takes every transparent connection as headed to the upstream.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use crate::daemon::DaemonOptions;
use crate::pki::TestCa;
use crate::upstream::{Upstream, UpstreamOptions};

pub const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A TLS upstream with a leaf for `sans` from a fresh CA named `ca_name`, that CA written
/// where a daemon can read it.
pub struct ApiUpstream {
    pub up: Upstream,
    pub ca_file: PathBuf,
    /// Holds `ca_file`; keep it as long as the daemon runs.
    pub dir: tempfile::TempDir,
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
        ApiUpstream { up, ca_file, dir }
    }

    /// A daemon under `policy` that trusts this upstream, resolves `api.test` to loopback and
    /// sends every transparent connection to it.
    pub fn daemon_options(&self, policy: &str) -> DaemonOptions {
        DaemonOptions {
            policies: vec![("main.toml".into(), policy.into())],
            extra_ca: vec![self.ca_file.clone()],
            hosts: vec![("api.test".into(), LOCAL)],
            orig_dst: Some(self.up.addr),
            ..Default::default()
        }
    }
}
