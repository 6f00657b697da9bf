//! `agenshield proxy exec -- CMD ARGS…`: run a command through the explicit listener, in an OS
//! sandbox that lets it connect to the proxy and nowhere else. No root needed.
//!
//! The command gets:
//! - the proxy variables, all pointing at the explicit listener (`http://127.0.0.1:PORT`):
//!   `HTTP_PROXY`, `HTTPS_PROXY` and their lower-case forms (curl reads only `http_proxy` in
//!   lower case), `ALL_PROXY`/`all_proxy` (curl, Python and others send every other scheme
//!   there too: the proxy answers with a readable refusal instead of the sandbox's bare
//!   "permission denied"), and `NODE_USE_ENV_PROXY=1` (Node's built-in `fetch` honours the
//!   variables only with it). `NO_PROXY`/`no_proxy` are removed, so no inherited exception
//!   sends a host around the proxy;
//! - every CA variable of [`crate::cmd::trust::CA_FILE_VARS`] pointing at a bundle of the
//!   system roots plus the daemon's CA, kept in the user's cache directory
//!   (`$XDG_CACHE_HOME/agenshield`, else `~/.cache/agenshield`, `~/Library/Caches/agenshield`
//!   on macOS; as root, only if no other user can write there, else `/var/cache/agenshield`),
//!   one file per CA, rewritten when a day old;
//! - the sandbox, which is what actually holds: a program that ignores the variables (say
//!   `curl --noproxy '*'`) fails to connect. Linux: Landlock (TCP connect to the proxy's port
//!   only, no TCP bind) and a seccomp filter (no UDP or other non-TCP inet sockets, so no DNS;
//!   no TCP Fast Open sends; no io_uring); see `agenshield_pf::sandbox::landlock`. macOS:
//!   `sandbox-exec -p PROFILE` with `agenshield_pf::sandbox::seatbelt::exec_profile`.
//!
//! The sandbox fails closed: without Landlock ABI 4 (Linux 6.7) the command does not run, and
//! there is no switch to run it unconfined. The process is replaced by the command (exec), so
//! its exit status and signals are the command's own.
//!
//! Before the command runs, exec connects to the proxy once: when nothing answers (the daemon
//! is not running) it says so and the command does not run, rather than failing later with
//! whatever the command makes of a refused connection. As the agent behind the redirect, that
//! connection (like the command's) reaches the daemon's transparent listener, which serves
//! the agent's connections to the explicit listener as the explicit listener would.
//!
//! Exit codes of our own: 127 command not found, 126 found but not runnable, 1 the sandbox or
//! the CA bundle could not be set up, or no proxy answers, 2 bad usage (no command, no port).

use std::convert::Infallible;
use std::ffi::{OsStr, OsString};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cmd::trust::{self, AgentTrust};
use agenshield_proxy::config::Config;

/// The proxy variables set for the command.
pub const PROXY_VARS: [&str; 6] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

/// Variables removed from the command's environment.
pub const REMOVED_VARS: [&str; 2] = ["NO_PROXY", "no_proxy"];

/// How long the check that the proxy answers may take (it is on this machine).
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// A bundle older than this is rebuilt (the system's roots may have changed).
const BUNDLE_MAX_AGE: Duration = Duration::from_secs(24 * 3600);

#[derive(Debug, thiserror::Error)]
enum ExecError {
    #[error("{0}")]
    Usage(String),
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: cannot run it: {1}")]
    CannotRun(String, io::Error),
    #[error("{0}")]
    Setup(String),
    #[error(
        "no proxy answers on {addr} ({error}): is the daemon running? (`systemctl status \
         agenshield-proxy`, or start one with `agenshield proxy run`); the command was not run"
    )]
    NoProxy { addr: SocketAddr, error: io::Error },
}

impl ExecError {
    fn exit_code(&self) -> u8 {
        match self {
            ExecError::Usage(_) => 2,
            ExecError::NotFound(_) => 127,
            ExecError::CannotRun(..) => 126,
            ExecError::Setup(_) | ExecError::NoProxy { .. } => 1,
        }
    }
}

/// Runs the command; the exit code to leave with (only when the command could not be run:
/// otherwise this process has become the command).
pub fn command(cfg: &Config, command: Vec<OsString>) -> u8 {
    match run(cfg, command) {
        Ok(never) => match never {},
        Err(e) => {
            eprintln!("agenshield: proxy exec: {e}");
            e.exit_code()
        }
    }
}

