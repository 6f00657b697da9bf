//! Where each runtime takes its trusted roots from, in a given environment: the variables
//! and configuration files it reads, in its own order of precedence, down to its default
//! (the machine's bundle, certifi's, or roots compiled in). Pure but for reading the
//! configuration files, which the agent names and so are read as the agent
//! ([`Access`]); whether a source holds our CA is [`super::holds`]'s question.

use std::path::{Path, PathBuf};

use super::agent_access::Access;
use super::contexts::Context;
use super::holds::Format;
use crate::cmd::trust::runtimes::{Runtime, JAVA_VAR};
use crate::cmd::trust::settings::last_setting;

/// One place a runtime takes roots from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A variable naming a file (or, for `SSL_CERT_DIR`, a directory).
    Var {
        name: &'static str,
        path: PathBuf,
        dir: bool,
    },
    /// A setting in a configuration file.
    Setting {
        file: PathBuf,
        key: &'static str,
        path: PathBuf,
    },
    /// The JVM's `-Djavax.net.ssl.trustStore` in one of its option variables.
    JavaOption {
        var: &'static str,
        path: PathBuf,
        password: String,
        keytool: Option<PathBuf>,
    },
    /// The JDK's own `cacerts`.
    JavaDefault {
        path: PathBuf,
        keytool: Option<PathBuf>,
    },
    /// The machine's bundle (the distribution's, built from its store).
    SystemStore { path: PathBuf },
    /// certifi's bundle, which python packages fall back to.
    Certifi { path: PathBuf },
    /// Roots no file of ours can reach: compiled in, shipped in the package, or not found.
    Builtin { what: &'static str },
}

impl Source {
    /// The file (or directory) to look in, and how to read it; `None` for [`Source::Builtin`].
    pub fn file(&self) -> Option<(&Path, Format<'_>)> {
        match self {
            Source::Var { path, dir, .. } => {
                Some((path, if *dir { Format::PemDir } else { Format::Pem }))
            }
            Source::Setting { path, .. }
            | Source::SystemStore { path }
            | Source::Certifi { path } => Some((path, Format::Pem)),
            Source::JavaOption {
                path,
                password,
                keytool,
                ..
            } => Some((
                path,
                Format::KeyStore {
                    password,
                    keytool: keytool.as_deref(),
                },
            )),
            Source::JavaDefault { path, keytool } => Some((
                path,
                Format::KeyStore {
                    password: crate::cmd::trust::truststore::PASSWORD,
                    keytool: keytool.as_deref(),
                },
            )),
            Source::Builtin { .. } => None,
        }
    }

    /// Whether the runtime got here because nothing configured it (its own default).
    pub fn is_default(&self) -> bool {
        matches!(
            self,
            Source::JavaDefault { .. }
                | Source::SystemStore { .. }
                | Source::Certifi { .. }
                | Source::Builtin { .. }
        )
    }

    /// "reads X → PATH" for the report.
    pub fn describe(&self) -> String {
        match self {
            Source::Var { name, path, .. } => format!("{name} → {}", path.display()),
            Source::Setting { file, key, path } => {
                format!("{} {key} → {}", file.display(), path.display())
            }
            Source::JavaOption { var, path, .. } => {
                format!("{var} -Djavax.net.ssl.trustStore → {}", path.display())
            }
            Source::JavaDefault { path, .. } => format!("the JDK's cacerts {}", path.display()),
            Source::SystemStore { path } => format!("the system bundle {}", path.display()),
            Source::Certifi { path } => format!("certifi's bundle {}", path.display()),
            Source::Builtin { what } => what.to_string(),
        }
    }
}

/// What doctor found on the machine that runtimes fall back to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Machine {
    /// The distribution's bundle (`/etc/ssl/certs/ca-certificates.crt`, …).
    pub system_bundle: Option<PathBuf>,
    /// `certifi.where()` for the machine's python3.
    pub certifi: Option<PathBuf>,
    /// The JDK's `lib/security/cacerts`, found from `java`.
    pub java_cacerts: Option<PathBuf>,
    /// The JDK's `keytool`, which reads key stores of every type.
    pub keytool: Option<PathBuf>,
    /// `/etc` (a fixture directory in tests).
    pub etc: PathBuf,
    /// Where npm's global config may be, in order (`/etc/npmrc`, `/usr/etc/npmrc`, …).
    pub npm_global: Vec<PathBuf>,
}

