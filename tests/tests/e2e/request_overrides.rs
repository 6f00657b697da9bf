//! Headers that make an upstream take another method or path than the one the policy decided
//! (`X-HTTP-Method-Override`, `X-Original-URL`, …) never reach an upstream whose host a rule
//! constrains by method or path; `Max-Forwards` reaches none. The real daemon, real curl, a
//! real upstream that echoes what it got.

use std::net::{IpAddr, Ipv4Addr};

use agenshield_e2e::curl::curl;
use agenshield_e2e::daemon::{Daemon, DaemonOptions};
use agenshield_e2e::upstream::{Upstream, UpstreamOptions};

const LOCAL: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

const POLICY: &str = r#"
version = 1
default = "deny"

[[rule]]
id = "read-only"
hosts = ["ro.test"]
methods = ["GET", "POST"]
action = "allow"

[[rule]]
id = "no-admin"
hosts = ["mixed.test"]
paths = ["/admin/**"]
action = "deny"

[[rule]]
id = "mixed"
hosts = ["mixed.test"]
action = "allow"

[[rule]]
id = "open"
hosts = ["open.test"]
action = "allow"
"#;

const OVERRIDES: [&str; 5] = [
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn override_headers_never_reach_a_host_whose_methods_or_paths_are_constrained() {
    let up = Upstream::start(UpstreamOptions {
        name: "up".into(),
        ..Default::default()
    })
    .await;
    let daemon = Daemon::start(DaemonOptions {
        policies: vec![("main.toml".into(), POLICY.into())],
        hosts: ["ro.test", "mixed.test", "open.test"]
            .iter()
            .map(|h| (h.to_string(), LOCAL))
            .collect(),
        ..Default::default()
    });
    let proxy = format!("http://{}", daemon.explicit);
    let mut args: Vec<String> = Vec::new();
    for h in OVERRIDES {
        args.push("-H".into());
        args.push(match h {
            "x-original-url" | "x-rewrite-url" => format!("{h}: /admin/delete-everything"),
            _ => format!("{h}: DELETE"),
        });
    }
    args.extend(["-H".into(), "Max-Forwards: 0".into()]);
    for (host, kept) in [
        ("ro.test", false),
        ("mixed.test", false),
        ("open.test", true),
    ] {
        let url = format!("http://{host}:{}/echo", up.addr.port());
        let mut all: Vec<&str> = vec!["--proxy", &proxy, "-X", "POST", "--data", "x"];
        all.extend(args.iter().map(String::as_str));
        all.push(&url);
        let out = curl(&all, false).await;
        assert_eq!(out.status, 200, "{host}: {}", out.text());
        let headers = &out.json()["headers"];
        for h in OVERRIDES {
            assert_eq!(
                !headers[h].is_null(),
                kept,
                "{host}: {h} {}",
                if kept { "kept" } else { "removed" }
            );
        }
        assert!(headers["max-forwards"].is_null(), "{host}: {headers}");
    }
}
