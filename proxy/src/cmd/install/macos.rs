//! The macOS commands install and uninstall run (dscl, launchctl, security). Pure argument
//! vectors, so the macOS plan renders and is golden-tested on Linux. Type-checked only: no
//! step here has run on a Mac in CI.
//!
//! Sources: dscl(1) for the user and group records (a hidden system user needs UniqueID,
//! PrimaryGroupID, UserShell, NFSHomeDirectory and `IsHidden 1`); launchctl(1) for
//! `bootstrap system PLIST` / `bootout system/LABEL` / `print system/LABEL`; security(1) for
//! `add-trusted-cert [-d] [-r resultType] [-p policy] [-k keychain] certFile`: "When
//! modifying per-user Trust Settings, user authentication is required via an authentication
//! dialog" (the man page). Apple's macOS 11 release notes add that admin-domain (`-d`) trust
//! changes need an administrator password too, root alone no longer suffices (quoted at
//! twocanoes.com, "Trusting certificates in System keychain without prompting"). So the step
//! runs as the agent, into its login keychain, and when no confirmation is possible it is
//! reported with the command to run in the agent's session instead of failing the install.

use std::path::Path;

use super::layout::{Account, LAUNCHD_LABEL, LAUNCHD_PLIST_PATH};

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

pub fn create_group(name: &str, gid: u32) -> Vec<Vec<String>> {
    let rec = format!("/Groups/{name}");
    vec![
        argv(&["dscl", ".", "-create", &rec]),
        argv(&[
            "dscl",
            ".",
            "-create",
            &rec,
            "PrimaryGroupID",
            &gid.to_string(),
        ]),
        argv(&["dscl", ".", "-create", &rec, "Password", "*"]),
    ]
}

pub fn create_user(a: &Account, gid: u32) -> Vec<Vec<String>> {
    let rec = format!("/Users/{}", a.name);
    let home = a.home.to_string_lossy();
    let mut v = vec![
        argv(&["dscl", ".", "-create", &rec]),
        argv(&["dscl", ".", "-create", &rec, "UniqueID", &a.uid.to_string()]),
        argv(&[
            "dscl",
            ".",
            "-create",
            &rec,
            "PrimaryGroupID",
            &gid.to_string(),
        ]),
        argv(&["dscl", ".", "-create", &rec, "UserShell", a.shell]),
        argv(&["dscl", ".", "-create", &rec, "NFSHomeDirectory", &home]),
        argv(&["dscl", ".", "-create", &rec, "RealName", a.comment]),
        argv(&["dscl", ".", "-create", &rec, "Password", "*"]),
        argv(&["dscl", ".", "-create", &rec, "IsHidden", "1"]),
    ];
    for g in &a.groups {
        v.push(argv(&[
            "dscl",
            ".",
            "-append",
            &format!("/Groups/{g}"),
            "GroupMembership",
            &a.name,
        ]));
    }
    v
}

pub fn delete_user(name: &str) -> Vec<String> {
    argv(&["dscl", ".", "-delete", &format!("/Users/{name}")])
}

pub fn delete_group(name: &str) -> Vec<String> {
    argv(&["dscl", ".", "-delete", &format!("/Groups/{name}")])
}

pub fn service_target() -> String {
    format!("system/{LAUNCHD_LABEL}")
}

/// Load the daemon (reloading it when something it runs changed).
pub fn service_start(loaded: bool, changed: bool) -> Vec<Vec<String>> {
    let bootstrap = argv(&["launchctl", "bootstrap", "system", LAUNCHD_PLIST_PATH]);
    if loaded && changed {
        vec![
            argv(&["launchctl", "bootout", &service_target()]),
            bootstrap,
        ]
    } else {
        vec![bootstrap]
    }
}

pub fn service_stop() -> Vec<Vec<String>> {
    vec![argv(&["launchctl", "bootout", &service_target()])]
}

/// Runs `security` as `user` with that user's HOME (its keychains are under it).
fn as_user(user: &str, args: &[&str]) -> Vec<String> {
    let mut v = argv(&["sudo", "-u", user, "-H", "security"]);
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

pub fn keychain_create(user: &str, keychain: &Path) -> Vec<String> {
    as_user(
        user,
        &["create-keychain", "-p", "", &keychain.to_string_lossy()],
    )
}

pub fn keychain_trust(user: &str, keychain: &Path, ca: &Path) -> Vec<String> {
    as_user(
        user,
        &[
            "add-trusted-cert",
            "-r",
            "trustRoot",
            "-p",
            "ssl",
            "-k",
            &keychain.to_string_lossy(),
            &ca.to_string_lossy(),
        ],
    )
}

pub fn keychain_untrust(user: &str, ca: &Path) -> Vec<String> {
    as_user(user, &["remove-trusted-cert", &ca.to_string_lossy()])
}

pub fn keychain_delete(user: &str, keychain: &Path, common_name: &str) -> Vec<String> {
    as_user(
        user,
        &[
            "delete-certificate",
            "-c",
            common_name,
            &keychain.to_string_lossy(),
        ],
    )
}
