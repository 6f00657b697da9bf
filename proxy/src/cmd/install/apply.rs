//! Carrying out a plan: each step to do runs, and the manifest is saved after every step
//! that created (install) or removed (uninstall) something, so a failure half-way leaves a
//! manifest that still describes what is there.

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::envblock;
use super::layout::MANIFEST_PATH;
use super::manifest::{Created, Manifest};
use super::observe::sha256_hex;
use super::plan::{Action, Content, Meta, Plan, State};
use agenshield_proxy::config::Config;

#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Failed(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ApplyError {
    let what = what.into();
    move |source| ApplyError::Io { what, source }
}

/// How a run went.
#[derive(Debug, Default)]
pub struct Outcome {
    pub carried_out: usize,
    pub already: usize,
    pub warnings: Vec<String>,
    pub failed: Option<String>,
}

/// What a step did besides its plan: records learned while running (the CA's files, the
/// sha256 of what was written) and a note for the operator.
#[derive(Default)]
struct Ran {
    records: Vec<Created>,
    note: Option<String>,
}

/// Runs `plan`, printing one line per step. `manifest` is the manifest to keep up to date.
pub fn apply(plan: &Plan, manifest: &mut Option<Manifest>, uninstall: bool) -> Outcome {
    let mut out = Outcome::default();
    let mut manifest_gone = false;
    let manifest_path = Path::new(MANIFEST_PATH);
    println!("{}", plan.title);
    for (i, step) in plan.steps.iter().enumerate() {
        let n = i + 1;
        match &step.state {
            State::Done(why) => {
                out.already += 1;
                println!("{n:>2}. {why}: {}", step.summary);
            }
            State::Note => println!("{n:>2}. note: {}: {}", step.summary, step.detail),
            State::Todo => match run(&step.action) {
                Ok(ran) => {
                    out.carried_out += 1;
                    match &ran.note {
                        Some(note) => println!("{n:>2}. {note}: {}", step.summary),
                        None => println!("{n:>2}. done: {}", step.summary),
                    }
                    if let Some(m) = manifest.as_mut() {
                        let mut recs = ran.records;
                        if recs.is_empty() {
                            recs.extend(step.record.clone());
                        }
                        for r in recs {
                            m.record(r);
                        }
                    }
                }
                Err(e) => {
                    let fatal = !matches!(step.action, Action::Run { fatal: false, .. });
                    if fatal {
                        println!("{n:>2}. FAILED: {}: {e}", step.summary);
                        out.failed = Some(format!("{}: {e}", step.summary));
                    } else {
                        println!("{n:>2}. not done (warning): {}: {e}", step.summary);
                        out.warnings.push(format!(
                            "{}: {e}; run it yourself: {}",
                            step.summary, step.detail
                        ));
                    }
                }
            },
        }
        if matches!(step.action, Action::RemoveManifest) {
            manifest_gone = true;
        }
        if uninstall && out.failed.is_none() {
            if let (Some(m), Some(c)) = (manifest.as_mut(), &step.unrecord) {
                m.forget(c);
            }
        }
        let save = if uninstall {
            step.unrecord.is_some() && !manifest_gone
        } else {
            step.state == State::Todo && out.failed.is_none()
        };
        if save && manifest_path.parent().is_some_and(Path::exists) {
            if let Some(m) = manifest.as_ref() {
                if let Err(e) = m.save(manifest_path) {
                    out.failed = Some(format!("saving {MANIFEST_PATH}: {e}"));
                }
            }
        }
        if out.failed.is_some() {
            break;
        }
    }
    out
}

