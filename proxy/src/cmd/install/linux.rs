//! The Linux commands install and uninstall run (shadow-utils, systemd). Pure: they are only
//! argument vectors here, so the plan renders and tests anywhere.

use super::layout::{Account, BIN_PATH, SYSTEMD_UNIT_NAME};
use agenshield_proxy::config::DEFAULT_CONFIG_PATH;

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub fn create_group(name: &str, gid: u32) -> Vec<Vec<String>> {
    vec![argv(&[
        "groupadd",
        "--system",
        "--gid",
        &gid.to_string(),
        name,
    ])]
}

/// A system user (no aging, no mail spool) with the group of its own name as primary group.
/// The home directory is made by a step of its own, so the manifest records it.
pub fn create_user(a: &Account) -> Vec<Vec<String>> {
    let uid = a.uid.to_string();
    let home = a.home.to_string_lossy();
    let mut v = vec![
        "useradd",
        "--system",
        "--uid",
        &uid,
        "--gid",
        &a.name,
        "--no-create-home",
        "--home-dir",
        &home,
        "--shell",
        a.shell,
        "--comment",
        a.comment,
    ];
    let groups = a.groups.join(",");
    if !a.groups.is_empty() {
        v.extend(["--groups", groups.as_str()]);
    }
    v.push(&a.name);
    vec![argv(&v)]
}

pub fn delete_user(name: &str) -> Vec<String> {
    argv(&["userdel", name])
}

pub fn delete_group(name: &str) -> Vec<String> {
    argv(&["groupdel", name])
}

/// Enable and start the unit (or restart it when something it runs changed).
pub fn service_start(active: bool, changed: bool) -> Vec<Vec<String>> {
    let verb: &[&str] = if active && changed {
        &["systemctl", "restart", SYSTEMD_UNIT_NAME]
    } else {
        &["systemctl", "enable", "--now", SYSTEMD_UNIT_NAME]
    };
    vec![argv(&["systemctl", "daemon-reload"]), argv(verb)]
}

pub fn service_stop() -> Vec<Vec<String>> {
    vec![argv(&["systemctl", "disable", "--now", SYSTEMD_UNIT_NAME])]
}

pub fn service_reload_units() -> Vec<Vec<String>> {
    vec![argv(&["systemctl", "daemon-reload"])]
}

/// What to tell an operator on a machine without systemd (containers, CI).
pub fn no_service_manager_note() -> String {
    format!(
        "systemd is not running here (no /run/systemd/system): the unit is written but not \
         enabled; start the daemon as root with: {BIN_PATH} proxy run --config {DEFAULT_CONFIG_PATH}"
    )
}
