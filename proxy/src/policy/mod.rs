//! Egress policy: which host/port/method/path an agent may reach.
//!
//! Policy files (`*.toml` in one directory, loaded in file-name order) are compiled once into
//! an immutable [`Policy`]; the proxy shares it via `Arc` and calls [`Policy::decide`] per
//! request or raw TCP connection. See `policies/default.toml` for the format.
//!
//! Path rules match [`NormalizedPath::matching`], in which `%2F` counts as `/` (so `/a%2Fb` is
//! matched as `/a/b` and cannot dodge a deny on `/a/**`); upstream gets [`NormalizedPath::forward`].

mod compile;
mod error;
mod eval;
mod host;
mod model;
mod path;

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest, Sha256};

pub use error::{Conflict, Location, PolicyError};
pub use host::{normalize_host, HostError};
pub use path::{normalize_path, NormalizedPath, PathError, MAX_PATH_LEN};

/// One policy source: a file's text and the name errors show (its path for files on disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicySource {
    pub name: String,
    pub text: String,
}

/// A compiled, immutable policy. `Send + Sync`; share it behind an `Arc`.
#[derive(Debug)]
pub struct Policy {
    /// In evaluation order: priority desc, deny before allow, then file and rule order.
    rules: Vec<eval::CompiledRule>,
    index: eval::HostIndex,
    default: Action,
    mode: Mode,
    hash: String,
}

/// What the proxy knows about one request or connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts<'a> {
    /// As received (SNI, Host header, CONNECT target or IP), port stripped; `decide` normalizes.
    pub host: &'a str,
    pub port: u16,
    pub scheme: Scheme,
    /// `None` for raw TCP (no HTTP seen).
    pub method: Option<&'a str>,
    /// `NormalizedPath::matching` (no query); `None` for raw TCP. Un-normalized input is
    /// normalized again by `decide`, at a cost, so prefer passing the `matching` form.
    pub path: Option<&'a str>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Scheme {
    Http,
    Https,
    Tcp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    Allow,
    Deny,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Denies are enforced.
    Enforce,
    /// Denies are logged (`Decision::reported_deny`) but let through.
    Report,
}

/// The verdict for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The effective verdict after the mode: in report mode a would-be deny is `Allow`.
    pub action: Action,
    /// True when a deny was turned into `Allow` by report mode.
    pub reported_deny: bool,
    /// The deciding rule; `None` when the policy default (or an invalid request) decided.
    pub rule_id: Option<Arc<str>>,
    /// One line for logs and error pages.
    pub explanation: String,
}

impl Decision {
    pub fn is_allowed(&self) -> bool {
        self.action == Action::Allow
    }
}

impl Policy {
    /// Loads every `*.toml` in `dir` (not recursing; dotfiles and editor backups skipped).
    pub fn load_dir(dir: &Path) -> Result<Policy, PolicyError> {
        let read_err = |path: &Path| {
            let path = path.to_path_buf();
            move |source| PolicyError::Read { path, source }
        };
        let mut files = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(read_err(dir))? {
            let entry = entry.map_err(read_err(dir))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                tracing::warn!(file = ?entry.path(), "skipping policy file with a non-UTF-8 name");
                continue;
            };
            if !is_policy_file_name(name) {
                continue;
            }
            let path = entry.path();
            // Follows symlinks: a dangling `x.toml` link is an error, a directory is skipped.
            if std::fs::metadata(&path).map_err(read_err(&path))?.is_file() {
                files.push((name.to_owned(), path));
            }
        }
        if files.is_empty() {
            return Err(PolicyError::NoFiles {
                dir: dir.display().to_string(),
            });
        }
        files.sort();
        let sources = files
            .into_iter()
            .map(|(_, path)| {
                let text = std::fs::read_to_string(&path).map_err(read_err(&path))?;
                Ok(PolicySource {
                    name: path.display().to_string(),
                    text,
                })
            })
            .collect::<Result<Vec<_>, PolicyError>>()?;
        Self::from_sources(&sources)
    }

    /// Compiles sources given in evaluation order (their order breaks priority ties).
    pub fn from_sources(sources: &[PolicySource]) -> Result<Policy, PolicyError> {
        if sources.is_empty() {
            return Err(PolicyError::NoFiles {
                dir: "(no sources given)".into(),
            });
        }
        let compiled = compile::compile(sources)?;
        let policy = Policy {
            rules: compiled.rules,
            index: compiled.index,
            default: compiled.default,
            mode: compiled.mode,
            hash: hash_sources(sources),
        };
        tracing::debug!(
            hash = %policy.hash,
            rules = policy.rules.len(),
            files = sources.len(),
            "policy compiled"
        );
        Ok(policy)
    }

    /// `sha256:` + 16 hex digits over every source's file name and text: identifies the loaded
    /// policy in logs and audit records.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The verdict when no rule matches.
    pub fn default_action(&self) -> Action {
        self.default
    }

    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }
}

