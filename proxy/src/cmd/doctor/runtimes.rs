//! For each runtime found on the machine: will it trust our CA in each of the agent's
//! contexts, by what it reads there, and if not, the fix. The runtimes are found through the
//! agent's PATH: what doctor runs of them (python3, keytool) runs as the agent ([`Access`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::agent::Agent;
use super::agent_access::Access;
use super::contexts::{Context, ContextKind};
use super::finding::{Area, Finding};
use super::holds::{holds, Holds};
use super::installed::Installed;
use super::sources::{sources, Machine, Source};
use crate::cmd::trust::runtimes::Runtime;

/// What python3 has installed, asked once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Python {
    pub requests: bool,
    pub httpx: bool,
    pub grpc: bool,
}

const PROBE: &str = "import importlib.util as u, json\n\
r = {m: u.find_spec(m) is not None for m in ('requests', 'httpx', 'grpc', 'certifi')}\n\
try:\n    import certifi; r['where'] = certifi.where()\n\
except Exception:\n    r['where'] = None\n\
print(json.dumps(r))\n";

/// Asks `python3` (isolated: no user site, no environment), as the agent, which packages it
/// has and where certifi's bundle is.
pub fn probe_python(python: &Path, access: &Access) -> (Python, Option<PathBuf>) {
    let mut cmd = access.command(python);
    cmd.args(["-I", "-c", PROBE]);
    let Some(v) = access
        .run(cmd, Duration::from_secs(15))
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
    else {
        return (Python::default(), None);
    };
    let has = |m: &str| v[m].as_bool() == Some(true);
    (
        Python {
            requests: has("requests"),
            httpx: has("httpx"),
            grpc: has("grpc"),
        },
        v["where"].as_str().map(PathBuf::from),
    )
}

/// `name` in the first of `dirs` that has it as an executable file.
pub fn which(name: &str, dirs: &[PathBuf]) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    dirs.iter().map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The JDK's `cacerts` and `keytool` beside the `java` that `java` resolves to.
pub fn jdk(java: &Path) -> (Option<PathBuf>, Option<PathBuf>) {
    let Some(bin) = std::fs::canonicalize(java)
        .ok()
        .and_then(|real| real.parent().map(Path::to_path_buf))
    else {
        return (None, None);
    };
    let cacerts = bin
        .parent()
        .map(|home| home.join("lib/security/cacerts"))
        .filter(|p| p.exists());
    let keytool = Some(bin.join("keytool")).filter(|p| p.exists());
    (cacerts, keytool)
}

/// How a runtime was found (its binary, or the python package).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub runtime: Runtime,
    pub at: String,
}

/// Which runtimes are on the machine: binaries in `dirs`, packages in python3.
pub fn find(dirs: &[PathBuf], python: &Python) -> Vec<Found> {
    let bin = |names: &[&str]| names.iter().find_map(|n| which(n, dirs));
    let py = which("python3", dirs);
    Runtime::ALL
        .iter()
        .filter_map(|&rt| {
            let at = match rt {
                Runtime::Curl => bin(&["curl"]),
                Runtime::Wget => bin(&["wget"]),
                Runtime::Git => bin(&["git"]),
                Runtime::Python => py.clone(),
                Runtime::Requests => py.clone().filter(|_| python.requests),
                Runtime::Httpx => py.clone().filter(|_| python.httpx),
                Runtime::Grpc => py.clone().filter(|_| python.grpc),
                Runtime::Pip => bin(&["pip3", "pip"]),
                Runtime::Node => bin(&["node", "nodejs"]),
                Runtime::Npm => bin(&["npm"]),
                Runtime::Java => bin(&["java"]),
                Runtime::Go => bin(&["go"]),
            }?;
            let at = match rt {
                Runtime::Requests => format!("{} (module requests)", at.display()),
                Runtime::Httpx => format!("{} (module httpx)", at.display()),
                Runtime::Grpc => format!("{} (module grpc)", at.display()),
                _ => at.display().to_string(),
            };
            Some(Found { runtime: rt, at })
        })
        .collect()
}

/// What one runtime does in one context.
#[derive(Debug, Clone)]
struct Outcome<'c> {
    ctx: &'c Context,
    /// The source that decides (the first); `holds` is the verdict over all of them.
    source: Source,
    holds: Holds,
}