impl Machine {
    /// The machine this runs on (certifi and the JDK are filled in by the caller, who
    /// runs python and resolves `java`).
    pub fn here() -> Machine {
        let system_bundle = [
            "/etc/ssl/certs/ca-certificates.crt",
            "/etc/pki/tls/certs/ca-bundle.crt",
            "/etc/ssl/cert.pem",
        ]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
        Machine {
            system_bundle,
            certifi: None,
            java_cacerts: None,
            keytool: None,
            etc: PathBuf::from("/etc"),
            npm_global: ["/etc/npmrc", "/usr/etc/npmrc", "/usr/local/etc/npmrc"]
                .iter()
                .map(PathBuf::from)
                .collect(),
        }
    }

    fn system(&self) -> Source {
        match &self.system_bundle {
            Some(path) => Source::SystemStore { path: path.clone() },
            None => Source::Builtin {
                what: "the system store (no bundle file found)",
            },
        }
    }

    fn certifi(&self) -> Source {
        match &self.certifi {
            Some(path) => Source::Certifi { path: path.clone() },
            None => Source::Builtin {
                what: "certifi's bundle (not found)",
            },
        }
    }
}

/// The sources `rt` uses in `ctx`, the one that decides first: a runtime that adds several
/// together (node's extra certificates to its own, OpenSSL's file and directory) lists each;
/// it trusts our CA if any of them holds it.
pub fn sources(
    rt: Runtime,
    ctx: &Context,
    home: &Path,
    m: &Machine,
    access: &Access,
) -> Vec<Source> {
    let setting = |file: &Path, key: &'static str, home: &Path| setting(file, key, home, access);
    let var = |name: &'static str| {
        ctx.get(name).map(|p| Source::Var {
            name,
            path: PathBuf::from(p),
            dir: false,
        })
    };
    let dir_var = |name: &'static str| {
        ctx.get(name).map(|p| Source::Var {
            name,
            path: PathBuf::from(p),
            dir: true,
        })
    };
    // A file a variable may move elsewhere.
    let path_or = |name: &str, default: PathBuf| ctx.get(name).map_or(default, PathBuf::from);
    // OpenSSL's defaults, which SSL_CERT_FILE and SSL_CERT_DIR replace.
    let openssl = |fallback: Source| {
        let v: Vec<Source> = [var("SSL_CERT_FILE"), dir_var("SSL_CERT_DIR")]
            .into_iter()
            .flatten()
            .collect();
        if v.is_empty() {
            vec![fallback]
        } else {
            v
        }
    };
    match rt {
        Runtime::Curl => {
            // A ~/.curlrc `cacert` is a command-line option: it beats the variables.
            let rc_dirs = [ctx.get("CURL_HOME"), ctx.get("XDG_CONFIG_HOME")];
            let rc = rc_dirs
                .into_iter()
                .flatten()
                .map(PathBuf::from)
                .chain([home.to_path_buf()])
                .map(|d| d.join(".curlrc"))
                .find(|f| f.exists());
            if let Some(s) = rc.and_then(|f| setting(&f, "cacert", home)) {
                return vec![s];
            }
            match var("CURL_CA_BUNDLE") {
                Some(s) => vec![s],
                None => openssl(m.system()),
            }
        }
        Runtime::Wget => {
            let user = path_or("WGETRC", home.join(".wgetrc"));
            let system = path_or("SYSTEM_WGETRC", m.etc.join("wgetrc"));
            let s = setting(&user, "ca_certificate", home)
                .or_else(|| setting(&system, "ca_certificate", home))
                .unwrap_or_else(|| m.system());
            vec![s]
        }
        Runtime::Git => {
            if let Some(s) = var("GIT_SSL_CAINFO") {
                return vec![s];
            }
            let global = path_or("GIT_CONFIG_GLOBAL", home.join(".gitconfig"));
            let xdg = path_or("XDG_CONFIG_HOME", home.join(".config")).join("git/config");
            let system = path_or("GIT_CONFIG_SYSTEM", m.etc.join("gitconfig"));
            let s = [global, xdg, system]
                .iter()
                .find_map(|f| setting(f, "sslCAInfo", home))
                .unwrap_or_else(|| m.system());
            vec![s]
        }
        Runtime::Python | Runtime::Go => openssl(m.system()),
        Runtime::Httpx => openssl(m.certifi()),
        Runtime::Requests => vec![var("REQUESTS_CA_BUNDLE")
            .or_else(|| var("CURL_CA_BUNDLE"))
            .unwrap_or_else(|| m.certifi())],
        Runtime::Pip => {
            if let Some(s) = var("PIP_CERT") {
                return vec![s];
            }
            let config_dir = path_or("XDG_CONFIG_HOME", home.join(".config"));
            let files = [
                ctx.get("PIP_CONFIG_FILE").map(PathBuf::from),
                Some(config_dir.join("pip/pip.conf")),
                Some(home.join(".pip/pip.conf")),
                Some(m.etc.join("pip.conf")),
                Some(m.etc.join("xdg/pip/pip.conf")),
            ];
            let s = files
                .iter()
                .flatten()
                .find_map(|f| setting(f, "cert", home))
                .unwrap_or(Source::Builtin {
                    what: "pip's own roots (its vendored certifi, or the system store from pip 24.2 on)",
                });
            vec![s]
        }
        Runtime::Node => node(ctx, m),
        Runtime::Npm => {
            // npm reads its settings from variables in any case; `cafile` replaces node's
            // roots altogether.
            if let Some(p) = ctx.get_any_case("NPM_CONFIG_CAFILE") {
                return vec![Source::Var {
                    name: "NPM_CONFIG_CAFILE",
                    path: PathBuf::from(p),
                    dir: false,
                }];
            }
            let user = ctx
                .get_any_case("NPM_CONFIG_USERCONFIG")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join(".npmrc"));
            let global = ctx
                .get_any_case("NPM_CONFIG_GLOBALCONFIG")
                .map(|p| vec![PathBuf::from(p)])
                .unwrap_or_else(|| m.npm_global.clone());
            match std::iter::once(user)
                .chain(global)
                .find_map(|f| setting(&f, "cafile", home))
            {
                Some(s) => vec![s],
                None => node(ctx, m),
            }
        }
        Runtime::Java => {
            // The launcher's JDK_JAVA_OPTIONS come after JAVA_TOOL_OPTIONS, so they win.
            for var in ["JDK_JAVA_OPTIONS", JAVA_VAR] {
                if let Some((path, password)) = ctx.get(var).and_then(java_store) {
                    return vec![Source::JavaOption {
                        var,
                        path,
                        password,
                        keytool: m.keytool.clone(),
                    }];
                }
            }
            vec![match &m.java_cacerts {
                Some(path) => Source::JavaDefault {
                    path: path.clone(),
                    keytool: m.keytool.clone(),
                },
                None => Source::Builtin {
                    what: "the JDK's cacerts (not found)",
                },
            }]
        }
        Runtime::Grpc => vec![
            var("GRPC_DEFAULT_SSL_ROOTS_FILE_PATH").unwrap_or(Source::Builtin {
                what: "the roots.pem grpc ships inside its package",
            }),
        ],
    }
}

