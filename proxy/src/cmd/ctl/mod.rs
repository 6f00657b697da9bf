//! `agenshield proxy ctl …`: the operator's client for the admin API, plus the offline
//! policy commands. Exit codes: 0 ok, 1 the operation failed, 2 bad usage or bad input.

mod audit_keys;
mod ca;
pub(crate) mod client;
mod escape;
mod mcp;
pub(crate) mod output;
pub(crate) mod remote;
mod render;
mod secrets;
mod suggest;
mod tail;

use std::path::{Path, PathBuf};

use http::Method;

pub use client::{Client, CtlError};

use crate::cli::{AuditCommand, CtlArgs, CtlCommand, PendingCommand, PolicyCommand};
use agenshield_proxy::config::Config;
use agenshield_proxy::policy::Policy;

pub const OK: u8 = 0;
pub const FAILED: u8 = 1;
pub const BAD_INPUT: u8 = 2;

pub fn run(args: CtlArgs, cfg: &Config) -> u8 {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            return output::failed(e);
        }
    };
    let socket = args.socket.clone().unwrap_or_else(|| cfg.admin.clone());
    runtime.block_on(dispatch(args, cfg, &socket))
}

async fn dispatch(args: CtlArgs, cfg: &Config, socket: &Path) -> u8 {
    let json = args.json;
    output::set_json(json);
    let client = match &args.remote {
        None => Client::new(socket),
        Some(url) => {
            let (Some(cert), Some(key)) = (&args.cert, &args.key) else {
                return output::bad_input("--remote needs --cert FILE and --key FILE: the client certificate the daemon's listen.client_ca issued");
            };
            match remote::Remote::new(url, cert, key, args.ca.as_deref()) {
                Ok(r) => Client::remote(r),
                Err(e) => return fail(e),
            }
        }
    };
    match args.command {
        CtlCommand::Policy(PolicyCommand::Lint { files }) => lint(cfg, &files, json),
        CtlCommand::Audit(AuditCommand::Verify {
            files,
            checkpoints: false,
            ..
        }) => audit_verify(cfg, files, json),
        CtlCommand::Audit(AuditCommand::Verify {
            files,
            checkpoints: true,
            keys,
        }) => audit_keys::verify_checkpoints(cfg, audit_files(cfg, files), &keys, json),
        CtlCommand::Audit(AuditCommand::Key { out }) => audit_keys::key(cfg, out.as_deref(), json),
        CtlCommand::Policy(PolicyCommand::Check {
            method,
            url,
            policy,
            agent,
            exit_code,
            mcp_tool,
            mcp_method,
        }) => {
            let agent = match agent
                .as_deref()
                .map(agenshield_proxy::policy::agent_uid)
                .transpose()
            {
                Ok(a) => a,
                Err(e) => return output::bad_input(e),
            };
            let ask = (method.as_str(), url.as_str(), agent);
            let mcp = (mcp_tool.is_some() || mcp_method.is_some()).then_some(
                agenshield_proxy::control::policy_check::McpCall {
                    method: mcp_method,
                    tool: mcp_tool,
                },
            );
            policy_check(cfg, &client, ask, mcp, policy.as_deref(), exit_code, json).await
        }
        CtlCommand::Policy(PolicyCommand::Suggest {
            since,
            agent,
            write,
        }) => {
            let agent = match agent
                .as_deref()
                .map(agenshield_proxy::policy::agent_uid)
                .transpose()
            {
                Ok(a) => a,
                Err(e) => return output::bad_input(e),
            };
            let ask = suggest::Ask {
                since: since.map(Into::into),
                agent,
                write,
            };
            suggest::run(cfg, ask)
        }
        CtlCommand::Status => get(&client, "/v1/status", json, render::status).await,
        CtlCommand::Stats => get(&client, "/v1/stats", json, render::stats).await,
        CtlCommand::Policy(PolicyCommand::Show) => {
            get(&client, "/v1/policy", json, render::policy).await
        }
        CtlCommand::Reload => match client.json(Method::POST, "/v1/reload", None).await {
            Ok(v) => print(&v, json, |v| {
                format!(
                    "policy reloaded: {} ({} rules)",
                    v["hash"].as_str().unwrap_or("?"),
                    v["rules"]
                )
            }),
            Err(e) => fail(e),
        },
        CtlCommand::Pending(PendingCommand::List) => {
            get(&client, "/v1/pending", json, render::pending).await
        }
        CtlCommand::Pending(PendingCommand::Approve { id, .. } | PendingCommand::Deny { id })
            if !id.chars().all(|c| c.is_ascii_alphanumeric()) =>
        {
            output::bad_input(format!(
                "{id:?} is not a pending request id (see `ctl pending list`)"
            ))
        }
        CtlCommand::Pending(PendingCommand::Approve { id, remember }) => {
            let path = format!(
                "/v1/pending/{id}/approve{}",
                if remember { "?remember=1" } else { "" }
            );
            answer(&client, &path, json, "approved", remember).await
        }
        CtlCommand::Pending(PendingCommand::Deny { id }) => {
            answer(
                &client,
                &format!("/v1/pending/{id}/deny"),
                json,
                "denied",
                false,
            )
            .await
        }
        CtlCommand::Secrets(cmd) => secrets::run(&client, cmd, json).await,
        CtlCommand::Mcp(cmd) => mcp::run(&client, cmd, json).await,
        CtlCommand::Ca(cmd) => ca::run(cfg, cmd, json),
        CtlCommand::Tail {
            follow,
            lines,
            decision,
            host,
        } => {
            let lines = lines.or(follow.then_some(10));
            tail::run(&client, follow, lines, decision, host, json).await
        }
    }
}