fn run(cfg: &Config, command: Vec<OsString>) -> Result<Infallible, ExecError> {
    let mut words = command.into_iter();
    let program = words
        .next()
        .ok_or_else(|| ExecError::Usage("no command given: agenshield proxy exec -- CMD".into()))?;
    let args: Vec<OsString> = words.collect();
    let proxy = proxy_addr(cfg.explicit).map_err(ExecError::Usage)?;

    // The sandbox first: if this machine cannot confine the command, nothing else matters.
    let sandbox = Sandbox::prepare(cfg, proxy)?;

    let ca = cfg.certs.join("ca.pem");
    let cache = cache_dir().map_err(ExecError::Setup)?;
    let bundle = ensure_bundle(&ca, &cache).map_err(ExecError::Setup)?;

    let shown = program.to_string_lossy().into_owned();
    let path = std::env::var_os("PATH");
    let resolved =
        resolve_program(&program, path.as_deref()).ok_or(ExecError::NotFound(shown.clone()))?;

    // Held until the exec closes it (close-on-exec): the daemon sees an open connection with
    // a live owner, and then its end, never a refusal to record.
    let _probe = std::net::TcpStream::connect_timeout(&proxy, PROBE_TIMEOUT)
        .map_err(|error| ExecError::NoProxy { addr: proxy, error })?;

    let mut cmd = sandbox.command(&resolved, &program, &args);
    for (k, v) in child_env(proxy, &bundle) {
        cmd.env(k, v);
    }
    for k in REMOVED_VARS {
        cmd.env_remove(k);
    }
    tracing::debug!(
        proxy = %proxy,
        bundle = ?bundle,
        program = ?resolved,
        "exec: starting the command sandboxed"
    );
    // Descriptors this process inherited (a socket already connected somewhere, say) must
    // not reach the command: they close at exec.
    agenshield_pf::sandbox::close_inherited_on_exec();
    sandbox.enter()?;
    let err = cmd.exec();
    Err(match err.kind() {
        io::ErrorKind::NotFound => ExecError::NotFound(shown),
        _ => ExecError::CannotRun(shown, err),
    })
}