/// Node adds NODE_EXTRA_CA_CERTS to its roots: its bundled Mozilla list, or the system's
/// with `NODE_USE_SYSTEM_CA=1` or `--use-system-ca` / `--use-openssl-ca`.
fn node(ctx: &Context, m: &Machine) -> Vec<Source> {
    let mut v = Vec::new();
    if let Some(p) = ctx.get("NODE_EXTRA_CA_CERTS") {
        v.push(Source::Var {
            name: "NODE_EXTRA_CA_CERTS",
            path: PathBuf::from(p),
            dir: false,
        });
    }
    let options = ctx.get("NODE_OPTIONS").unwrap_or("");
    if ctx.get("NODE_USE_SYSTEM_CA") == Some("1") || options.contains("--use-system-ca") {
        v.push(m.system());
    } else if options.contains("--use-openssl-ca") {
        v.push(match ctx.get("SSL_CERT_FILE") {
            Some(p) => Source::Var {
                name: "SSL_CERT_FILE",
                path: PathBuf::from(p),
                dir: false,
            },
            None => m.system(),
        });
    }
    v.push(Source::Builtin {
        what: "node's bundled Mozilla roots",
    });
    v
}

/// `key`'s value in `file` as a source: `~/` is the agent's home, and a relative path is
/// taken from the file's directory (as git and pip do).
fn setting(file: &Path, key: &'static str, home: &Path, access: &Access) -> Option<Source> {
    let text = access.read_text(file).ok()?;
    let value = last_setting(&text, &[key])?;
    let path = match (value.strip_prefix("~/"), file.parent()) {
        (Some(rest), _) => home.join(rest),
        (None, Some(dir)) if Path::new(value).is_relative() => dir.join(value),
        (None, _) => PathBuf::from(value),
    };
    Some(Source::Setting {
        file: file.to_path_buf(),
        key,
        path,
    })
}

