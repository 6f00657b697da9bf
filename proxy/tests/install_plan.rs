//! The install and uninstall plans, rendered from fixed inputs for both platforms and
//! compared with golden files (`UPDATE_GOLDEN=1` rewrites them), plus the service files the
//! plan writes. Pure: nothing here touches the machine.

use std::path::{Path, PathBuf};

use agenshield_cli::cmd::install::layout::{
    Layout, Platform, BIN_PATH, LAUNCHD_PLIST, LAUNCHD_PLIST_PATH, SYSTEMD_UNIT, SYSTEMD_UNIT_PATH,
};
use agenshield_cli::cmd::install::manifest::{Created, Manifest};
use agenshield_cli::cmd::install::observe::{
    FirewallSeen, Observed, PathLink, PathState, TreeSize,
};
use agenshield_cli::cmd::install::plan::{
    plan_install, plan_uninstall, Action, Content, InstallInput, Plan, State,
};
use agenshield_cli::cmd::install::{config_from_text, default_config_text, DEFAULT_POLICY};

const EXE: &str = "/usr/local/bin/agenshield";

fn golden(name: &str, got: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, got).expect("write golden");
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert_eq!(
        got,
        want,
        "{} differs (UPDATE_GOLDEN=1 rewrites it after review)",
        path.display()
    );
}

fn input() -> InstallInput {
    InstallInput {
        config_text: default_config_text(),
        config_given: false,
        default_policy: DEFAULT_POLICY.into(),
        trust_system_store: false,
    }
}

fn layout(platform: Platform) -> Layout {
    let cfg = config_from_text(&default_config_text()).expect("default config");
    Layout::new(platform, &cfg).expect("layout")
}

fn clean(systemd: bool) -> Observed {
    let mut o = Observed::clean(Path::new(EXE));
    o.service.manager_running = systemd;
    o.pam_auth_update = true;
    o.dbus_policy_dir = true;
    o
}

fn sha(text: &str) -> String {
    agenshield_cli::cmd::install::observe::sha256_hex(text.as_bytes())
}