fn run(action: &Action) -> Result<Ran, ApplyError> {
    let mut ran = Ran::default();
    match action {
        Action::Note | Action::Keep { .. } => {}
        Action::Run { commands, .. } => {
            for c in commands {
                run_command(c)?;
            }
        }
        Action::MakeDir { path, meta } => {
            std::fs::DirBuilder::new()
                .mode(meta.mode)
                .create(path)
                .map_err(io(format!("mkdir {}", path.display())))?;
            set_meta(path, meta)?;
        }
        Action::SetMeta { path, meta } => set_meta(path, meta)?,
        // The agent's own directories and files: never followed (`userfile`).
        Action::MakeUserDir { path, meta } => {
            let (uid, gid) = ids(&meta.owner, Some(&meta.group))?;
            super::userfile::mkdir(path, meta.mode, uid, gid.unwrap_or(uid))
                .map_err(io(format!("mkdir {}", path.display())))?;
        }
        Action::WriteUserFile { path, meta, text } => {
            let (uid, gid) = ids(&meta.owner, Some(&meta.group))?;
            super::userfile::write(path, text.as_bytes(), meta.mode, uid, gid.unwrap_or(uid))
                .map_err(io(format!("writing {}", path.display())))?;
            ran.records.push(Created::File {
                path: path.clone(),
                sha256: Some(sha256_hex(text.as_bytes())),
            });
        }
        Action::Write {
            path,
            meta,
            content,
        } => {
            let sha = write_content(path, meta, content)?;
            ran.records.push(Created::File {
                path: path.clone(),
                sha256: sha,
            });
        }
        Action::CreateCa { dir, key_owner } => {
            // Said in the step's own line, not as a log line in the middle of the plan.
            let (ca, _) =
                tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::new(), || {
                    agenshield_certs::Ca::load_or_create(dir)
                })
                .map_err(|e| ApplyError::Failed(format!("CA in {}: {e}", dir.display())))?;
            ran.note = Some(format!(
                "done (SHA-256 fingerprint {})",
                ca.fingerprint_sha256()
            ));
            let key = dir.join("ca-key.pem");
            let (uid, _) = ids(key_owner, None)?;
            std::os::unix::fs::chown(&key, Some(uid), None)
                .map_err(io(format!("chown {}", key.display())))?;
            for f in ["ca.pem", "ca-key.pem"] {
                let p = dir.join(f);
                let bytes = std::fs::read(&p).map_err(io(format!("reading {}", p.display())))?;
                ran.records.push(Created::File {
                    path: p,
                    sha256: Some(sha256_hex(&bytes)),
                });
            }
        }
        Action::CreateAuditKey { path, owner } => {
            use agenshield_proxy::audit::checkpoint_key::{public_key_path, CheckpointKey};
            let (key, _) =
                tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::new(), || {
                    CheckpointKey::load_or_create(path)
                })
                .map_err(|e| ApplyError::Failed(e.to_string()))?;
            ran.note = Some(format!("done (key id {})", key.public().id()));
            let (uid, _) = ids(owner, None)?;
            std::os::unix::fs::chown(path, Some(uid), None)
                .map_err(io(format!("chown {}", path.display())))?;
            for p in [path.clone(), public_key_path(path)] {
                let bytes = std::fs::read(&p).map_err(io(format!("reading {}", p.display())))?;
                ran.records.push(Created::File {
                    path: p,
                    sha256: Some(sha256_hex(&bytes)),
                });
            }
        }
        // The agent's own files, in the agent's own directory: never followed (`userfile`).
        Action::AddEnvBlock { path, meta, block } => {
            let existing =
                super::userfile::read(path).map_err(io(format!("reading {}", path.display())))?;
            let (mode, uid, gid) = match &existing {
                Some(f) => (f.mode, f.uid, f.gid),
                None => {
                    let (uid, gid) = ids(&meta.owner, Some(&meta.group))?;
                    (meta.mode, uid, gid.unwrap_or(uid))
                }
            };
            let text = envblock::with_block(existing.as_ref().map_or("", |f| &f.text), block);
            super::userfile::write(path, text.as_bytes(), mode, uid, gid)
                .map_err(io(format!("writing {}", path.display())))?;
        }
        Action::RemoveEnvBlock {
            path,
            delete_if_empty,
        } => {
            let existing =
                super::userfile::read(path).map_err(io(format!("reading {}", path.display())))?;
            if let Some(f) = existing {
                let text = envblock::without_block(&f.text);
                if *delete_if_empty && text.trim().is_empty() {
                    remove_file(path)?;
                } else {
                    super::userfile::write(path, text.as_bytes(), f.mode, f.uid, f.gid)
                        .map_err(io(format!("writing {}", path.display())))?;
                }
            }
        }
        Action::FirewallUp { config } => {
            let cfg = Config::load(config).map_err(|e| ApplyError::Failed(e.to_string()))?;
            let spec = agenshield_proxy::daemon::firewall::spec(&cfg, &cfg.transparent, &cfg.dns)
                .map_err(|e| ApplyError::Failed(e.to_string()))?;
            agenshield_pf::platform_redirector()
                .apply(&spec)
                .map_err(|e| ApplyError::Failed(e.to_string()))?;
        }
        Action::FirewallDown => {
            agenshield_pf::platform_redirector()
                .remove()
                .map_err(|e| ApplyError::Failed(e.to_string()))?;
        }
        Action::RemoveFile { path } => remove_file(path)?,
        Action::RemoveDir { path, purge } => {
            let r = if *purge {
                std::fs::remove_dir_all(path)
            } else {
                std::fs::remove_dir(path)
            };
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) if e.kind() == std::io::ErrorKind::DirectoryNotEmpty => {
                    let left = std::fs::read_dir(path).map(|d| d.count()).unwrap_or(0);
                    ran.note = Some(format!(
                        "kept (not empty: {left} entries install did not write)"
                    ));
                }
                Err(e) => return Err(io(format!("removing {}", path.display()))(e)),
            }
        }
        Action::DeleteAccount {
            group,
            name,
            command,
        } => {
            let exists = if *group {
                matches!(nix::unistd::Group::from_name(name), Ok(Some(_)))
            } else {
                matches!(nix::unistd::User::from_name(name), Ok(Some(_)))
            };
            if exists {
                run_command(command)?;
            } else {
                ran.note = Some("already gone".into());
            }
        }
        Action::RemoveManifest => remove_file(Path::new(MANIFEST_PATH))?,
        Action::Link { path, target } => std::os::unix::fs::symlink(target, path)
            .map_err(io(format!("ln -s {} {}", target.display(), path.display())))?,
        Action::RemoveLink { path, target } => match std::fs::read_link(path) {
            Ok(t) if t == *target => remove_file(path)?,
            Ok(_) => ran.note = Some("kept (not our link any more)".into()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                ran.note = Some("already gone".into())
            }
            Err(_) => ran.note = Some("kept (not a link any more)".into()),
        },
        Action::Retire { path, to } => {
            if std::fs::symlink_metadata(to).is_ok() {
                return Err(ApplyError::Failed(format!("{} exists", to.display())));
            }
            std::fs::rename(path, to).map_err(io(format!(
                "mv {} {}",
                path.display(),
                to.display()
            )))?;
            close_to_root(to)?;
            ran.note = Some(format!("kept as {}", to.display()));
        }
        Action::CloseToRoot { paths, uids, gids } => {
            let mut closed = Vec::new();
            for p in paths {
                close_tree(p, uids, gids, &mut closed)?;
            }
            ran.note = Some(if closed.is_empty() {
                "done (nothing kept was theirs)".to_string()
            } else {
                let list: Vec<String> = closed.iter().map(|p| p.display().to_string()).collect();
                format!("done ({} now root's alone)", list.join(", "))
            });
        }
    }
    Ok(ran)
}