fn is_policy_file_name(name: &str) -> bool {
    name.len() > ".toml".len() && name.ends_with(".toml") && !name.starts_with('.')
}

fn hash_sources(sources: &[PolicySource]) -> String {
    let mut h = Sha256::new();
    for s in sources {
        // The file name, not its directory: the same policy hashes alike wherever it lives.
        let name = Path::new(&s.name)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(&s.name);
        h.update(name.as_bytes());
        h.update([0]);
        h.update(s.text.as_bytes());
        h.update([0]);
    }
    let digest = h.finalize();
    let mut out = String::from("sha256:");
    for b in &digest[..8] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Report => "report",
        }
    }
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
            Scheme::Tcp => "tcp",
        }
    }
}

macro_rules! display_as_str {
    ($($t:ty),*) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    )*};
}
display_as_str!(Action, Mode, Scheme);

#[cfg(test)]
mod tests {
    use super::*;

    /// `policies/default.toml` at the workspace root, seen from the proxy crate (or from the
    /// scratch crate this module was developed in).
    fn default_policy_path() -> std::path::PathBuf {
        let here = Path::new(env!("CARGO_MANIFEST_DIR"));
        [
            "../policies/default.toml",
            "../../main/policies/default.toml",
        ]
        .iter()
        .map(|rel| here.join(rel))
        .find(|p| p.is_file())
        .expect("policies/default.toml not found")
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    fn load(dir: &Path) -> Result<Policy, String> {
        Policy::load_dir(dir).map_err(|e| e.to_string())
    }

    const ALLOW_ALL: &str =
        "version = 1\n[[rule]]\nid = \"all\"\nhosts = [\"*\"]\naction = \"allow\"\n";

    #[test]
    fn load_dir_picks_toml_files_in_name_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        assert_eq!(
            load(d).err(),
            Some(format!("no policy files in {}", d.display()))
        );
        write(d, "README.md", "not a policy");
        write(d, "a.toml~", "garbage");
        write(d, ".#b.toml", "garbage");
        write(d, ".hidden.toml", "garbage");
        std::fs::create_dir(d.join("sub.toml")).expect("mkdir");
        assert_eq!(
            load(d).err(),
            Some(format!("no policy files in {}", d.display()))
        );

        // b sorts after a: at equal priority a's allow comes first.
        let rule = |id: &str| {
            format!("[[rule]]\nid = \"{id}\"\nhosts = [\"x.example\"]\naction = \"allow\"\n")
        };
        write(d, "b.toml", &format!("version = 1\n{}", rule("from-b")));
        write(d, "a.toml", &format!("version = 1\n{}", rule("from-a")));
        let p = load(d).expect("loads");
        assert_eq!(p.rule_count(), 2);
        let req = RequestFacts {
            host: "x.example",
            port: 443,
            scheme: Scheme::Https,
            method: Some("GET"),
            path: Some("/"),
        };
        assert_eq!(p.decide(&req).rule_id.as_deref(), Some("from-a"));

        write(d, "c.toml", "version = 1\nhots = 1\n");
        let e = load(d).expect_err("bad file");
        assert_eq!(e, format!("{}:2:1: unknown field `hots`, expected one of `version`, `default`, `mode`, `rule`", d.join("c.toml").display()));
        assert!(load(&d.join("missing"))
            .expect_err("missing")
            .starts_with("cannot read "));
    }