/// The machine after `plan` ran: what each step would leave behind.
fn after(plan: &Plan, mut o: Observed, l: &Layout) -> Observed {
    let state =
        |dir: bool, mode: u32, owner: &str, group: &str, sha256: Option<String>| PathState {
            dir,
            mode,
            owner: owner.into(),
            group: group.into(),
            sha256,
        };
    let mut manifest = o.manifest.clone().unwrap_or_default();
    for s in plan.steps.iter().filter(|s| s.state == State::Todo) {
        match &s.action {
            Action::MakeDir { path, meta } | Action::SetMeta { path, meta } => {
                let dir = !matches!(o.paths.get(path), Some(p) if !p.dir);
                let old = o.paths.get(path).and_then(|p| p.sha256.clone());
                o.paths.insert(
                    path.clone(),
                    state(dir, meta.mode, &meta.owner, &meta.group, old),
                );
            }
            Action::Write {
                path,
                meta,
                content,
            } => {
                let sha256 = match content {
                    Content::Text(t) => Some(sha(t)),
                    Content::CaBundle { .. } => Some("bundle".into()),
                    Content::TrustStore { .. } => {
                        o.truststore_current = true;
                        Some("store".into())
                    }
                    Content::CopyOf(src) => o.paths.get(src).and_then(|p| p.sha256.clone()),
                };
                o.paths.insert(
                    path.clone(),
                    state(false, meta.mode, &meta.owner, &meta.group, sha256),
                );
            }
            Action::CreateCa { dir, key_owner } => {
                let rg = l.root_group;
                o.paths.insert(
                    dir.join("ca.pem"),
                    state(false, 0o644, "root", rg, Some("ca".into())),
                );
                o.paths.insert(
                    dir.join("ca-key.pem"),
                    state(false, 0o600, key_owner, rg, Some("key".into())),
                );
                o.bundle_sha256 = Some("bundle".into());
                o.ca_common_name = Some("AgenShield Local CA test".into());
            }
            Action::CreateAuditKey { path, owner } => {
                let rg = l.root_group;
                o.paths.insert(
                    path.clone(),
                    state(false, 0o600, owner, rg, Some("audit-key".into())),
                );
                o.paths.insert(
                    path.with_extension("pub"),
                    state(false, 0o644, "root", rg, Some("audit-pub".into())),
                );
            }
            Action::MakeUserDir { path, meta } => {
                o.paths.insert(
                    path.clone(),
                    state(true, meta.mode, &meta.owner, &meta.group, None),
                );
            }
            Action::WriteUserFile { path, meta, text } => {
                o.paths.insert(
                    path.clone(),
                    state(false, meta.mode, &meta.owner, &meta.group, Some(sha(text))),
                );
            }
            Action::AddEnvBlock { path, meta, block } => {
                o.texts.insert(path.clone(), block.clone());
                o.paths.insert(
                    path.clone(),
                    state(false, meta.mode, &meta.owner, &meta.group, None),
                );
            }
            Action::FirewallUp { .. } => o.firewall = FirewallSeen::Matches,
            Action::Link { .. } => o.path_link = PathLink::Ours,
            Action::Run { .. } => match &s.record {
                Some(Created::Group { name }) => {
                    o.groups.insert(name.clone(), 1);
                }
                Some(Created::User { name }) => {
                    let uid = if *name == l.agent.name {
                        l.agent.uid
                    } else {
                        l.broker.uid
                    };
                    o.users.insert(name.clone(), uid);
                }
                Some(Created::Service { .. }) => {
                    o.service.enabled = true;
                    o.service.active = true;
                }
                Some(Created::Keychain { .. }) => o.keychain_has_ca = true,
                Some(Created::Registered { what, .. }) if what == "pam" => o.pam_enabled = true,
                _ => {}
            },
            _ => {}
        }
        if let Some(r) = &s.record {
            manifest.record(r.clone());
        }
        if let Action::CreateCa { dir, .. } = &s.action {
            for f in ["ca.pem", "ca-key.pem"] {
                manifest.record(Created::File {
                    path: dir.join(f),
                    sha256: Some(String::new()),
                });
            }
        }
        if let Action::CreateAuditKey { path, .. } = &s.action {
            for p in [path.clone(), path.with_extension("pub")] {
                manifest.record(Created::File {
                    path: p,
                    sha256: Some(String::new()),
                });
            }
        }
    }
    // Groups with the ids install gave them.
    for (name, gid) in [
        (l.agent.name.clone(), l.agent.uid),
        (l.broker.name.clone(), l.broker.uid),
    ] {
        if o.groups.contains_key(&name) {
            o.groups.insert(name, gid);
        }
    }
    if let Some(g) = o.groups.get_mut("agenshield-admin") {
        *g = 5202;
    }
    o.binary_current = true;
    let manifest_file = PathBuf::from(agenshield_cli::cmd::install::layout::MANIFEST_PATH);
    o.paths.insert(
        manifest_file,
        state(false, 0o600, "root", l.root_group, None),
    );
    manifest.version = 1;
    manifest.platform = l.platform.name().into();
    o.manifest = Some(manifest);
    // What uninstall sees of the evidence it keeps, and when it runs.
    o.sizes.insert(
        l.agent.home.clone(),
        TreeSize {
            files: 7,
            bytes: 20_480,
        },
    );
    o.sizes.insert(
        PathBuf::from(agenshield_cli::cmd::install::layout::LOG_DIR),
        TreeSize {
            files: 2,
            bytes: 3 << 20,
        },
    );
    o.stamp = "20250102T030405Z".into();
    o
}

#[test]
fn linux_install_plan_on_a_clean_machine() {
    let l = layout(Platform::Linux);
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    golden("install-plan-linux.txt", &plan.render());
    let bare = plan_install(&l, &input(), &clean(false)).expect("plan");
    golden("install-plan-linux-without-systemd.txt", &bare.render());
}

#[test]
fn macos_install_plan_on_a_clean_machine() {
    let l = layout(Platform::MacOs);
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    golden("install-plan-macos.txt", &plan.render());
}