/// Where the command should send its traffic: the explicit listener, with an unspecified
/// address (`0.0.0.0`, `::`) replaced by loopback. Port 0 is an error: the config must name
/// the port the daemon listens on.
pub fn proxy_addr(explicit: SocketAddr) -> Result<SocketAddr, String> {
    if explicit.port() == 0 {
        return Err(format!(
            "listen.explicit is {explicit} in the config: exec needs the port the daemon \
             listens on (set listen.explicit to it)"
        ));
    }
    let ip = match explicit.ip() {
        IpAddr::V4(v4) if v4.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(v6) if v6.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    Ok(SocketAddr::new(ip, explicit.port()))
}

/// The variables the command gets (on top of its inherited environment, minus
/// [`REMOVED_VARS`]).
pub fn child_env(proxy: SocketAddr, bundle: &Path) -> Vec<(&'static str, OsString)> {
    let url = OsString::from(format!("http://{proxy}"));
    let mut env: Vec<(&'static str, OsString)> =
        PROXY_VARS.iter().map(|k| (*k, url.clone())).collect();
    env.push(("NODE_USE_ENV_PROXY", OsString::from("1")));
    let store = truststore_for(bundle);
    let t = AgentTrust {
        bundle,
        truststore: Some(&store),
    };
    env.extend(t.env().into_iter().map(|(k, v)| (k, OsString::from(v))));
    env
}

/// Where the bundle is kept: `$XDG_CACHE_HOME/agenshield`, else the platform's per-user
/// cache directory. As root, only where no other user can write (a root `exec` from `sudo`
/// keeps the caller's HOME on macOS, and a bundle another user planted, or a directory link
/// into somewhere else, would be root's to trust or write through): the per-user directory if
/// root owns everything above it, else [`ROOT_CACHE`].
fn cache_dir() -> Result<PathBuf, String> {
    let user = user_cache_dir(
        std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from),
        std::env::var_os("HOME").map(PathBuf::from),
    );
    if !nix::unistd::geteuid().is_root() {
        return user;
    }
    if let Ok(dir) = user.as_ref() {
        if only_root_writes(dir).is_ok() {
            return Ok(dir.clone());
        }
    }
    let dir = PathBuf::from(ROOT_CACHE);
    only_root_writes(&dir).map_err(|e| format!("the CA bundle's directory for root: {e}"))?;
    Ok(dir)
}

/// Root's own cache, for `exec` run as root.
#[cfg(target_os = "macos")]
pub const ROOT_CACHE: &str = "/var/root/Library/Caches/agenshield";
#[cfg(not(target_os = "macos"))]
pub const ROOT_CACHE: &str = "/var/cache/agenshield";

fn user_cache_dir(xdg: Option<PathBuf>, home: Option<PathBuf>) -> Result<PathBuf, String> {
    if let Some(x) = xdg {
        if x.is_absolute() {
            return Ok(x.join("agenshield"));
        }
    }
    let home = home
        .filter(|h| h.is_absolute())
        .ok_or("neither XDG_CACHE_HOME nor HOME is set: no place for the CA bundle")?;
    let base = if cfg!(target_os = "macos") {
        home.join("Library/Caches")
    } else {
        home.join(".cache")
    };
    Ok(base.join("agenshield"))
}

/// `Ok` when every existing part of `dir`, as written and with its symlinks resolved, belongs
/// to root and none is writable by group or others, except a sticky directory above the
/// deepest existing part (others cannot move root's entries out of it); what is missing,
/// root then creates where only it can.
pub fn only_root_writes(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    if !dir.is_absolute() {
        return Err(format!("{} is not an absolute path", dir.display()));
    }
    let check = |p: &Path, m: &std::fs::Metadata, deepest: bool| {
        let sticky = !deepest && m.mode() & 0o1000 != 0;
        if m.uid() != 0 || (m.mode() & 0o022 != 0 && !sticky && !m.file_type().is_symlink()) {
            return Err(format!(
                "{} (owner uid {}, mode {:o}) is not root's alone",
                p.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
        Ok(())
    };
    // As written: a link another user made (or could replace) is refused, not followed.
    let existing: Vec<&Path> = dir
        .ancestors()
        .filter(|p| std::fs::symlink_metadata(p).is_ok())
        .collect();
    for (i, p) in existing.iter().enumerate() {
        let m = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        check(p, &m, i == 0)?;
    }
    // Where the links lead.
    let deepest = existing
        .first()
        .ok_or_else(|| format!("{}: no part of it exists", dir.display()))?;
    let real = std::fs::canonicalize(deepest).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (i, p) in real.ancestors().enumerate() {
        let m = std::fs::metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
        check(p, &m, i == 0)?;
    }
    Ok(())
}

/// The bundle (system roots + the CA at `ca`) in `dir`, named after the CA so commands run
/// against different daemons never share one; reused while younger than a day. Written under
/// a name of this process's own and renamed into place, so concurrent runs never see a
/// partial file.
pub fn ensure_bundle(ca: &Path, dir: &Path) -> Result<PathBuf, String> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::DirBuilderExt;
    let pem = std::fs::read(ca).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            format!(
                "no CA certificate at {}: the daemon creates it when it first starts; is \
                 --config the daemon's config?",
                ca.display()
            )
        } else {
            format!("reading the CA certificate {}: {e}", ca.display())
        }
    })?;
    let digest = Sha256::digest(&pem);
    let tag: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    let out = dir.join(format!("ca-bundle-{tag}.pem"));
    let fresh = std::fs::metadata(&out)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age < BUNDLE_MAX_AGE);
    if fresh {
        return Ok(out);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    // `write_public` writes through a uniquely named temp file: concurrent execs each rename
    // a whole file into place.
    let configured = trust::bundle::configured_bundles(Path::new("/etc"));
    let text = trust::bundle::bundle_pem(&String::from_utf8_lossy(&pem), &configured)
        .and_then(|text| trust::bundle::write_public(&out, text.as_bytes()).map(|()| text))
        .map_err(|e| format!("writing the CA bundle {}: {e}", out.display()))?;
    let store = truststore_for(&out);
    trust::truststore::from_bundle(&text)
        .and_then(|p12| trust::bundle::write_public(&store, &p12))
        .map_err(|e| format!("writing the JVM trust store {}: {e}", store.display()))?;
    Ok(out)
}

