//! Who and where: the accounts, directories and files an installation consists of, from the
//! daemon config plus the fixed defaults of DESIGN.md. Pure; the platform is a parameter so
//! the macOS layout can be rendered (and golden-tested) on Linux.

use std::path::{Path, PathBuf};

use agenshield_proxy::config::{AgentUser, Config, DEFAULT_CONFIG_PATH};

/// The operating system an installation is planned for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Platform {
    Linux,
    MacOs,
}

impl Platform {
    /// The platform this binary runs on (anything not macOS is treated as Linux).
    pub fn current() -> Platform {
        if cfg!(target_os = "macos") {
            Platform::MacOs
        } else {
            Platform::Linux
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Platform::Linux => "linux",
            Platform::MacOs => "macos",
        }
    }
}

/// Everything install owns lives under here (binary, config, policies, CA, vault, manifest).
pub const INSTALL_ROOT: &str = "/opt/agenshield";
/// The daemon binary the service runs: a copy, so the service does not depend on where the
/// operator happened to run `install` from.
pub const BIN_DIR: &str = "/opt/agenshield/bin";
pub const BIN_PATH: &str = "/opt/agenshield/bin/agenshield";
/// The link that puts `agenshield` on everyone's PATH (and on sudo's `secure_path`), to
/// [`BIN_PATH`]. A file of another's there is never replaced.
pub const PATH_LINK: &str = "/usr/local/bin/agenshield";
/// What install created, so uninstall removes exactly that (JSON, 0600 root).
pub const MANIFEST_PATH: &str = "/opt/agenshield/.install-manifest.json";
/// The bundle (system roots + our CA) the agent's tools are pointed at.
pub const BUNDLE_FILE: &str = "agent-ca-bundle.pem";
/// The JVM trust store made from the bundle (PKCS12).
pub const TRUSTSTORE_FILE: &str = "agent-truststore.p12";
/// The agent's CA variables as `KEY=value` lines (PAM, systemd units).
pub const AGENT_ENV_FILE: &str = "agent-env";
/// Debian's PAM profile that applies the environment file to the agent's sessions.
pub const PAM_PROFILE_PATH: &str = "/usr/share/pam-configs/agenshield";
pub const PAM_PROFILE_NAME: &str = "agenshield";
/// macOS: the LaunchAgent that sets the variables in the agent's launchd domain.
pub const LAUNCHD_ENV_LABEL: &str = "com.agenshield.agent-env";
/// Where launchd writes the daemon's stdout and stderr (the plist names it).
pub const LOG_DIR: &str = "/var/log/agenshield";
/// macOS: the Seatbelt backstop profile for the agent's sessions (readable by all).
pub const AGENT_PROFILE_PATH: &str = "/opt/agenshield/agent.sb";

/// Default accounts (DESIGN.md). There are no config keys for them yet; see the README.
pub const AGENT_UID: u32 = 5200;
pub const BROKER_USER: &str = "ash_default_broker";
pub const BROKER_UID: u32 = 5201;
pub const ADMIN_GROUP: &str = agenshield_proxy::control::admin::ADMIN_GROUP;
pub const ADMIN_GID: u32 = 5202;

pub const SYSTEMD_UNIT_NAME: &str = "agenshield-proxy.service";
pub const SYSTEMD_UNIT_PATH: &str = "/etc/systemd/system/agenshield-proxy.service";
/// systemd's own marker that it is PID 1 and running (sd_booted(3)).
pub const SYSTEMD_RUNNING_MARKER: &str = "/run/systemd/system";
pub const LAUNCHD_LABEL: &str = "com.agenshield.proxy";
pub const LAUNCHD_PLIST_PATH: &str = "/Library/LaunchDaemons/com.agenshield.proxy.plist";

/// The unit and plist the product ships; install writes them byte for byte.
pub const SYSTEMD_UNIT: &str = include_str!("../../../../systemd/agenshield-proxy.service");
pub const LAUNCHD_PLIST: &str = include_str!("../../../../launchd/com.agenshield.proxy.plist");

/// The lines install owns in the agent's shell start-up files sit between these.
pub const ENV_BEGIN: &str =
    "# >>> agenshield >>> (written by `agenshield proxy install`; uninstall removes it)";
pub const ENV_END: &str = "# <<< agenshield <<<";

/// A user install creates (with a group of the same name and id).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub home: PathBuf,
    pub shell: &'static str,
    pub comment: &'static str,
    /// Supplementary groups.
    pub groups: Vec<String>,
}