/// Makes `path` root's with no access for group and others, without following a link.
fn close_to_root(path: &Path) -> Result<(), ApplyError> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::symlink_metadata(path).map_err(io(format!("stat {}", path.display())))?;
    if m.file_type().is_symlink() {
        return Ok(());
    }
    std::os::unix::fs::lchown(path, Some(0), Some(0))
        .map_err(io(format!("chown root:root {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(m.mode() & 0o700))
        .map_err(io(format!("chmod go-rwx {}", path.display())))
}

/// [`Action::CloseToRoot`] under one path: what the ids own is closed (and not looked into:
/// nobody else can reach its content now); only directories root owns alone are looked into.
fn close_tree(
    path: &Path,
    uids: &[u32],
    gids: &[u32],
    closed: &mut Vec<PathBuf>,
) -> Result<(), ApplyError> {
    use std::os::unix::fs::MetadataExt as _;
    const MAX_DEPTH: usize = 16;
    let mut stack = vec![(path.to_path_buf(), 0)];
    while let Some((p, depth)) = stack.pop() {
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if m.file_type().is_symlink() {
            continue;
        }
        if uids.contains(&m.uid()) || gids.contains(&m.gid()) {
            close_to_root(&p)?;
            closed.push(p);
            continue;
        }
        if m.is_dir() && m.uid() == 0 && m.mode() & 0o022 == 0 && depth < MAX_DEPTH {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| (e.path(), depth + 1)));
            }
        }
    }
    Ok(())
}

