//! The machine's own trust store, for `install --trust-system-store`: our CA added where the
//! distribution's tools (or macOS's System keychain) keep trusted roots. Every user and every
//! process of the machine then trusts certificates our CA signs, which is why it is opt-in.

use std::path::{Path, PathBuf};

/// Where a machine keeps its roots, and the commands that rebuild its bundles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SystemStore {
    /// Debian, Ubuntu: `/usr/local/share/ca-certificates/*.crt` + `update-ca-certificates`
    /// (which also refreshes Java's cacerts through ca-certificates-java).
    Debian,
    /// Fedora, RHEL, Arch (p11-kit): `/etc/pki/ca-trust/source/anchors` + `update-ca-trust`.
    P11Kit,
    /// macOS: the System keychain, as an admin-domain trust setting.
    MacOs,
}

/// The System keychain (macOS).
pub const MACOS_SYSTEM_KEYCHAIN: &str = "/Library/Keychains/System.keychain";

fn argv(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| s.to_string()).collect()
}

impl SystemStore {
    /// Every file a store may hold our CA in (what install looks at).
    pub const ALL_FILES: [&'static str; 2] = [
        "/usr/local/share/ca-certificates/agenshield-local-ca.crt",
        "/etc/pki/ca-trust/source/anchors/agenshield-local-ca.pem",
    ];

    /// The Linux store this machine has, by its tools' directories (`exists` is the
    /// filesystem, a fixture in tests).
    pub fn linux(exists: impl Fn(&Path) -> bool) -> Option<SystemStore> {
        if exists(Path::new("/usr/sbin/update-ca-certificates"))
            || exists(Path::new("/usr/local/share/ca-certificates"))
        {
            Some(SystemStore::Debian)
        } else if exists(Path::new("/etc/pki/ca-trust/source/anchors")) {
            Some(SystemStore::P11Kit)
        } else {
            None
        }
    }

    /// The copy of our CA the store reads (`None` on macOS: the keychain holds it).
    pub fn file(self) -> Option<PathBuf> {
        match self {
            SystemStore::Debian => Some(PathBuf::from(Self::ALL_FILES[0])),
            SystemStore::P11Kit => Some(PathBuf::from(Self::ALL_FILES[1])),
            SystemStore::MacOs => None,
        }
    }

    /// What makes the store trust `ca` (after [`SystemStore::file`] is written).
    pub fn trust(self, ca: &Path) -> Vec<Vec<String>> {
        match self {
            SystemStore::Debian => vec![argv(&["update-ca-certificates"])],
            SystemStore::P11Kit => vec![argv(&["update-ca-trust", "extract"])],
            SystemStore::MacOs => vec![argv(&[
                "security",
                "add-trusted-cert",
                "-d",
                "-r",
                "trustRoot",
                "-p",
                "ssl",
                "-k",
                MACOS_SYSTEM_KEYCHAIN,
                &ca.to_string_lossy(),
            ])],
        }
    }

    /// What undoes [`SystemStore::trust`] (the file removed first, then the store rebuilt).
    pub fn remove(self, ca: &Path) -> Vec<Vec<String>> {
        let rm = |f: PathBuf| argv(&["rm", "-f", &f.to_string_lossy()]);
        match self {
            SystemStore::Debian => vec![
                rm(self.file().unwrap_or_default()),
                argv(&["update-ca-certificates", "--fresh"]),
            ],
            SystemStore::P11Kit => vec![
                rm(self.file().unwrap_or_default()),
                argv(&["update-ca-trust", "extract"]),
            ],
            SystemStore::MacOs => vec![argv(&[
                "security",
                "remove-trusted-cert",
                "-d",
                &ca.to_string_lossy(),
            ])],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_found_by_its_directories() {
        let has = |paths: &'static [&'static str]| {
            move |p: &Path| paths.iter().any(|x| p == Path::new(x))
        };
        assert_eq!(
            SystemStore::linux(has(&["/usr/local/share/ca-certificates"])),
            Some(SystemStore::Debian)
        );
        assert_eq!(
            SystemStore::linux(has(&["/etc/pki/ca-trust/source/anchors"])),
            Some(SystemStore::P11Kit)
        );
        assert_eq!(SystemStore::linux(has(&[])), None);
        let ca = Path::new("/opt/agenshield/certs/ca.pem");
        assert_eq!(
            SystemStore::Debian.remove(ca)[0],
            argv(&[
                "rm",
                "-f",
                "/usr/local/share/ca-certificates/agenshield-local-ca.crt"
            ])
        );
    }
}