/// Says what failed; the exit code is 2 when the daemon called the request bad input, else 1.
pub(crate) fn fail(e: CtlError) -> u8 {
    use output::ErrorCode;
    let code = match e {
        CtlError::BadInput(_) => ErrorCode::BadInput,
        CtlError::NotRunning(_) => ErrorCode::NotRunning,
        CtlError::NoAccess(_) => ErrorCode::NoAccess,
        CtlError::Refused(_) => ErrorCode::Refused,
        CtlError::Protocol(_) => ErrorCode::Protocol,
        CtlError::Unreachable(_) => ErrorCode::NotRunning,
    };
    output::error(code, &e.to_string())
}

pub(crate) fn print(
    v: &serde_json::Value,
    json: bool,
    human: impl Fn(&serde_json::Value) -> String,
) -> u8 {
    if json {
        output::line(&serde_json::to_string_pretty(v).unwrap_or_default());
    } else {
        output::line(&escape::render_safely(v, human));
    }
    OK
}

async fn get(
    client: &Client,
    path: &str,
    json: bool,
    human: fn(&serde_json::Value) -> String,
) -> u8 {
    match client.json(Method::GET, path, None).await {
        Ok(v) => print(&v, json, human),
        Err(e) => fail(e),
    }
}

async fn answer(client: &Client, path: &str, json: bool, verb: &str, remember: bool) -> u8 {
    match client.json(Method::POST, path, None).await {
        Ok(v) => print(&v, json, |v| {
            format!(
                "{verb} {}: {} {}:{}{} (agent {}{})",
                v["id"].as_str().unwrap_or("?"),
                v["method"].as_str().unwrap_or(""),
                v["host"].as_str().unwrap_or(""),
                v["port"],
                v["path"].as_str().unwrap_or(""),
                render::agent(&v["agent_uid"]),
                if remember {
                    "; later requests of this agent with this method and path pass"
                } else {
                    ""
                }
            )
        }),
        Err(e) => fail(e),
    }
}

/// `policy check`: asks the daemon, or decides offline (`--policy`, or the configured
/// directory when the daemon is down). With `exit_code`, exits 1 unless allowed outright.
async fn policy_check(
    cfg: &Config,
    client: &Client,
    (method, url, agent): (&str, &str, Option<u32>),
    mcp: Option<agenshield_proxy::control::policy_check::McpCall>,
    policy: Option<&Path>,
    exit_code: bool,
    json: bool,
) -> u8 {
    let offline = |path: &Path| -> Result<serde_json::Value, u8> {
        let p = load_policy(path).map_err(|e| policy_error(&e))?;
        let denied = cfg.dns_answers.denied;
        let r = match &mcp {
            Some(call) => agenshield_proxy::control::policy_check::check_mcp(
                &p, method, url, agent, denied, call,
            ),
            None => agenshield_proxy::control::policy_check::check(&p, method, url, agent, denied),
        }
        .map_err(output::bad_input)?;
        Ok(serde_json::to_value(&r).unwrap_or_default())
    };
    let result = match policy {
        Some(path) => offline(path),
        None => {
            let body =
                serde_json::json!({ "method": method, "url": url, "agent": agent, "mcp": mcp });
            match client
                .json(Method::POST, "/v1/policy/check", Some(body))
                .await
            {
                Ok(v) => Ok(v),
                Err(CtlError::NotRunning(socket)) => {
                    eprintln!(
                        "agenshield: the daemon is not running (no one answers on {}); deciding offline against {}",
                        socket.display(),
                        cfg.policies.display()
                    );
                    offline(&cfg.policies)
                }
                Err(e) => Err(fail(e)),
            }
        }
    };
    let v = match result {
        Ok(v) => v,
        Err(code) => return code,
    };
    print(&v, json, render::check);
    let allowed = v["decision"] == "allow" && v["reported_deny"] != true;
    if exit_code && !allowed {
        return FAILED;
    }
    OK
}

/// A policy directory, or a single policy file.
fn load_policy(path: &Path) -> Result<Policy, agenshield_proxy::policy::PolicyError> {
    if path.is_dir() {
        Policy::load_dir(path)
    } else {
        agenshield_proxy::policy::load_files(&[path.to_path_buf()])
    }
}

