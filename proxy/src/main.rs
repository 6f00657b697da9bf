use std::process::ExitCode;

/// mimalloc: the daemon allocates and frees small buffers on every request from several
/// threads; glibc's malloc spent ~8% of its CPU there (bench/profiles), mimalloc about half.
/// What it holds free after a burst of connections goes back to the OS when the runtimes'
/// threads next park (`daemon::memory_release`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc commits its arenas eagerly where the kernel overcommits: +25 MiB of resident
/// memory for the daemon, for no speed we could measure. Its options are read from the
/// environment before `main`, so the daemon sets this one and starts itself again.
const MIMALLOC_EAGER: &str = "MIMALLOC_ARENA_EAGER_COMMIT";

/// For `proxy run`: the same command again with the allocator's settings (once; on failure
/// the daemon goes on as it is, with more memory resident).
fn reexec_with_allocator_settings() {
    use std::os::unix::process::CommandExt;
    if std::env::var_os(MIMALLOC_EAGER).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut args = std::env::args_os();
    let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
    let err = std::process::Command::new(&exe)
        .arg0(arg0)
        .args(args)
        .env(MIMALLOC_EAGER, "0")
        .exec();
    eprintln!("agenshield: restarting with the allocator's settings failed ({err}); going on");
}

use agenshield_cli::cli::{Cli, ProxyCommand, Top};
use agenshield_proxy::config::{
    default_state_dir, installed_config_unreadable, Config, DEFAULT_CONFIG_PATH,
};
use agenshield_proxy::daemon::privsep;
use agenshield_proxy::daemon::{self, BadInput};
use clap::Parser;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = agenshield_proxy::logging::init(cli.log_format) {
        eprintln!("agenshield: {e}");
        return ExitCode::from(2);
    }
    match cli.command {
        Top::Proxy(ProxyCommand::Firewall(args)) => match load_config(args.config.as_deref()) {
            Ok(cfg) => ExitCode::from(agenshield_cli::cmd::firewall::command(
                &cfg,
                args.action,
                args.json,
            )),
            Err(e) => ExitCode::from(agenshield_cli::cmd::firewall::config_error(
                &e.to_string(),
                args.json,
            )),
        },
        Top::Proxy(ProxyCommand::Ctl(args)) => match load_config(args.config.as_deref()) {
            Ok(cfg) => ExitCode::from(agenshield_cli::cmd::ctl::run(*args, &cfg)),
            // `--remote` needs no local config (an operator's machine may have none, or
            // one it may not read).
            Err(_) if args.remote.is_some() && args.config.is_none() => ExitCode::from(
                agenshield_cli::cmd::ctl::run(*args, &Config::installed_defaults()),
            ),
            Err(e) => {
                eprintln!("agenshield: {e}");
                ExitCode::from(2)
            }
        },
        Top::Proxy(ProxyCommand::Install(args)) => {
            ExitCode::from(agenshield_cli::cmd::install::command(&args, false))
        }
        Top::Proxy(ProxyCommand::Uninstall(args)) => {
            ExitCode::from(agenshield_cli::cmd::install::command(&args.into(), true))
        }
        Top::Proxy(ProxyCommand::Exec(args)) => match agent_config(args.config.as_deref()) {
            Some(cfg) => ExitCode::from(agenshield_cli::cmd::exec::command(&cfg, args.command)),
            None => ExitCode::from(2),
        },
        Top::Proxy(ProxyCommand::Policy(tool)) => {
            ExitCode::from(agenshield_cli::cmd::policy_bundle::command(tool))
        }
        Top::Proxy(ProxyCommand::Completions { shell }) => {
            ExitCode::from(agenshield_cli::cmd::docs::completions(shell))
        }
        Top::Proxy(ProxyCommand::Man { dir }) => {
            ExitCode::from(agenshield_cli::cmd::docs::man(dir.as_deref()))
        }
        Top::Proxy(ProxyCommand::Doctor(args)) => match agent_config(args.config.as_deref()) {
            Some(cfg) => ExitCode::from(agenshield_cli::cmd::doctor::command(&cfg, &args)),
            None => ExitCode::from(2),
        },
        Top::Proxy(ProxyCommand::Run(args)) => {
            reexec_with_allocator_settings();
            let cfg = match load_config(args.config.as_deref()) {
                Ok(mut cfg) => {
                    if args.orig_dst_override.is_some() {
                        cfg.testing.orig_dst_override = args.orig_dst_override;
                    }
                    cfg
                }
                Err(e) if args.check => {
                    return ExitCode::from(agenshield_cli::cmd::check::config_failed(
                        args.config.as_deref(),
                        &e.to_string(),
                        args.json,
                    ))
                }
                Err(e) => {
                    eprintln!("agenshield: {e}");
                    return ExitCode::from(2);
                }
            };
            if args.check {
                return ExitCode::from(agenshield_cli::cmd::check::command(&cfg, args.json));
            }
            let who = match privsep::worker_user(&cfg) {
                Ok(who) => who,
                Err(e) => return fail(&e),
            };
            // The worker of a split daemon takes its sockets and drops privileges while it
            // is still one thread, before any runtime exists.
            let handoff = match (&who, args.worker) {
                (Some(who), true) => match privsep::worker_handoff(who) {
                    Ok(h) => Some(h),
                    Err(e) => return fail(&e),
                },
                (None, true) => {
                    eprintln!("agenshield: --worker needs daemon.worker_user in the config");
                    return ExitCode::from(2);
                }
                _ => None,
            };
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .on_thread_park(agenshield_proxy::runtime::memory_release::on_park)
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("agenshield: starting the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            let done = match (who, handoff) {
                (_, Some((header, fds, control))) => {
                    runtime.block_on(privsep::worker(cfg, header, fds, control))
                }
                (Some(who), None) => match runtime.block_on(privsep::supervise(cfg, who)) {
                    Ok(code) => return ExitCode::from(code),
                    Err(e) => Err(e),
                },
                (None, None) => runtime.block_on(daemon::run(cfg)),
            };
            match done {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => fail(&e),
            }
        }
    }
}