/// The JVM trust store written beside a bundle (`ca-bundle-TAG.pem` → `truststore-TAG.p12`).
pub fn truststore_for(bundle: &Path) -> PathBuf {
    let name = bundle
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("ca-bundle");
    let tag = name.strip_prefix("ca-bundle-").unwrap_or(name);
    bundle.with_file_name(format!("truststore-{tag}.p12"))
}

/// `program` as `execvp` would find it: a name with a slash as given, else the first
/// executable file of that name in `path` (an empty entry is the current directory).
pub fn resolve_program(program: &OsStr, path: Option<&OsStr>) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    if program.is_empty() {
        return None;
    }
    if program.as_bytes().contains(&b'/') {
        let p = PathBuf::from(program);
        return p.exists().then_some(p);
    }
    let path = path.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(path).find_map(|dir| {
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let candidate = dir.join(program);
        let meta = std::fs::metadata(&candidate).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
    })
}

/// The daemon's own files, for the sandboxes that can deny paths (Seatbelt): the CA key, the
/// config file, the vault, the policies and the admin socket; symlinks resolved where the
/// path exists (Seatbelt compares resolved paths).
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
pub fn protected_paths(cfg: &Config) -> agenshield_pf::sandbox::seatbelt::Protected {
    let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let mut files = vec![real(&cfg.certs.join("ca-key.pem"))];
    files.extend(cfg.source.as_deref().map(real));
    agenshield_pf::sandbox::seatbelt::Protected {
        files,
        dirs: vec![real(&cfg.vault), real(&cfg.policies)],
        sockets: vec![real(&cfg.admin)],
    }
}