/// FILEs as given, or the configured log and its rotations, oldest first.
fn audit_files(cfg: &Config, files: Vec<PathBuf>) -> Result<Vec<PathBuf>, &'static str> {
    use agenshield_proxy::audit::verify::rotation_set;
    if !files.is_empty() {
        return Ok(files);
    }
    match &cfg.audit_path {
        Some(live) => Ok(rotation_set(live, cfg.audit.keep)),
        None => Err("the audit log is off (audit.enabled = false); name a FILE"),
    }
}

fn audit_verify(cfg: &Config, files: Vec<PathBuf>, json: bool) -> u8 {
    use agenshield_proxy::audit::verify::verify;
    let files = match audit_files(cfg, files) {
        Ok(f) => f,
        Err(why) => return output::bad_input(why),
    };
    let report = match verify(&files) {
        Ok(r) => r,
        Err(e) => {
            let shown: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
            return output::failed(format!("reading the audit log ({}): {e}", shown.join(", ")));
        }
    };
    let ok = report.broken.is_none();
    let shown = serde_json::to_value(&report).unwrap_or_default();
    let status = print(&shown, json, |_| match &report.broken {
        Some(b) => format!(
            "BROKEN at {}:{}: {} ({} records verified before it)",
            b.file.display(),
            b.line,
            b.reason,
            report.records
        ),
        None => {
            let start = if report.starts_at_genesis() {
                "from the first record".to_string()
            } else {
                format!(
                    "from a record whose predecessor is not here ({})",
                    report.chain_start.as_deref().unwrap_or("-")
                )
            };
            let dropped = if report.dropped > 0 {
                format!(
                    "; {} allowed-request records were dropped (queue full)",
                    report.dropped
                )
            } else {
                String::new()
            };
            format!(
                "ok: {} records in {} file(s), seq {}..{}, chain intact {start}; head {}{dropped}",
                report.records,
                report.files.len(),
                report.first_seq.unwrap_or(0),
                report.last_seq.unwrap_or(0),
                report.head.as_deref().unwrap_or("-")
            )
        }
    });
    if ok {
        status
    } else {
        FAILED
    }
}

fn lint(cfg: &Config, files: &[PathBuf], json: bool) -> u8 {
    let result = if files.is_empty() {
        Policy::load_dir(&cfg.policies).map(|p| (cfg.policies.display().to_string(), p))
    } else if let [dir] = files {
        load_policy(dir).map(|p| (dir.display().to_string(), p))
    } else {
        agenshield_proxy::policy::load_files(files).map(|p| (format!("{} file(s)", files.len()), p))
    };
    // Secret references are checked against the vault when it can be read from here.
    let result = result.and_then(|(what, p)| {
        // The configured directory is what `run` loads: a `scope = "fleet"` rate needs
        // `[ratelimit] store` there (files given by name may be meant for another host).
        if files.is_empty() {
            p.check_fleet(cfg.ratelimit.store.is_some())?;
        }
        let note = match secret_names(cfg) {
            Ok(names) => {
                p.check_secrets(&|n| names.binary_search_by(|x| x.as_str().cmp(n)).is_ok())?;
                None
            }
            Err(why) if !p.secret_refs().is_empty() => {
                Some(format!("secret references not checked: {why}"))
            }
            Err(_) => None,
        };
        Ok((what, p, note))
    });
    match result {
        Ok((what, p, note)) => print(
            &serde_json::json!({"ok": true, "hash": p.hash(), "rules": p.rule_count(),
                "skipped": p.ignored_rule_count(), "note": note}),
            json,
            |_| {
                let mut line = format!("{what}: ok, {} rules, {}", p.rule_count(), p.hash());
                if let Some(n) = &note {
                    line.push_str(&format!(" ({n})"));
                }
                let skipped = p.ignored_rule_count();
                if skipped > 0 {
                    line.push_str(&format!(
                        "\n{skipped} AgenShield rule(s) skipped: disabled, or not for network \
                         requests (their operations do not include http_request)"
                    ));
                }
                line
            },
        ),
        Err(e) => policy_error(&e),
    }
}

/// A policy that does not load: its message as the linter prints it, and under `--json` the
/// file, line and column it points at.
fn policy_error(e: &agenshield_proxy::policy::PolicyError) -> u8 {
    let at = e.location().map(|l| output::Place {
        file: Some(l.file.clone()),
        line: l.position.map(|p| p.0),
        column: l.position.map(|p| p.1),
    });
    output::error_at(
        output::ErrorCode::BadInput,
        &e.to_string(),
        &at.unwrap_or_default(),
    )
}

/// The secrets the configured store holds, if this process can see them.
pub(crate) fn secret_names(cfg: &Config) -> Result<Vec<String>, String> {
    match cfg.secrets.store {
        agenshield_proxy::config::SecretStoreKind::File => {
            agenshield_proxy::secrets::FileStore::names_in(&cfg.vault)
                .map_err(|e| format!("cannot read the vault {}: {e}", cfg.vault.display()))
        }
        agenshield_proxy::config::SecretStoreKind::Keychain => {
            Err("the keychain is only read by the daemon (see `ctl secrets list`)".into())
        }
    }
}
