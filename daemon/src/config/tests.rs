use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

#[test]
fn a_testing_section_may_set_one_knob() {
    let cfg = Config::parse(
        "[testing]\norig_dst_override = \"127.0.0.1:9\"\n",
        Path::new("/x/proxy.toml"),
    )
    .expect("one knob is enough");
    assert!(!cfg.testing.broker_orig_dst);
    let cfg = Config::parse(
        "[testing]\nbroker_orig_dst = true\n",
        Path::new("/x/p.toml"),
    )
    .expect("the other alone too");
    assert_eq!(cfg.testing.orig_dst_override, None);
}

#[test]
fn installed_defaults_point_at_the_installed_layout() {
    let cfg = Config::installed_defaults();
    assert_eq!(cfg.explicit, "127.0.0.1:15080".parse().expect("addr"));
    assert_eq!(cfg.certs, Path::new("/opt/agenshield/certs"));
    assert_eq!(cfg.source, None);
    assert_eq!(cfg.state_dir, None);
}

#[test]
fn unknown_key_is_an_error_with_position() {
    let err = Config::parse("[listen]\ntransparant = []\n", Path::new("/x/proxy.toml"))
        .expect_err("unknown key must fail");
    let msg = err.to_string();
    assert!(msg.starts_with("/x/proxy.toml:2:1:"), "{msg}");
    assert!(msg.contains("transparant"), "{msg}");
}

#[test]
fn empty_file_gives_design_defaults() {
    let cfg = Config::parse("", Path::new("/etc/a/proxy.toml")).expect("valid");
    assert_eq!(cfg.transparent, default_transparent());
    assert_eq!(cfg.explicit, default_explicit());
    assert_eq!(cfg.policies, Path::new("/opt/agenshield/policies"));
    assert_eq!(cfg.certs, Path::new("/opt/agenshield/certs"));
    assert_eq!(cfg.vault, Path::new("/opt/agenshield/vault"));
    assert_eq!(cfg.secrets.store, SecretStoreKind::File);
    assert_eq!(cfg.dns, default_dns());
    assert!(cfg.dns_is_default);
    assert!(cfg.redirect.dns_passthrough.is_empty());
    assert!(cfg.not_yet_effective.is_empty());
}

#[test]
fn the_dns_stub_takes_one_address_a_list_or_none() {
    let parse = |t: &str| Config::parse(t, Path::new("/etc/a/proxy.toml"));
    let one = parse("[listen]\ndns = \"127.0.0.1:5353\"\n").expect("one");
    assert_eq!(one.dns, vec![SocketAddr::from(([127, 0, 0, 1], 5353))]);
    assert!(!one.dns_is_default);
    let none = parse("[listen]\ndns = []\n").expect("none");
    assert!(none.dns.is_empty());
    let two = parse("[listen]\ndns = [\"127.0.0.1:1\", \"[::1]:1\"]\n").expect("two");
    assert_eq!(two.dns.len(), 2);
}

/// A config written for the pass-through is refused with what to do instead, never
/// silently given a different meaning.
#[test]
fn the_removed_dns_pass_through_keys_explain_themselves() {
    for (text, fix) in [
        ("[redirect]\nallow_dns = false\n", "listen.dns = []"),
        (
            "[redirect]\ndns_servers = [\"10.0.0.53\"]\n",
            "redirect.dns_passthrough",
        ),
    ] {
        let err = Config::parse(text, Path::new("/etc/a/proxy.toml"))
            .expect_err("removed key")
            .to_string();
        assert!(err.contains(fix), "{err}");
        assert!(err.contains("listen.dns"), "{err}");
    }
    // The old shipped defaults, in every config installed before the stub: a warning.
    let old = Config::parse(
        "[redirect]\nallow_dns = true\ndns_servers = []\n",
        Path::new("/etc/a/proxy.toml"),
    )
    .expect("old defaults still start");
    assert_eq!(old.not_yet_effective.len(), 1);
    assert!(old.redirect.dns_passthrough.is_empty());
    let cfg = Config::parse(
        "[redirect]\ndns_passthrough = [\"10.0.0.53\"]\n",
        Path::new("/etc/a/proxy.toml"),
    )
    .expect("opt-out");
    assert_eq!(cfg.redirect.dns_passthrough.len(), 1);
}

#[test]
fn relative_paths_follow_the_config_file() {
    let cfg = Config::parse(
        "[paths]\npolicies = \"pol\"\n[upstream]\nextra_ca = [\"ca.pem\"]\nallow_private = [\"127.0.0.0/8\"]\n",
        Path::new("/etc/a/proxy.toml"),
    )
    .expect("valid");
    assert_eq!(cfg.policies, Path::new("/etc/a/pol"));
    assert_eq!(cfg.upstream.extra_ca, vec![PathBuf::from("/etc/a/ca.pem")]);
    assert_eq!(cfg.upstream.allow_private.len(), 1);
}