/// The installation's accounts and paths.
#[derive(Debug, Clone)]
pub struct Layout {
    pub platform: Platform,
    pub agent: Account,
    pub broker: Account,
    /// root's primary group: `root` on Linux, `wheel` on macOS.
    pub root_group: &'static str,
    pub config_file: PathBuf,
    pub policies: PathBuf,
    pub certs: PathBuf,
    pub vault: PathBuf,
    /// The directory of the pinned MCP tool definitions (`paths.mcp_pins`): the serving
    /// user's, like the vault.
    pub mcp_pins_dir: PathBuf,
    /// The audit log's directory.
    pub audit_dir: Option<PathBuf>,
    /// `[policy.source] cache`, when a policy source is configured: the serving user's.
    pub policy_cache: Option<PathBuf>,
    /// The key that signs the audit log's checkpoints (`None`: the log or its checkpoints
    /// are off).
    pub audit_key: Option<PathBuf>,
    /// The admin socket's directory.
    pub run_dir: PathBuf,
    /// The admin socket.
    pub admin: PathBuf,
    pub bundle: PathBuf,
    pub truststore: PathBuf,
    pub env_file: PathBuf,
    /// Directories in the agent's home that its trust files need, parents first.
    pub agent_dirs: Vec<PathBuf>,
    /// The agent's files that get our block of trust settings.
    pub blocks: Vec<AgentBlock>,
    /// `daemon.worker_user` names the broker: it serves, so it owns the vault and the logs.
    pub worker: bool,
}

/// What a block in one of the agent's files holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// `export` lines for sh, bash and zsh start-up files.
    Shell,
    /// `KEY=value` lines (`~/.config/environment.d`, read by the systemd user manager).
    EnvironmentD,
    /// wget's `ca_certificate`.
    Wgetrc,
}

/// One of the agent's files and the block install keeps in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentBlock {
    pub path: PathBuf,
    pub kind: BlockKind,
}

#[derive(Debug, thiserror::Error)]
pub enum LayoutError {
    #[error(
        "redirect.agent_users has no user name: install creates the agent user, so the config \
         must name it (e.g. agent_users = [\"ash_default_agent\"])"
    )]
    NoAgentName,
    #[error("{0} must be an absolute path for an installed daemon")]
    Relative(String),
    #[error(
        "daemon.worker_user = {0}: an installed daemon's worker is the account install \
         creates for it, {BROKER_USER} (uid {BROKER_UID})"
    )]
    Worker(String),
}

impl Layout {
    /// The layout for `cfg` on `platform`. The agent is the first user *name* in
    /// `redirect.agent_users`; it gets uid 5200 and a home of its own: agent tools keep
    /// caches and settings there, and its login shell reads the CA variables from there.
    pub fn new(platform: Platform, cfg: &Config) -> Result<Layout, LayoutError> {
        let agent_name = cfg
            .redirect
            .agent_users
            .iter()
            .find_map(|u| match u {
                AgentUser::Name(n) => Some(n.clone()),
                AgentUser::Uid(_) => None,
            })
            .ok_or(LayoutError::NoAgentName)?;
        let (home_root, agent_shell, nologin, root_group) = match platform {
            Platform::Linux => ("/home", "/bin/bash", "/usr/sbin/nologin", "root"),
            Platform::MacOs => ("/Users", "/bin/zsh", "/usr/bin/false", "wheel"),
        };
        let home = Path::new(home_root).join(&agent_name);
        // bash reads ~/.profile for login shells and ~/.bashrc for interactive ones; zsh, the
        // macOS default, reads ~/.zshenv for every invocation; the systemd user manager reads
        // ~/.config/environment.d; wget reads ~/.wgetrc whatever its environment.
        let block = |rel: &str, kind| AgentBlock {
            path: home.join(rel),
            kind,
        };
        let (blocks, agent_dirs) = match platform {
            Platform::Linux => (
                vec![
                    block(".profile", BlockKind::Shell),
                    block(".bashrc", BlockKind::Shell),
                    block(
                        ".config/environment.d/60-agenshield.conf",
                        BlockKind::EnvironmentD,
                    ),
                    block(".wgetrc", BlockKind::Wgetrc),
                ],
                vec![home.join(".config"), home.join(".config/environment.d")],
            ),
            Platform::MacOs => (
                vec![
                    block(".zshenv", BlockKind::Shell),
                    block(".wgetrc", BlockKind::Wgetrc),
                ],
                vec![home.join("Library"), home.join("Library/LaunchAgents")],
            ),
        };
        let agent = Account {
            name: agent_name,
            uid: AGENT_UID,
            home,
            shell: agent_shell,
            comment: "AgenShield agent",
            groups: Vec::new(),
        };
        let broker = Account {
            name: BROKER_USER.into(),
            uid: BROKER_UID,
            home: PathBuf::from(match platform {
                Platform::Linux => "/nonexistent",
                Platform::MacOs => "/var/empty",
            }),
            shell: nologin,
            comment: "AgenShield proxy worker",
            groups: vec![ADMIN_GROUP.into()],
        };
        let absolute = |p: &Path, key: &str| {
            if p.is_absolute() {
                Ok(p.to_path_buf())
            } else {
                Err(LayoutError::Relative(key.into()))
            }
        };
        let parent = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
        let worker = match &cfg.worker_user {
            None => false,
            Some(AgentUser::Name(n)) if n == BROKER_USER => true,
            Some(AgentUser::Uid(u)) if *u == BROKER_UID => true,
            Some(other) => return Err(LayoutError::Worker(other.to_string())),
        };
        Ok(Layout {
            platform,
            agent,
            broker,
            root_group,
            config_file: PathBuf::from(DEFAULT_CONFIG_PATH),
            policies: absolute(&cfg.policies, "paths.policies")?,
            certs: absolute(&cfg.certs, "paths.certs")?,
            vault: absolute(&cfg.vault, "paths.vault")?,
            mcp_pins_dir: parent(&absolute(&cfg.mcp_pins, "paths.mcp_pins")?),
            audit_dir: cfg.audit_path.as_deref().map(parent),
            policy_cache: cfg.policy_source.as_ref().map(|s| s.cache.clone()),
            audit_key: match &cfg.audit_path {
                Some(_) if agenshield_proxy::audit::checkpoints_enabled(&cfg.audit) => {
                    Some(absolute(&cfg.audit_key, "paths.audit_key")?)
                }
                _ => None,
            },
            run_dir: parent(&absolute(&cfg.admin, "listen.admin")?),
            admin: cfg.admin.clone(),
            bundle: cfg.certs.join(BUNDLE_FILE),
            truststore: cfg.certs.join(TRUSTSTORE_FILE),
            env_file: cfg.certs.join(AGENT_ENV_FILE),
            agent_dirs,
            blocks,
            worker,
        })
    }