/// The finding for one runtime across `contexts`.
pub fn check(
    found: &Found,
    contexts: &[Context],
    agent: &Agent,
    machine: &Machine,
    ca: &[u8],
    inst: &Installed,
    access: &Access,
) -> Finding {
    let rt = found.runtime;
    let outcomes: Vec<Outcome> = contexts
        .iter()
        .map(|ctx| {
            let home = match ctx.kind {
                ContextKind::ThisProcess => {
                    ctx.get("HOME").map_or(agent.home.clone(), PathBuf::from)
                }
                _ => agent.home.clone(),
            };
            let all = sources(rt, ctx, &home, machine, access);
            let verdicts: Vec<Holds> = all
                .iter()
                .map(|s| match s.file() {
                    Some((path, format)) => holds(path, format, ca, agent, access),
                    None => Holds::Builtin,
                })
                .collect();
            let holds = if verdicts.iter().any(Holds::trusts) {
                Holds::Yes
            } else {
                verdicts.first().cloned().unwrap_or(Holds::Builtin)
            };
            Outcome {
                ctx,
                source: all
                    .first()
                    .cloned()
                    .unwrap_or(Source::Builtin { what: "nothing" }),
                holds,
            }
        })
        .collect();
    let subject = rt.name();
    let failing: Vec<&Outcome> = outcomes.iter().filter(|o| !o.holds.trusts()).collect();
    if failing.is_empty() {
        return Finding::ok(
            Area::Runtime,
            subject,
            format!("{} ({})", describe_sources(&outcomes), found.at),
        );
    }
    // Contexts that fail the same way are named together.
    let mut whys: Vec<(Vec<&str>, String)> = Vec::new();
    for o in &failing {
        let w = why(rt, o);
        match whys.iter_mut().find(|(_, seen)| *seen == w) {
            Some((kinds, _)) => kinds.push(o.ctx.kind.short()),
            None => whys.push((vec![o.ctx.kind.short()], w)),
        }
    }
    let detail = whys
        .iter()
        .map(|(kinds, w)| format!("{}: {w}", kinds.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    let mut fixes: Vec<String> = Vec::new();
    for o in &failing {
        let f = fix(rt, o, agent, inst);
        if !fixes.contains(&f) {
            fixes.push(f);
        }
    }
    Finding::fail(Area::Runtime, subject, detail, fixes.join("; "))
}

/// "reads X → P (login, non-login)", or per context where they differ.
fn describe_sources(outcomes: &[Outcome]) -> String {
    let first = &outcomes[0].source;
    if outcomes.iter().all(|o| o.source == *first) {
        let ctxs: Vec<&str> = outcomes.iter().map(|o| o.ctx.kind.short()).collect();
        format!("reads {} [{}]", first.describe(), ctxs.join(", "))
    } else {
        outcomes
            .iter()
            .map(|o| format!("{}: reads {}", o.ctx.kind.short(), o.source.describe()))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

fn why(rt: Runtime, o: &Outcome) -> String {
    let reads = format!(
        "reads {}, which {}",
        o.source.describe(),
        o.holds.describe()
    );
    let ours_missed = o.source.is_default()
        || (rt.overriding_var().is_some() && matches!(o.source, Source::Setting { .. }));
    if !ours_missed {
        return reads;
    }
    match rt.ours().var() {
        Some(v) => format!("{v} is not set, so it {reads}"),
        None => format!("no ca_certificate in its wgetrc, so it {reads}"),
    }
}

fn fix(rt: Runtime, o: &Outcome, agent: &Agent, inst: &Installed) -> String {
    let reinstall = |p: &Path| {
        format!(
            "`sudo agenshield proxy install` rewrites {} (see the CA files above)",
            p.display()
        )
    };
    let bundle = inst.bundle.display();
    let ca = inst.ca.display();
    match &o.source {
        Source::Var { path, .. } | Source::Setting { path, .. } if *path == inst.bundle => {
            reinstall(path)
        }
        Source::JavaOption { path, .. } if *path == inst.truststore => reinstall(path),
        Source::Var { name, path, .. } if matches!(o.holds, Holds::NotAFile(_)) => format!(
            "{name} = {} in the agent's {} is not a file: remove what sets it (ours names \
             {bundle})",
            path.display(),
            o.ctx.kind.short(),
        ),
        Source::Var { name, path, .. } => format!(
            "{name} = {} in the agent's {} is not ours: remove what sets it (ours names \
             {bundle}), or add the CA ({ca}) to {}",
            path.display(),
            o.ctx.kind.short(),
            path.display()
        ),
        Source::Setting { file, key, path } => match rt.overriding_var() {
            Some(v) => format!(
                "{} ({v} overrides {})",
                unset_fix(v, o.ctx.kind, agent, inst),
                file.display()
            ),
            None => format!(
                "in {}, set `{key} = {bundle}` (or add the CA, {ca}, to {})",
                file.display(),
                path.display()
            ),
        },
        Source::JavaOption { var, path, .. } => format!(
            "{var} names the trust store {}: remove that -Djavax.net.ssl.trustStore (ours is \
             {}), or import the CA: keytool -importcert -noprompt -alias agenshield -file {ca} \
             -keystore {}",
            path.display(),
            inst.truststore.display(),
            path.display()
        ),
        _ => match rt.ours().var() {
            None => format!(
                "add `ca_certificate = {bundle}` to {} (`sudo agenshield proxy install` writes it)",
                agent.home.join(".wgetrc").display()
            ),
            Some(v) => unset_fix(v, o.ctx.kind, agent, inst),
        },
    }
}

/// The fix when one of our variables is missing from a context.
pub fn unset_fix(var: &str, kind: ContextKind, agent: &Agent, inst: &Installed) -> String {
    match kind {
        ContextKind::Login => format!(
            "`sudo agenshield proxy install` puts {var} back in the agent's ~/.profile and \
             ~/.bashrc (if it is there, something after our block unsets it)"
        ),
        ContextKind::NonLogin => match inst.pam_enabled {
            Some(false) => format!(
                "`sudo pam-auth-update --enable agenshield` (or `sudo agenshield proxy install`) \
                 so PAM gives the agent's sessions {}",
                inst.env_file.display()
            ),
            _ => format!(
                "`sudo agenshield proxy install` rewrites {}, which PAM gives the agent's \
                 sessions",
                inst.env_file.display()
            ),
        },
        ContextKind::ThisProcess => format!(
            "run it from a login shell (`su -l {}`) or a PAM session (`sudo -u {}`), where \
             {var} is set; or set {var}={} yourself",
            agent.name,
            agent.name,
            inst.bundle.display()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::doctor::finding::Status;
    use std::os::unix::fs::PermissionsExt;

    fn pem() -> (String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), cert.der().to_vec())
    }

    #[test]
    fn a_broken_wgetrc_fails_wget_with_the_fix_and_other_contexts_are_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let (ours_pem, ca) = pem();
        let (other_pem, _) = pem();
        let bundle = root.join("agent-ca-bundle.pem");
        let sys = root.join("system.pem");
        std::fs::write(&bundle, format!("{other_pem}{ours_pem}")).expect("write");
        std::fs::write(&sys, &other_pem).expect("write");
        for f in [&bundle, &sys] {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        let home = root.join("home");
        std::fs::create_dir_all(&home).expect("mkdir");
        let agent = Agent {
            name: "agent-test".into(),
            uid: 65_002,
            gids: vec![65_002],
            home: home.clone(),
        };
        let machine = Machine {
            system_bundle: Some(sys.clone()),
            etc: root.join("etc"),
            ..Machine::default()
        };
        let inst = Installed {
            ca: root.join("ca.pem"),
            bundle: bundle.clone(),
            truststore: root.join("agent-truststore.p12"),
            env_file: root.join("agent-env"),
            pam_enabled: Some(false),
        };
        let b = bundle.display().to_string();
        let login = Context {
            kind: ContextKind::Login,
            env: [("CURL_CA_BUNDLE".to_string(), b.clone())].into(),
        };
        let plain = Context {
            kind: ContextKind::NonLogin,
            env: Default::default(),
        };
        let contexts = [login, plain];
        let check_rt = |rt| {
            let found = Found {
                runtime: rt,
                at: "/usr/bin/x".into(),
            };
            check(
                &found,
                &contexts,
                &agent,
                &machine,
                &ca,
                &inst,
                &Access::ours(),
            )
        };
        // curl: ours in the login shell; nothing outside it, where PAM is not enabled.
        let f = check_rt(Runtime::Curl);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail
                .starts_with("non-login: CURL_CA_BUNDLE is not set, so it reads the system bundle"),
            "{}",
            f.detail
        );
        assert!(
            f.fix
                .as_deref()
                .unwrap_or("")
                .contains("pam-auth-update --enable agenshield"),
            "{f:?}"
        );
        // wget: our block in ~/.wgetrc works in every context...
        std::fs::write(home.join(".wgetrc"), format!("ca_certificate = {b}\n")).expect("write");
        let f = check_rt(Runtime::Wget);
        assert_eq!(f.status, Status::Ok, "{f:?}");
        assert!(f.detail.contains("[login, non-login]"), "{}", f.detail);
        // ...until a later line points it elsewhere.
        std::fs::write(
            home.join(".wgetrc"),
            format!("ca_certificate = {b}\nca_certificate = {}\n", sys.display()),
        )
        .expect("write");
        let f = check_rt(Runtime::Wget);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail.contains("does not hold the AgenShield CA"),
            "{}",
            f.detail
        );
        assert_eq!(
            f.fix.as_deref(),
            Some(
                format!(
                    "in {}, set `ca_certificate = {b}` (or add the CA, {}, to {})",
                    home.join(".wgetrc").display(),
                    inst.ca.display(),
                    sys.display()
                )
                .as_str()
            )
        );
    }
}