/// Issue 34: `cd lab; proxy run --config proxy.toml` kept every path relative, and the
/// policy watcher never matched one. Every path of a loaded config is absolute, relative
/// ones taken from the config file's directory.
#[test]
fn every_path_is_absolute_from_a_relative_config_path() {
    let lab = std::env::current_dir().expect("cwd").join("lab");
    let cfg = Config::parse(
        "[listen]\nadmin = \"run/a.sock\"\n[paths]\npolicies = \"pol\"\ncerts = \"c\"\nvault = \"v\"\naudit = \"log/a.jsonl\"\n[upstream]\nextra_ca = [\"ca.pem\"]\n",
        Path::new("lab/proxy.toml"),
    )
    .expect("valid");
    assert_eq!(
        cfg.source.as_deref(),
        Some(lab.join("proxy.toml").as_path())
    );
    assert_eq!(cfg.policies, lab.join("pol"));
    assert_eq!(cfg.certs, lab.join("c"));
    assert_eq!(cfg.vault, lab.join("v"));
    assert_eq!(cfg.admin, lab.join("run/a.sock"));
    assert_eq!(
        cfg.audit_path.as_deref(),
        Some(lab.join("log/a.jsonl").as_path())
    );
    assert_eq!(cfg.upstream.extra_ca, vec![lab.join("ca.pem")]);
    let bare = Config::parse("", Path::new("proxy.toml")).expect("valid");
    for p in [&bare.policies, &bare.certs, &bare.vault, &bare.admin] {
        assert!(p.is_absolute(), "{}", p.display());
    }
    assert!(bare.source.as_deref().is_some_and(Path::is_absolute));
}

/// Issue 34: each mistake is answered with the form wanted and an example, at its place.
#[test]
fn mistakes_are_answered_with_the_right_form_and_an_example() {
    for (text, said) in [
        (
            "[listen]\nexplicit = \"localhost:27080\"\n",
            "e.g. \"127.0.0.1:27080\"",
        ),
        (
            "[listen]\ntransparent = \"127.0.0.1:1\"\n",
            "e.g. [\"127.0.0.1:15001\"",
        ),
        (
            "[listen]\ndns = \"localhost:53\"\n",
            "e.g. \"127.0.0.1:53\"",
        ),
        (
            "[listen]\nmetrics = \"localhost:9090\"\n",
            "e.g. \"127.0.0.1:9090\"",
        ),
        (
            "[upstream]\nallow_private = [\"10.0.0.0/33\"]\n",
            "e.g. \"10.99.0.0/24\"",
        ),
        ("[redirect]\nexempt = [\"10.0.0.1\"]\n", "\"10.0.0.1/32\""),
        ("[redirect]\nreconcile_interval = \"90\"\n", "e.g. \"90s\""),
        ("[approvals]\ntimeout = 90\n", "in quotes, e.g. \"90s\""),
        ("[resolver]\nhosts = \"x\"\n", "[resolver.hosts]"),
        (
            "[resolver.hosts]\n\"https://x.test/\" = [\"127.0.0.1\"]\n",
            "write the name alone",
        ),
        (
            "[resolver]\nnameservers = [\"localhost:53\"]\n",
            "e.g. \"10.0.0.53\"",
        ),
        (
            "[redirect]\nagent_users = \"x\"\n",
            "write a list in brackets, e.g. [\"x\"]",
        ),
    ] {
        let err = Config::parse(text, Path::new("/etc/a/proxy.toml"))
            .expect_err(text)
            .to_string();
        assert!(err.contains(said), "{text}: {err}");
        assert!(err.starts_with("/etc/a/proxy.toml:"), "{err}");
    }
    let at = Config::parse(
        "[listen]\nexplicit = \"localhost:1\"\n",
        Path::new("/p.toml"),
    )
    .expect_err("bad")
    .to_string();
    assert!(at.starts_with("/p.toml:2:12:"), "the value's place: {at}");
}

#[test]
fn agent_users_take_names_and_uids() {
    let cfg = Config::parse(
        "[redirect]\nenabled = true\nagent_users = [\"ash_default_agent\", 5201]\nexempt = [\"10.9.0.0/16\"]\n",
        Path::new("p.toml"),
    )
    .expect("valid");
    assert!(cfg.redirect.enabled);
    assert_eq!(
        cfg.redirect.agent_users,
        vec![
            AgentUser::Name("ash_default_agent".into()),
            AgentUser::Uid(5201)
        ]
    );
    assert!(Config::parse("[redirect]\nagent_users = []\n", Path::new("p.toml")).is_err());
}