#[test]
fn uninstall_plans_undo_what_install_recorded_in_reverse() {
    for (platform, name) in [
        (Platform::Linux, "uninstall-plan-linux.txt"),
        (Platform::MacOs, "uninstall-plan-macos.txt"),
    ] {
        let l = layout(platform);
        let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
        let installed = after(&plan, clean(true), &l);
        let undo = plan_uninstall(&l, &installed, false);
        golden(name, &undo.render());
        // Evidence is kept, with its size, unless --purge; what is kept becomes root's.
        let text = undo.render();
        assert!(
            text.contains("[kept] keep the log directory (the audit log) /var/log/agenshield (2 files, 3.0 MiB)"),
            "{text}"
        );
        assert!(!text.contains("rm -r /var/log/agenshield"), "{text}");
        assert!(
            !text.contains(&format!("rm -r {}", l.agent.home.display())),
            "{text}"
        );
        let close = undo
            .steps
            .iter()
            .find_map(|s| match &s.action {
                Action::CloseToRoot { paths, uids, gids } => Some((paths, uids, gids)),
                _ => None,
            })
            .expect("a step closes what is kept");
        assert!(close.0.contains(&l.agent.home), "{close:?}");
        assert!(
            close.1.contains(&5200) && close.2.contains(&5202),
            "{close:?}"
        );
        let purged = plan_uninstall(&l, &installed, true).render();
        assert!(
            purged.contains("[to do] delete the log directory (the audit log) /var/log/agenshield (2 files, 3.0 MiB): rm -r /var/log/agenshield (--purge)"),
            "{purged}"
        );
        assert!(
            purged.contains(&format!(
                "[to do] delete the agent's home {} (7 files, 20.0 KiB)",
                l.agent.home.display()
            )),
            "{purged}"
        );
        let gone = undo
            .steps
            .iter()
            .filter(|s| matches!(s.action, Action::DeleteAccount { .. }))
            .count();
        assert_eq!(gone, 5, "3 groups and 2 users:\n{}", undo.render());
    }
}

#[test]
fn a_second_install_has_nothing_to_do_on_either_platform() {
    for platform in [Platform::Linux, Platform::MacOs] {
        let l = layout(platform);
        let first = plan_install(&l, &input(), &clean(true)).expect("plan");
        assert!(first.todo() > 20, "{}", first.render());
        let second = plan_install(&l, &input(), &after(&first, clean(true), &l)).expect("plan");
        assert_eq!(second.todo(), 0, "second run:\n{}", second.render());
    }
}

#[test]
fn users_that_existed_before_are_neither_recreated_nor_deleted() {
    let l = layout(Platform::Linux);
    let mut seen = clean(true);
    seen.users.insert(l.agent.name.clone(), 1234);
    seen.groups.insert(l.agent.name.clone(), 1234);
    let plan = plan_install(&l, &input(), &seen).expect("plan");
    let records = plan.records();
    assert!(!records
        .iter()
        .any(|r| matches!(r, Created::User { name } if *name == l.agent.name)));
    let installed = after(&plan, seen, &l);
    let undo = plan_uninstall(&l, &installed, false);
    let text = undo.render();
    assert!(!text.contains("userdel ash_default_agent"), "{text}");
    assert!(text.contains("userdel ash_default_broker"), "{text}");
}

#[test]
fn a_uid_held_by_another_user_stops_the_plan_with_its_name() {
    let l = layout(Platform::Linux);
    let mut seen = clean(true);
    seen.uid_names.insert(5200, "someone".into());
    let err = plan_install(&l, &input(), &seen).expect_err("uid taken");
    assert!(err.to_string().contains("\"someone\""), "{err}");
}

#[test]
fn files_changed_since_install_are_kept_by_uninstall() {
    let l = layout(Platform::Linux);
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    let mut installed = after(&plan, clean(true), &l);
    let mut m: Manifest = installed.manifest.clone().expect("manifest");
    for c in &mut m.created {
        if let Created::File { path, sha256 } = c {
            if path == &l.config_file {
                *sha256 = Some(sha("what install wrote"));
            }
        }
    }
    installed.manifest = Some(m);
    let undo = plan_uninstall(&l, &installed, false);
    // The changed config is kept under another name, so no later start takes it for the
    // installed one, and it is root's alone like the rest of what is kept.
    let retired = PathBuf::from("/opt/agenshield/config/proxy.toml.uninstalled-20250102T030405Z");
    let step = undo
        .steps
        .iter()
        .find(|s| matches!(&s.action, Action::Retire { path, to } if *path == l.config_file && *to == retired))
        .expect("config step");
    assert_eq!(step.state, State::Todo, "{}", undo.render());
    let close = undo
        .steps
        .iter()
        .find_map(|s| match &s.action {
            Action::CloseToRoot { paths, .. } => Some(paths.clone()),
            _ => None,
        })
        .expect("close step");
    assert!(close.iter().any(|p| retired.starts_with(p)), "{close:?}");
}

#[test]
fn a_config_install_did_not_write_is_retired_too() {
    let l = layout(Platform::Linux);
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    let mut installed = after(&plan, clean(true), &l);
    let mut m: Manifest = installed.manifest.clone().expect("manifest");
    m.created
        .retain(|c| !matches!(c, Created::File { path, .. } if *path == l.config_file));
    installed.manifest = Some(m);
    let undo = plan_uninstall(&l, &installed, false);
    assert!(
        undo.steps
            .iter()
            .any(|s| matches!(&s.action, Action::Retire { path, .. } if *path == l.config_file)),
        "{}",
        undo.render()
    );
}