    #[test]
    fn hash_is_stable_and_tracks_content() {
        let src = |name: &str, text: &str| PolicySource {
            name: name.into(),
            text: text.into(),
        };
        let h = |s: &[PolicySource]| Policy::from_sources(s).expect("compiles").hash().to_owned();
        let one = h(&[src("a.toml", ALLOW_ALL)]);
        assert!(
            one.starts_with("sha256:") && one.len() == "sha256:".len() + 16,
            "{one}"
        );
        assert!(one["sha256:".len()..]
            .bytes()
            .all(|b| b.is_ascii_hexdigit()));
        assert_eq!(one, h(&[src("a.toml", ALLOW_ALL)]));
        assert_ne!(one, h(&[src("a.toml", &format!("{ALLOW_ALL}# comment\n"))]));
        assert_ne!(one, h(&[src("b.toml", ALLOW_ALL)]));
        let empty = "version = 1\n";
        assert_ne!(
            h(&[src("a.toml", ALLOW_ALL), src("b.toml", empty)]),
            h(&[src("b.toml", empty), src("a.toml", ALLOW_ALL)])
        );

        let dir = tempfile::tempdir().expect("tempdir");
        write(dir.path(), "a.toml", ALLOW_ALL);
        let first = load(dir.path()).expect("loads").hash().to_owned();
        assert_eq!(first, load(dir.path()).expect("loads").hash());
        write(
            dir.path(),
            "a.toml",
            &ALLOW_ALL.replace("allow\"", "deny\""),
        );
        assert_ne!(first, load(dir.path()).expect("loads").hash());
    }

    #[test]
    fn policy_is_send_sync() {
        fn check<T: Send + Sync + 'static>() {}
        check::<Policy>();
        check::<Arc<Policy>>();
        check::<PolicyError>();
    }

    #[test]
    fn shipped_default_policy() {
        let text = std::fs::read_to_string(default_policy_path()).expect("read default.toml");
        let p = Policy::from_sources(&[PolicySource {
            name: "default.toml".into(),
            text,
        }])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (p.default_action(), p.mode(), p.rule_count()),
            (Action::Deny, Mode::Enforce, 4)
        );
        let cases = [
            ("GET", "pypi.org", 443, "/simple/requests/", Some("pypi")),
            (
                "HEAD",
                "files.pythonhosted.org",
                443,
                "/packages/x.whl",
                Some("pypi"),
            ),
            ("GET", "registry.npmjs.org", 443, "/left-pad", Some("npm")),
            (
                "GET",
                "static.crates.io",
                443,
                "/crates/serde/serde-1.0.0.crate",
                Some("crates"),
            ),
            (
                "POST",
                "github.com",
                443,
                "/o/r.git/git-receive-pack",
                Some("github"),
            ),
            (
                "GET",
                "raw.githubusercontent.com",
                443,
                "/o/r/main/README.md",
                Some("github"),
            ),
            (
                "DELETE",
                "api.github.com",
                443,
                "/repos/o/r",
                Some("github"),
            ),
        ];
        for (method, host, port, path, rule) in cases {
            let d = p.decide(&RequestFacts {
                host,
                port,
                scheme: Scheme::Https,
                method: Some(method),
                path: Some(path),
            });
            assert_eq!(
                (d.action, d.rule_id.as_deref()),
                (Action::Allow, rule),
                "{}",
                d.explanation
            );
        }
        let denied = [
            (
                "POST",
                "registry.npmjs.org",
                443,
                "/-/npm/v1/security/audits",
            ),
            ("GET", "pypi.org", 80, "/simple/"),
            ("GET", "example.com", 443, "/"),
            ("GET", "githubusercontent.com", 443, "/"),
            ("GET", "gist.github.com", 443, "/"),
        ];
        for (method, host, port, path) in denied {
            let d = p.decide(&RequestFacts {
                host,
                port,
                scheme: Scheme::Https,
                method: Some(method),
                path: Some(path),
            });
            assert_eq!(
                (d.action, d.rule_id),
                (Action::Deny, None),
                "{}",
                d.explanation
            );
        }
        let ssh = RequestFacts {
            host: "github.com",
            port: 22,
            scheme: Scheme::Tcp,
            method: None,
            path: None,
        };
        assert_eq!(p.decide(&ssh).action, Action::Deny);
        let https_tunnel = RequestFacts { port: 443, ..ssh };
        assert_eq!(p.decide(&https_tunnel).rule_id.as_deref(), Some("github"));
    }
}