#[test]
fn explicit_listener_users_and_groups_take_names_and_ids() {
    let cfg = Config::parse(
        "[listen]\nexplicit_users = [\"alice\", 1001]\nexplicit_groups = [\"developers\", 2000]\n[testing]\nevery_uid_is_agent = true\n",
        Path::new("p.toml"),
    )
    .expect("valid");
    assert_eq!(
        cfg.explicit_users,
        vec![NameOrId::Name("alice".into()), NameOrId::Id(1001)]
    );
    assert_eq!(
        cfg.explicit_groups,
        vec![NameOrId::Name("developers".into()), NameOrId::Id(2000)]
    );
    assert!(cfg.testing.every_uid_is_agent);
    let none = Config::parse("", Path::new("p.toml")).expect("valid");
    assert!(none.explicit_users.is_empty() && none.explicit_groups.is_empty());
    assert!(!none.testing.every_uid_is_agent);
    assert!(Config::parse("[listen]\nexplicit_users = [-1]\n", Path::new("p.toml")).is_err());
}

#[test]
fn durations_and_limits_parse() {
    let cfg = Config::parse(
        "[limits]\nfirst_bytes_timeout = \"250ms\"\nmax_connections = 10\n",
        Path::new("p.toml"),
    )
    .expect("valid");
    assert_eq!(cfg.limits.first_bytes_timeout, Duration::from_millis(250));
    assert_eq!(cfg.limits.max_connections, 10);
    assert!(Config::parse("[limits]\nmax_connections = 0\n", Path::new("p.toml")).is_err());
}

#[test]
fn defaults_relocate_under_state_dir() {
    let cfg = Config::defaults_in(Path::new("/tmp/st"));
    assert_eq!(cfg.policies, Path::new("/tmp/st/policies"));
    assert_eq!(cfg.certs, Path::new("/tmp/st/certs"));
    assert_eq!(cfg.vault, Path::new("/tmp/st/vault"));
    assert_eq!(cfg.admin, Path::new("/tmp/st/proxy.sock"));
    assert_eq!(cfg.state_dir.as_deref(), Some(Path::new("/tmp/st")));
}

#[test]
fn secrets_section() {
    let cfg = Config::parse(
        "[paths]\nvault = \"v\"\n[secrets]\nscan_body_bytes = 0\n",
        Path::new("/etc/a/proxy.toml"),
    )
    .expect("valid");
    assert_eq!(cfg.vault, Path::new("/etc/a/v"));
    assert_eq!(cfg.secrets.scan_body_bytes, 0);
    assert!(cfg.not_yet_effective.is_empty());
    let too_big = format!("[secrets]\nscan_body_bytes = {}\n", MAX_SCAN_BODY_BYTES + 1);
    assert!(Config::parse(&too_big, Path::new("p.toml")).is_err());
    assert!(Config::parse("[secrets]\nstore = \"vault\"\n", Path::new("p.toml")).is_err());
    #[cfg(not(target_os = "macos"))]
    {
        let err = Config::parse("[secrets]\nstore = \"keychain\"\n", Path::new("p.toml"))
            .expect_err("keychain off macOS");
        assert!(err.to_string().contains("macOS only"), "{err}");
    }
}

#[test]
fn nameserver_forms() {
    assert_eq!(
        parse_nameserver("127.0.0.1").ok(),
        "127.0.0.1:53".parse().ok()
    );
    assert_eq!(
        parse_nameserver("[::1]:5353").ok(),
        "[::1]:5353".parse().ok()
    );
    assert!(parse_nameserver("dns.google").is_err());
}

#[test]
fn the_audit_checkpoint_key_and_cadence_are_configured_and_checked() {
    let cfg = Config::installed_defaults();
    assert_eq!(
        cfg.audit_key,
        Path::new("/opt/agenshield/certs/audit-key.pem")
    );
    assert_eq!(
        (cfg.audit.checkpoint_every, cfg.audit.checkpoint_interval),
        (1000, Duration::from_secs(60))
    );
    let state = Config::defaults_in(Path::new("/state"));
    assert_eq!(state.audit_key, Path::new("/state/certs/audit-key.pem"));
    let cfg = Config::parse(
        "[paths]\naudit_key = \"keys/a.pem\"\n[audit]\ncheckpoint_every = 0\ncheckpoint_interval = \"0s\"\n",
        Path::new("/x/proxy.toml"),
    )
    .expect("both off");
    assert_eq!(cfg.audit_key, Path::new("/x/keys/a.pem"));
    for bad in ["\"500ms\"", "\"25h\""] {
        let err = Config::parse(
            &format!("[audit]\ncheckpoint_interval = {bad}\n"),
            Path::new("/x/proxy.toml"),
        )
        .expect_err(bad)
        .to_string();
        assert!(err.contains("audit.checkpoint_interval"), "{err}");
    }
}