#[test]
fn the_path_link_is_made_removed_only_while_ours_and_a_foreign_file_is_left() {
    let l = layout(Platform::Linux);
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    assert!(plan.steps.iter().any(|s| matches!(
        &s.action,
        Action::Link { path, target } if path == Path::new("/usr/local/bin/agenshield") && target == Path::new(BIN_PATH)
    )));
    let mut installed = after(&plan, clean(true), &l);
    let undo = plan_uninstall(&l, &installed, false);
    let state = |p: &Plan| {
        p.steps
            .iter()
            .find(|s| matches!(s.action, Action::RemoveLink { .. }))
            .map(|s| s.state.clone())
            .expect("link step")
    };
    assert_eq!(state(&undo), State::Todo);
    installed.path_link = PathLink::Foreign("a file".into());
    assert!(
        matches!(state(&plan_uninstall(&l, &installed, false)), State::Done(w) if w.starts_with("kept"))
    );
    // Someone else's file there before install: noted, never replaced.
    let mut seen = clean(true);
    seen.path_link = PathLink::Foreign("a link to /usr/bin/other".into());
    let plan = plan_install(&l, &input(), &seen).expect("plan");
    let step = plan
        .steps
        .iter()
        .find(|s| s.summary.starts_with("put agenshield on PATH"))
        .expect("link step");
    assert_eq!(step.state, State::Note);
    assert!(step.detail.contains("not ours"), "{}", step.detail);
    assert!(!plan
        .records()
        .iter()
        .any(|r| matches!(r, Created::Link { .. })));
}

/// The unit and plist the plan writes are the shipped files, and they run the installed
/// binary on the installed config with the supervision DESIGN.md asks for.
#[test]
fn the_service_files_written_are_the_shipped_ones() {
    for (platform, path, shipped, name) in [
        (
            Platform::Linux,
            SYSTEMD_UNIT_PATH,
            SYSTEMD_UNIT,
            "install-agenshield-proxy.service",
        ),
        (
            Platform::MacOs,
            LAUNCHD_PLIST_PATH,
            LAUNCHD_PLIST,
            "install-com.agenshield.proxy.plist",
        ),
    ] {
        let plan = plan_install(&layout(platform), &input(), &clean(true)).expect("plan");
        let written = plan
            .steps
            .iter()
            .find_map(|s| match &s.action {
                Action::Write {
                    path: p,
                    content: Content::Text(t),
                    meta,
                } if p == &PathBuf::from(path) => Some((t.clone(), meta.mode)),
                _ => None,
            })
            .unwrap_or_else(|| panic!("no step writes {path}"));
        assert_eq!(written.0, shipped);
        assert_eq!(written.1, 0o644);
        golden(name, &written.0);
    }
    let config = agenshield_proxy::config::DEFAULT_CONFIG_PATH;
    assert!(SYSTEMD_UNIT.contains(&format!(
        "ExecStart={BIN_PATH} proxy run --config {config}\n"
    )));
    for line in ["Restart=always", "WantedBy=multi-user.target"] {
        assert!(SYSTEMD_UNIT.contains(line), "unit lacks {line}");
    }
    let args: String = [BIN_PATH, "proxy", "run", "--config", config]
        .iter()
        .map(|a| format!("\t\t<string>{a}</string>\n"))
        .collect();
    assert!(
        LAUNCHD_PLIST.contains(&format!(
            "<key>ProgramArguments</key>\n\t<array>\n{args}\t</array>"
        )),
        "ProgramArguments"
    );
    for (key, value) in [
        ("Label", "<string>com.agenshield.proxy</string>"),
        ("RunAtLoad", "<true/>"),
        ("KeepAlive", "<true/>"),
        ("ThrottleInterval", "<integer>5</integer>"),
        (
            "StandardOutPath",
            "<string>/var/log/agenshield/proxy.log</string>",
        ),
        (
            "StandardErrorPath",
            "<string>/var/log/agenshield/proxy.log</string>",
        ),
    ] {
        assert!(
            LAUNCHD_PLIST.contains(&format!("<key>{key}</key>\n\t{value}")),
            "plist: {key} should be {value}"
        );
    }
}