/// The trust store and its password named in JVM options (password: the JDK's default
/// when none is given).
fn java_store(options: &str) -> Option<(PathBuf, String)> {
    let prop = |name: &str| {
        options
            .split_whitespace()
            .filter_map(|t| t.strip_prefix(name))
            .filter_map(|t| t.strip_prefix('='))
            .next_back()
            .map(str::to_string)
    };
    let path = prop("-Djavax.net.ssl.trustStore")?;
    let password = prop("-Djavax.net.ssl.trustStorePassword")
        .unwrap_or_else(|| crate::cmd::trust::truststore::PASSWORD.to_string());
    Some((PathBuf::from(path), password))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::doctor::contexts::ContextKind;
    use crate::cmd::trust::runtimes::Ours;

    fn ctx(vars: &[(&str, &str)]) -> Context {
        Context {
            kind: ContextKind::Login,
            env: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    struct World {
        _dir: tempfile::TempDir,
        home: PathBuf,
        m: Machine,
    }

    fn world() -> World {
        let dir = tempfile::tempdir().expect("tempdir");
        let home = dir.path().join("home");
        let etc = dir.path().join("etc");
        std::fs::create_dir_all(&home).expect("mkdir");
        std::fs::create_dir_all(&etc).expect("mkdir");
        let m = Machine {
            system_bundle: Some(PathBuf::from("/sys.pem")),
            certifi: Some(PathBuf::from("/certifi.pem")),
            java_cacerts: Some(PathBuf::from("/jdk/cacerts")),
            keytool: None,
            npm_global: vec![etc.join("npmrc")],
            etc,
        };
        World { _dir: dir, home, m }
    }

    fn var(name: &'static str, path: &str) -> Source {
        Source::Var {
            name,
            path: PathBuf::from(path),
            dir: false,
        }
    }

    #[test]
    fn each_runtime_falls_back_to_its_own_default() {
        let w = world();
        let none = ctx(&[]);
        let first = |rt| sources(rt, &none, &w.home, &w.m, &Access::ours())[0].clone();
        let sys = Source::SystemStore {
            path: "/sys.pem".into(),
        };
        let certifi = Source::Certifi {
            path: "/certifi.pem".into(),
        };
        for rt in [
            Runtime::Curl,
            Runtime::Wget,
            Runtime::Git,
            Runtime::Python,
            Runtime::Go,
        ] {
            assert_eq!(first(rt), sys, "{rt:?}");
        }
        assert_eq!(first(Runtime::Requests), certifi);
        assert_eq!(first(Runtime::Httpx), certifi);
        assert_eq!(
            first(Runtime::Java),
            Source::JavaDefault {
                path: "/jdk/cacerts".into(),
                keytool: None
            }
        );
        for rt in [Runtime::Pip, Runtime::Node, Runtime::Npm, Runtime::Grpc] {
            assert!(matches!(first(rt), Source::Builtin { .. }), "{rt:?}");
        }
    }

    #[test]
    fn our_variables_are_what_each_runtime_reads() {
        let w = world();
        let b = "/opt/agenshield/certs/agent-ca-bundle.pem";
        let all: Vec<(&str, String)> = crate::cmd::trust::AgentTrust {
            bundle: Path::new(b),
            truststore: Some(Path::new("/opt/agenshield/certs/agent-truststore.p12")),
        }
        .env();
        let env: Vec<(&str, &str)> = all.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let c = ctx(&env);
        for rt in Runtime::ALL {
            let s = &sources(rt, &c, &w.home, &w.m, &Access::ours())[0];
            match rt.ours() {
                Ours::JavaOptions => assert_eq!(
                    *s,
                    Source::JavaOption {
                        var: JAVA_VAR,
                        path: "/opt/agenshield/certs/agent-truststore.p12".into(),
                        password: "changeit".into(),
                        keytool: None
                    }
                ),
                Ours::Bundle(name) => assert_eq!(*s, var(name, b), "{rt:?}"),
                // wget: no ~/.wgetrc here.
                Ours::Wgetrc => assert!(s.is_default()),
            }
        }
    }

    #[test]
    fn configuration_files_win_where_the_tool_says_they_do() {
        let w = world();
        let write = |p: PathBuf, t: &str| {
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, t).expect("write");
        };
        let env = ctx(&[
            ("CURL_CA_BUNDLE", "/env.pem"),
            ("GIT_SSL_CAINFO", "/env.pem"),
            ("NODE_EXTRA_CA_CERTS", "/extra.pem"),
        ]);
        // curl: ~/.curlrc's cacert beats CURL_CA_BUNDLE.
        write(w.home.join(".curlrc"), "cacert = \"/rc.pem\"\n");
        assert_eq!(
            sources(Runtime::Curl, &env, &w.home, &w.m, &Access::ours()),
            vec![Source::Setting {
                file: w.home.join(".curlrc"),
                key: "cacert",
                path: "/rc.pem".into()
            }]
        );
        // git: the variable beats the config.
        write(
            w.home.join(".gitconfig"),
            "[http]\n\tsslCAInfo = /git.pem\n",
        );
        assert_eq!(
            sources(Runtime::Git, &env, &w.home, &w.m, &Access::ours()),
            vec![var("GIT_SSL_CAINFO", "/env.pem")]
        );
        // wget: the user's file, then the system's.
        write(w.m.etc.join("wgetrc"), "ca_certificate = /etc-w.pem\n");
        let wget =
            |c: &Context| sources(Runtime::Wget, c, &w.home, &w.m, &Access::ours())[0].clone();
        assert!(
            matches!(wget(&env), Source::Setting { path, .. } if path == Path::new("/etc-w.pem"))
        );
        write(w.home.join(".wgetrc"), "ca_certificate = /user-w.pem\n");
        assert!(
            matches!(wget(&env), Source::Setting { path, .. } if path == Path::new("/user-w.pem"))
        );
        // npm: a cafile in ~/.npmrc replaces node's roots; the variable (any case) beats it.
        write(w.home.join(".npmrc"), "cafile=/npm.pem\n");
        assert!(matches!(
            &sources(Runtime::Npm, &env, &w.home, &w.m, &Access::ours())[..],
            [Source::Setting { key: "cafile", .. }]
        ));
        let lower = ctx(&[("npm_config_cafile", "/lower.pem")]);
        assert_eq!(
            sources(Runtime::Npm, &lower, &w.home, &w.m, &Access::ours()),
            vec![var("NPM_CONFIG_CAFILE", "/lower.pem")]
        );
        // node adds its extra certificates to its bundled roots.
        let node = sources(Runtime::Node, &env, &w.home, &w.m, &Access::ours());
        assert_eq!(node[0], var("NODE_EXTRA_CA_CERTS", "/extra.pem"));
        assert!(matches!(node.last(), Some(Source::Builtin { .. })));
        // Java: JDK_JAVA_OPTIONS over JAVA_TOOL_OPTIONS, with its password.
        let java = ctx(&[
            ("JAVA_TOOL_OPTIONS", "-Djavax.net.ssl.trustStore=/a.p12"),
            (
                "JDK_JAVA_OPTIONS",
                "-Xmx1g -Djavax.net.ssl.trustStore=/b.p12 -Djavax.net.ssl.trustStorePassword=pw",
            ),
        ]);
        assert_eq!(
            sources(Runtime::Java, &java, &w.home, &w.m, &Access::ours()),
            vec![Source::JavaOption {
                var: "JDK_JAVA_OPTIONS",
                path: "/b.p12".into(),
                password: "pw".into(),
                keytool: None
            }]
        );
        // pip: a relative cert in a config file is taken from its directory.
        write(w.m.etc.join("pip.conf"), "[global]\ncert = certs/pip.pem\n");
        assert_eq!(
            sources(Runtime::Pip, &ctx(&[]), &w.home, &w.m, &Access::ours()),
            vec![Source::Setting {
                file: w.m.etc.join("pip.conf"),
                key: "cert",
                path: w.m.etc.join("certs/pip.pem")
            }]
        );
        // OpenSSL's file and directory add up.
        let both = ctx(&[("SSL_CERT_FILE", "/f.pem"), ("SSL_CERT_DIR", "/d")]);
        assert_eq!(
            sources(Runtime::Go, &both, &w.home, &w.m, &Access::ours()).len(),
            2
        );
    }
}