// The sandbox, one file per OS; each has `prepare`, `command` and `enter`.
#[cfg(target_os = "linux")]
mod sandbox_linux;
#[cfg(target_os = "linux")]
use sandbox_linux::Sandbox;
#[cfg(target_os = "macos")]
mod sandbox_macos;
#[cfg(target_os = "macos")]
use sandbox_macos::Sandbox;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod sandbox_other;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
use sandbox_other::Sandbox;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_proxy_address_is_the_explicit_listener_on_loopback() {
        let a = |s: &str| s.parse::<SocketAddr>().expect("addr");
        assert_eq!(proxy_addr(a("127.0.0.1:15080")), Ok(a("127.0.0.1:15080")));
        assert_eq!(proxy_addr(a("0.0.0.0:15080")), Ok(a("127.0.0.1:15080")));
        assert_eq!(proxy_addr(a("[::]:3128")), Ok(a("[::1]:3128")));
        assert_eq!(proxy_addr(a("10.0.0.5:3128")), Ok(a("10.0.0.5:3128")));
        let e = proxy_addr(a("127.0.0.1:0")).expect_err("port 0");
        assert!(e.contains("listen.explicit"), "{e}");
    }

    #[test]
    fn the_environment_points_every_tool_at_the_proxy_and_the_bundle() {
        let bundle = Path::new("/home/u/.cache/agenshield/ca-bundle-00.pem");
        let env = child_env("[::1]:15080".parse().expect("addr"), bundle);
        for k in PROXY_VARS {
            let v = env.iter().find(|(n, _)| *n == k).expect(k);
            assert_eq!(v.1, "http://[::1]:15080", "{k}");
        }
        for k in trust::CA_FILE_VARS {
            let v = env.iter().find(|(n, _)| *n == k).expect(k);
            assert_eq!(v.1, bundle.as_os_str(), "{k}");
        }
        assert!(env.contains(&("NODE_USE_ENV_PROXY", OsString::from("1"))));
        for k in REMOVED_VARS {
            assert!(env.iter().all(|(n, _)| *n != k), "{k} is removed, not set");
        }
    }

    #[test]
    fn programs_resolve_like_execvp() {
        let dir = tempfile::tempdir().expect("tempdir");
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).expect("mkdir");
        let exe = bin.join("tool");
        std::fs::write(&exe, "#!/bin/sh\n").expect("write");
        let plain = bin.join("data");
        std::fs::write(&plain, "").expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = std::env::join_paths([dir.path().join("missing"), bin.clone()]).expect("path");
        assert_eq!(
            resolve_program(OsStr::new("tool"), Some(&path)),
            Some(exe.clone())
        );
        assert_eq!(resolve_program(OsStr::new("data"), Some(&path)), None);
        assert_eq!(resolve_program(OsStr::new("nope"), Some(&path)), None);
        assert_eq!(resolve_program(OsStr::new(""), Some(&path)), None);
        assert_eq!(
            resolve_program(exe.as_os_str(), None),
            Some(exe.clone()),
            "a path is taken as given"
        );
        assert_eq!(
            resolve_program(bin.join("nope").as_os_str(), Some(&path)),
            None
        );
    }

    #[test]
    fn as_root_the_cache_is_only_where_root_alone_writes() {
        let home = Some(PathBuf::from("/home/bob"));
        assert_eq!(
            user_cache_dir(None, home.clone()),
            Ok(PathBuf::from(if cfg!(target_os = "macos") {
                "/home/bob/Library/Caches/agenshield"
            } else {
                "/home/bob/.cache/agenshield"
            }))
        );
        assert_eq!(
            user_cache_dir(Some("/x".into()), home),
            Ok(PathBuf::from("/x/agenshield"))
        );
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        // Root's private directory under sticky /tmp: fine, also where it does not exist yet.
        assert_eq!(
            only_root_writes(&dir.path().join("cache/agenshield")),
            Ok(())
        );
        // Another user's directory, or a link to somewhere root owns from one: not.
        let theirs = dir.path().join("theirs");
        std::fs::create_dir(&theirs).expect("mkdir");
        std::os::unix::fs::chown(&theirs, Some(65_534), None).expect("chown");
        assert!(only_root_writes(&theirs.join(".cache/agenshield")).is_err());
        let open = dir.path().join("open");
        std::fs::create_dir(&open).expect("mkdir");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(only_root_writes(&open.join("agenshield")).is_err());
        assert!(only_root_writes(Path::new("/tmp/agenshield")).is_err());
        // A link of another user's, even to a directory of root's.
        let private = dir.path().join("private");
        std::fs::create_dir(&private).expect("mkdir");
        let link = theirs.join(".cache");
        std::os::unix::fs::symlink(&private, &link).expect("symlink");
        assert!(only_root_writes(&private.join("agenshield")).is_ok());
        assert!(only_root_writes(&link.join("agenshield")).is_err());
    }

    #[test]
    fn the_bundle_is_named_after_the_ca_reused_and_needs_the_ca() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ca = dir.path().join("ca.pem");
        let cache = dir.path().join("cache/agenshield");
        let e = ensure_bundle(&ca, &cache).expect_err("no CA");
        assert!(e.contains("no CA certificate at"), "{e}");

        let ca_pem = |name: &str| {
            let key = rcgen::KeyPair::generate().expect("key");
            let mut p = rcgen::CertificateParams::new(vec![name.into()]).expect("params");
            p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            p.self_signed(&key).expect("cert").pem()
        };
        let pem = ca_pem("one.test");
        std::fs::write(&ca, &pem).expect("write CA");
        let b = ensure_bundle(&ca, &cache).expect("bundle");
        assert!(b.starts_with(&cache));
        let text = std::fs::read_to_string(&b).expect("read bundle");
        assert!(text.ends_with(&pem), "ends with our CA");
        let store = std::fs::read(truststore_for(&b)).expect("trust store beside it");
        let inside = trust::truststore::certs_in(&store).expect("PKCS12");
        assert_eq!(inside, trust::truststore::certs_of_bundle(&text));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&cache)
            .expect("cache")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Reused while fresh: the same file, untouched.
        std::fs::write(&b, "marker").expect("mark");
        assert_eq!(ensure_bundle(&ca, &cache).expect("again"), b);
        assert_eq!(std::fs::read_to_string(&b).expect("read"), "marker");
        // Another CA, other files; nothing left behind but the bundles and their stores.
        std::fs::write(&ca, ca_pem("two.test")).expect("write CA");
        let b2 = ensure_bundle(&ca, &cache).expect("bundle 2");
        assert_ne!(b, b2);
        let names: Vec<String> = std::fs::read_dir(&cache)
            .expect("ls")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names.len(), 4, "{names:?}");
        assert!(
            names
                .iter()
                .all(|n| n.starts_with("ca-bundle-") || n.starts_with("truststore-")),
            "{names:?}"
        );
    }

    #[test]
    fn protected_paths_name_the_daemons_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cfg = Config::defaults_in(dir.path());
        let p = protected_paths(&cfg);
        assert!(p.files[0].ends_with("ca-key.pem"));
        assert_eq!(p.dirs.len(), 2);
        assert_eq!(p.sockets, vec![cfg.admin.clone()]);
    }
}