#[test]
fn a_config_pointing_into_a_shared_system_directory_is_refused_not_taken_over() {
    let text = format!("{}\n", default_config_text()).replacen(
        "audit = \"/var/log/agenshield/proxy-audit.jsonl\"",
        "audit = \"/var/log/proxy-audit.jsonl\"",
        1,
    );
    let cfg = config_from_text(&text).expect("config");
    let l = Layout::new(Platform::Linux, &cfg).expect("layout");
    let mut seen = clean(true);
    seen.paths.insert(
        PathBuf::from("/var/log"),
        PathState {
            dir: true,
            mode: 0o755,
            owner: "root".into(),
            group: "root".into(),
            sha256: None,
        },
    );
    let input = InstallInput {
        config_text: text,
        config_given: true,
        default_policy: DEFAULT_POLICY.into(),
        trust_system_store: false,
    };
    let err = plan_install(&l, &input, &seen).expect_err("refused");
    assert!(
        err.to_string()
            .contains("/var/log is a shared system directory"),
        "{err}"
    );
}

/// Every file install writes for the agent's trust, byte for byte, on both platforms (the
/// bundle and the JVM trust store hold the machine's roots: their content is checked by the
/// unit tests and the compat suite instead).
#[test]
fn the_trust_files_install_writes_are_the_golden_ones() {
    use agenshield_cli::cmd::install::layout::{BlockKind, LAUNCHD_ENV_LABEL};
    use agenshield_cli::cmd::trust::files;
    let linux = layout(Platform::Linux);
    golden("trust-linux-profile.sh", &linux.block(BlockKind::Shell));
    golden(
        "trust-linux-environment.d.conf",
        &linux.block(BlockKind::EnvironmentD),
    );
    golden("trust-wgetrc", &linux.block(BlockKind::Wgetrc));
    golden("trust-agent-env", &files::env_file(&linux.trust()));
    golden(
        "trust-pam-profile",
        &files::pam_profile(&linux.agent.name, &linux.env_file),
    );
    let mac = layout(Platform::MacOs);
    golden("trust-macos-zshenv.sh", &mac.block(BlockKind::Shell));
    golden(
        "trust-macos-agent-env.plist",
        &files::launchd_env_plist(LAUNCHD_ENV_LABEL, &mac.trust()),
    );
    // Which files get which block.
    let kinds = |l: &Layout| -> Vec<(String, BlockKind)> {
        l.blocks
            .iter()
            .map(|b| (b.path.display().to_string(), b.kind))
            .collect()
    };
    assert_eq!(
        kinds(&linux),
        vec![
            ("/home/ash_default_agent/.profile".into(), BlockKind::Shell),
            ("/home/ash_default_agent/.bashrc".into(), BlockKind::Shell),
            (
                "/home/ash_default_agent/.config/environment.d/60-agenshield.conf".into(),
                BlockKind::EnvironmentD
            ),
            ("/home/ash_default_agent/.wgetrc".into(), BlockKind::Wgetrc),
        ]
    );
    assert_eq!(
        kinds(&mac),
        vec![
            ("/Users/ash_default_agent/.zshenv".into(), BlockKind::Shell),
            ("/Users/ash_default_agent/.wgetrc".into(), BlockKind::Wgetrc),
        ]
    );
}

/// `--trust-system-store`: the warning, the store's file and command, undone at uninstall;
/// and a machine without pam-auth-update is told the PAM lines instead.
#[test]
fn the_system_store_and_pam_variants_of_the_plan() {
    use agenshield_cli::cmd::trust::system_store::SystemStore;
    let mut with_store = input();
    with_store.trust_system_store = true;
    for (platform, store, name) in [
        (
            Platform::Linux,
            SystemStore::Debian,
            "install-plan-linux-system-store.txt",
        ),
        (
            Platform::MacOs,
            SystemStore::MacOs,
            "install-plan-macos-system-store.txt",
        ),
    ] {
        let l = layout(platform);
        let mut seen = clean(true);
        seen.system_store = Some(store);
        let plan = plan_install(&l, &with_store, &seen).expect("plan");
        let text = plan.render();
        assert!(
            text.contains("every user and process of this machine"),
            "{text}"
        );
        golden(name, &text);
        let installed = after(&plan, seen, &l);
        let again = plan_install(&l, &with_store, &installed).expect("plan");
        assert_eq!(again.todo(), 0, "second run:\n{}", again.render());
        let undo = plan_uninstall(&l, &installed, false).render();
        let want = match platform {
            Platform::Linux => "update-ca-certificates --fresh",
            Platform::MacOs => "security remove-trusted-cert -d",
        };
        assert!(undo.contains(want), "{undo}");
    }
    let l = layout(Platform::Linux);
    let mut no_pam = clean(true);
    no_pam.pam_auth_update = false;
    let text = plan_install(&l, &input(), &no_pam).expect("plan").render();
    assert!(
        text.contains("no pam-auth-update here: add these lines")
            && text.contains("pam_succeed_if.so quiet user != ash_default_agent"),
        "{text}"
    );
    assert!(!text.contains("pam-auth-update --package"), "{text}");
}