fn run_command(argv: &[String]) -> Result<(), ApplyError> {
    let out = Command::new(&argv[0])
        .args(&argv[1..])
        .output()
        .map_err(io(format!("running {}", argv[0])))?;
    if out.status.success() {
        return Ok(());
    }
    Err(ApplyError::Failed(format!(
        "`{}` failed ({}): {}",
        super::plan::command_line(&[argv.to_vec()]),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

/// Owner and group by name (or number, for ids without a name) → ids.
fn ids(owner: &str, group: Option<&str>) -> Result<(u32, Option<u32>), ApplyError> {
    let uid = match nix::unistd::User::from_name(owner) {
        Ok(Some(u)) => u.uid.as_raw(),
        _ => owner
            .parse()
            .map_err(|_| ApplyError::Failed(format!("no user {owner}")))?,
    };
    let gid = match group {
        None => None,
        Some(g) => Some(match nix::unistd::Group::from_name(g) {
            Ok(Some(g)) => g.gid.as_raw(),
            _ => g
                .parse()
                .map_err(|_| ApplyError::Failed(format!("no group {g}")))?,
        }),
    };
    Ok((uid, gid))
}

fn set_meta(path: &Path, meta: &Meta) -> Result<(), ApplyError> {
    let (uid, gid) = ids(&meta.owner, Some(&meta.group))?;
    std::os::unix::fs::chown(path, Some(uid), gid)
        .map_err(io(format!("chown {}", path.display())))?;
    // Exact mode, whatever the umask was.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(meta.mode))
        .map_err(io(format!("chmod {}", path.display())))
}

/// Removes a file install made; its directory is reached without following another user's
/// links (some are in the agent's home).
fn remove_file(path: &Path) -> Result<(), ApplyError> {
    super::userfile::remove(path).map_err(io(format!("rm {}", path.display())))
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".agenshield-tmp");
    path.with_file_name(name)
}

fn write_atomic(
    path: &Path,
    meta: &Meta,
    fill: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>,
) -> Result<(), ApplyError> {
    let tmp = tmp_path(path);
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io(format!("creating {}", tmp.display())))?;
        fill(&mut f).map_err(io(format!("writing {}", tmp.display())))?;
        f.sync_all()
            .map_err(io(format!("writing {}", tmp.display())))?;
        set_meta(&tmp, meta)?;
        std::fs::rename(&tmp, path).map_err(io(format!("renaming to {}", path.display())))
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Writes a planned file; the sha256 of what was written, for the manifest (`None` for the
/// binary, which is always ours to remove).
fn write_content(
    path: &Path,
    meta: &Meta,
    content: &Content,
) -> Result<Option<String>, ApplyError> {
    match content {
        Content::Text(t) => {
            write_atomic(path, meta, |f| f.write_all(t.as_bytes()))?;
            Ok(Some(sha256_hex(t.as_bytes())))
        }
        Content::CopyOf(src) => {
            let mut from =
                std::fs::File::open(src).map_err(io(format!("opening {}", src.display())))?;
            write_atomic(path, meta, |f| std::io::copy(&mut from, f).map(|_| ()))?;
            Ok(None)
        }
        Content::CaBundle { ca, keep } => {
            let text = bundle_text(path, ca, keep)?;
            write_atomic(path, meta, |f| f.write_all(text.as_bytes()))?;
            Ok(Some(sha256_hex(text.as_bytes())))
        }
        Content::TrustStore { ca, keep } => {
            let text = bundle_text(path, ca, keep)?;
            let p12 = crate::cmd::trust::truststore::from_bundle(&text)
                .map_err(io(format!("writing {}", path.display())))?;
            write_atomic(path, meta, |f| f.write_all(&p12))?;
            Ok(Some(sha256_hex(&p12)))
        }
    }
}

/// The agent's bundle for the CA at `ca`, for the file at `path`.
fn bundle_text(
    path: &Path,
    ca: &Path,
    keep: &[crate::cmd::trust::bundle::Configured],
) -> Result<String, ApplyError> {
    let what = || format!("writing {} from {}", path.display(), ca.display());
    let pem = std::fs::read_to_string(ca).map_err(io(what()))?;
    crate::cmd::trust::bundle::bundle_pem(&pem, keep).map_err(io(what()))
}