/// Bad input exits 2 (its message is enough), anything else 1 with its causes.
fn fail(e: &anyhow::Error) -> ExitCode {
    if e.is::<BadInput>() {
        eprintln!("agenshield: {e}");
        ExitCode::from(2)
    } else {
        eprintln!("agenshield: {e:#}");
        ExitCode::FAILURE
    }
}

fn load_config(path: Option<&std::path::Path>) -> Result<Config, Box<dyn std::error::Error>> {
    if let Some(p) = path {
        return Ok(Config::load(p)?);
    }
    // A config this user may not even look at (the agent, under /opt/agenshield/config,
    // 0750) is there all the same: loading it says so, rather than falling back unnoticed.
    let installed = std::path::Path::new(DEFAULT_CONFIG_PATH);
    if installed.try_exists().unwrap_or(true) {
        return Config::load(installed).map_err(|e| {
            if installed_config_unreadable() {
                format!(
                    "{e}: the installed config is for root and {} (pass --config FILE to use \
                     another)",
                    agenshield_cli::cmd::install::layout::ADMIN_GROUP
                )
                .into()
            } else {
                e.into()
            }
        });
    }
    Ok(Config::defaults_in(&default_state_dir()?))
}

/// The config for a command the agent user runs too (`exec`, `doctor`). The agent may not
/// read the installed config (by design); what these need of it (the listener, the CA
/// directory) the installed defaults give. `None` after printing why there is none.
fn agent_config(path: Option<&std::path::Path>) -> Option<Config> {
    match load_config(path) {
        Ok(cfg) => Some(cfg),
        Err(_) if path.is_none() && installed_config_unreadable() => {
            eprintln!(
                "agenshield: {DEFAULT_CONFIG_PATH} is not readable by this user; using the \
                 installed defaults (explicit listener 127.0.0.1:15080, CA in \
                 /opt/agenshield/certs)"
            );
            Some(Config::installed_defaults())
        }
        Err(e) => {
            eprintln!("agenshield: {e}");
            None
        }
    }
}