/// The files that close the local resolvers to the agent: the D-Bus policy and the drop-in
/// each resolver service gets.
#[test]
fn the_resolver_files_install_writes_are_the_golden_ones() {
    use agenshield_cli::cmd::install::resolvers::{dbus_policy, dropin, DBUS_POLICY_PATH};
    let l = layout(Platform::Linux);
    golden(
        "install-dbus-resolver.conf",
        &dbus_policy(&[l.agent.name.as_str()]),
    );
    golden(
        "install-resolver-dropin.conf",
        &dropin(Path::new(BIN_PATH), &l.config_file),
    );
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    let written = plan.steps.iter().find_map(|s| match &s.action {
        Action::Write {
            path,
            content: Content::Text(t),
            ..
        } if path == Path::new(DBUS_POLICY_PATH) => Some(t.clone()),
        _ => None,
    });
    assert_eq!(
        written.as_deref(),
        Some(dbus_policy(&[l.agent.name.as_str()]).as_str())
    );
}

#[test]
fn a_policy_source_gets_a_cache_directory_only_the_serving_user_writes() {
    let text = format!(
        "{}\n[policy.source]\nurl = \"https://policy.example/bundle.tar.gz\"\npublic_key = \"/opt/agenshield/config/policy.pub\"\n",
        default_config_text()
    );
    let cfg = config_from_text(&text).expect("config with a policy source");
    let l = Layout::new(Platform::Linux, &cfg).expect("layout");
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    let step = plan
        .steps
        .iter()
        .find(|s| s.summary == "create the policy bundle cache")
        .expect("a cache step");
    assert!(
        step.detail.contains("/var/lib/agenshield/policy-cache") && step.detail.contains("0700"),
        "{}",
        step.detail
    );
    assert!(step.detail.contains(&l.broker.name), "{}", step.detail);
    assert_eq!(step.state, State::Todo);
    let parent = plan
        .steps
        .iter()
        .position(|s| s.summary == "create the policy cache's parent")
        .expect("its parent first");
    let cache = plan
        .steps
        .iter()
        .position(|s| s.summary == "create the policy bundle cache")
        .expect("cache");
    assert!(parent < cache);
    // Without a source, nothing of it (the golden plans pin that).
    let plain = plan_install(&layout(Platform::Linux), &input(), &clean(true)).expect("plan");
    assert!(!plain
        .steps
        .iter()
        .any(|s| s.summary.contains("policy bundle cache")));
}

/// The pins are rewritten by the serving user whenever one changes: by default in a
/// directory of their own that install makes that user's; a `paths.mcp_pins` in a directory
/// root keeps is refused at plan time, not found out when every write fails.
#[test]
fn mcp_pins_get_a_directory_the_serving_user_writes_and_never_a_roots_one() {
    let l = layout(Platform::Linux);
    assert_eq!(l.mcp_pins_dir, std::path::Path::new("/opt/agenshield/mcp"));
    let plan = plan_install(&l, &input(), &clean(true)).expect("plan");
    let step = plan
        .steps
        .iter()
        .find(|s| s.summary == "create the MCP pins directory")
        .expect("a pins directory step");
    assert!(
        step.detail.contains("/opt/agenshield/mcp") && step.detail.contains("0700"),
        "{}",
        step.detail
    );
    assert!(step.detail.contains(&l.broker.name), "{}", step.detail);
    for dir in ["/opt/agenshield", "/opt/agenshield/config"] {
        let text = format!(
            "{}\n",
            default_config_text().replacen(
                "[paths]\n",
                &format!("[paths]\nmcp_pins = \"{dir}/pins.json\"\n"),
                1
            )
        );
        let cfg = config_from_text(&text).expect("config with mcp_pins");
        let l = Layout::new(Platform::Linux, &cfg).expect("layout");
        let e = plan_install(&l, &input(), &clean(true)).expect_err(dir);
        assert!(e.to_string().contains("paths.mcp_pins"), "{e}");
    }
}