    pub fn config_dir(&self) -> PathBuf {
        self.config_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default()
    }

    /// What uninstall keeps unless `--purge`: the agent's home and the log directories
    /// (the audit log is there).
    pub fn evidence_dirs(&self) -> Vec<PathBuf> {
        let mut v = vec![self.agent.home.clone(), PathBuf::from(LOG_DIR)];
        v.extend(self.audit_dir.iter().cloned());
        v.dedup();
        v
    }

    /// The agent's login keychain (macOS).
    pub fn agent_keychain(&self) -> PathBuf {
        self.agent.home.join("Library/Keychains/login.keychain-db")
    }

    /// The service definition file for this platform.
    pub fn service_file(&self) -> (&'static str, &'static str) {
        match self.platform {
            Platform::Linux => (SYSTEMD_UNIT_PATH, SYSTEMD_UNIT),
            Platform::MacOs => (LAUNCHD_PLIST_PATH, LAUNCHD_PLIST),
        }
    }

    /// Every path install may create or change (what `observe` looks at).
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = [
            INSTALL_ROOT,
            BIN_DIR,
            BIN_PATH,
            MANIFEST_PATH,
            LOG_DIR,
            self.service_file().0,
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        v.extend([
            self.config_dir(),
            self.config_file.clone(),
            self.policies.clone(),
            self.policies.join("default.toml"),
            self.certs.clone(),
            self.certs.join("ca.pem"),
            self.certs.join("ca-key.pem"),
            self.bundle.clone(),
            self.truststore.clone(),
            self.env_file.clone(),
            PathBuf::from(PAM_PROFILE_PATH),
            self.launchd_env_plist(),
            self.vault.clone(),
            self.mcp_pins_dir.clone(),
            self.run_dir.clone(),
            self.agent.home.clone(),
        ]);
        v.extend(self.audit_dir.iter().cloned());
        if let Some(cache) = &self.policy_cache {
            v.extend(cache.parent().map(Path::to_path_buf));
            v.push(cache.clone());
        }
        v.extend(self.audit_key.iter().flat_map(|k| {
            [
                k.clone(),
                agenshield_proxy::audit::checkpoint_key::public_key_path(k),
            ]
        }));
        v.extend(self.agent_dirs.iter().cloned());
        v.extend(self.blocks.iter().map(|b| b.path.clone()));
        v.extend(crate::cmd::trust::system_store::SystemStore::ALL_FILES.map(PathBuf::from));
        // What closes the local resolvers to the agent (Linux), seen so a second install
        // knows they are in place.
        use super::resolvers::{dropin_dir, DBUS_POLICY_PATH, DROPIN_NAME, SOCKETS};
        v.push(PathBuf::from(DBUS_POLICY_PATH));
        for s in &SOCKETS {
            let dir = dropin_dir(s.unit);
            v.push(dir.join(DROPIN_NAME));
            v.push(dir);
        }
        v.sort();
        v.dedup();
        v
    }

    /// What the agent trusts.
    pub fn trust(&self) -> crate::cmd::trust::AgentTrust<'_> {
        crate::cmd::trust::AgentTrust {
            bundle: &self.bundle,
            truststore: Some(&self.truststore),
        }
    }

    /// macOS: the LaunchAgent plist that sets the variables in the agent's launchd domain.
    pub fn launchd_env_plist(&self) -> PathBuf {
        self.agent
            .home
            .join(format!("Library/LaunchAgents/{LAUNCHD_ENV_LABEL}.plist"))
    }

    /// The block install keeps in one of the agent's files, markers included.
    pub fn block(&self, kind: BlockKind) -> String {
        use crate::cmd::trust::files;
        let t = self.trust();
        let body = match kind {
            BlockKind::Shell => files::shell_lines(&t),
            BlockKind::EnvironmentD => files::env_lines(&t),
            BlockKind::Wgetrc => files::wgetrc_lines(&t),
        };
        format!("{ENV_BEGIN}\n{body}{ENV_END}\n")
    }
}
