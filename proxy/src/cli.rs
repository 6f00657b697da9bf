//! The `agenshield` command line.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "agenshield",
    version,
    about = "AgenShield: a TLS-intercepting egress proxy that decides, by policy, what an AI agent may reach",
    long_about = None,
    propagate_version = true,
    after_help = "Examples:\n  agenshield proxy run                      # the daemon, on built-in defaults\n  agenshield proxy ctl status               # running? what does it enforce?\n  agenshield proxy exec -- curl https://example.com/\n  agenshield proxy completions bash > /etc/bash_completion.d/agenshield",
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Top,

    /// How log lines on stderr are written: `text` for people, `json` (one object per line)
    /// for a log collector. What is logged is set by AGENSHIELD_LOG (e.g. `info`,
    /// `debug,rustls=error`); an invalid filter is an error
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
}

pub use agenshield_proxy::logging::LogFormat;

#[derive(Debug, Subcommand)]
pub enum Top {
    /// The egress proxy: run, install and operate it
    #[command(
        subcommand,
        after_help = "Examples:\n  agenshield proxy run\n  agenshield proxy ctl status\n  sudo agenshield proxy install\n  agenshield proxy doctor"
    )]
    Proxy(ProxyCommand),
}

#[derive(Debug, Subcommand)]
pub enum ProxyCommand {
    /// Run the proxy daemon in the foreground
    ///
    /// With --config, reads that file. Without it, reads /opt/agenshield/config/proxy.toml
    /// when it exists; otherwise runs on built-in defaults with its state (CA, policies) in
    /// $AGENSHIELD_STATE_DIR, /var/lib/agenshield (root) or ~/.local/state/agenshield.
    /// Relative paths in a config file are taken relative to the file's directory. Listens,
    /// unless configured otherwise, on 127.0.0.1:15001 and [::1]:15001 (transparent),
    /// 127.0.0.1:15080 (explicit HTTP proxy), 127.0.0.1:15053 and [::1]:15053 (the agent's
    /// DNS stub, UDP and TCP) and 127.0.0.1:15090 (Prometheus metrics, /metrics), plus the
    /// admin socket. Policy edits are picked up by themselves; SIGHUP reloads at once.
    #[command(
        after_help = "Examples:\n  agenshield proxy run\n  agenshield proxy run --config /opt/agenshield/config/proxy.toml\n  agenshield proxy run --check --config proxy.toml   # run's verdict only\n  AGENSHIELD_LOG=debug agenshield --log-format json proxy run"
    )]
    Run(RunArgs),

    /// Install, remove or inspect the firewall rules that redirect the agent users' traffic
    ///
    /// Linux: one nftables table, `inet agenshield`. All TCP of the agent users (IPv4 and
    /// IPv6, any port) goes to the transparent listener; all their DNS (UDP and TCP 53, to any
    /// address) goes to the DNS stub (listen.dns); everything else they send is rejected. Other users
    /// are never touched. The rules stay when the daemon exits, so agent traffic fails closed
    /// while the proxy is down. Needs root. `status` exits 0 when the rules in place match the
    /// config, 1 when they do not (or are missing), 3 when AgenShield is not installed (no
    /// agent user, no rules), 2 on a bad config.
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy firewall status\n  sudo agenshield proxy firewall up\n  sudo agenshield proxy firewall down"
    )]
    Firewall(FirewallArgs),

    /// Talk to the running daemon (status, reload, tail, policy, approvals) or check policy
    /// files offline
    ///
    /// Uses the admin socket (listen.admin in the config; exit 1 with one line if the daemon
    /// is not running). Root and members of agenshield-admin may use it; agent users never.
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl status\n  agenshield proxy ctl tail -f --decision deny\n  agenshield proxy ctl policy check GET https://api.github.com/ --exit-code\n  agenshield proxy ctl policy suggest --since 1d --write /tmp/suggested.toml\n  agenshield proxy ctl secrets set openai < key.txt\n  agenshield proxy ctl ca export > agenshield-ca.pem"
    )]
    Ctl(Box<CtlArgs>),

    /// Install the proxy as a system service: users and groups, directories, CA, vault,
    /// config and default policies, the agent's CA trust, the service unit (launchd on macOS,
    /// systemd on Linux) and the firewall redirect. Idempotent. Needs root.
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy install\n  sudo agenshield proxy install --help   # its users, paths and options"
    )]
    Install(InstallArgs),

    /// Remove exactly what `install` created and leave everything else. Needs root.
    ///
    /// Evidence stays unless --purge: the audit log's directory and the agent's home are kept
    /// (listed with their sizes) and closed to everyone but root; a config left behind is
    /// renamed `proxy.toml.uninstalled-DATE`, so no later start picks it up.
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy uninstall\n  sudo agenshield proxy uninstall --purge   # the audit log and home too"
    )]
    Uninstall(UninstallArgs),

    /// Run a command through the explicit listener, sandboxed so it can connect only to the
    /// proxy (Landlock on Linux, Seatbelt on macOS). No root needed.
    #[command(
        after_help = "Examples:\n  agenshield proxy exec -- curl https://api.github.com/\n  agenshield proxy exec -- python3 agent.py\n  agenshield proxy exec --config proxy.toml -- npm install"
    )]
    Exec(ExecArgs),

    /// Check the installation end to end and print the fix for each problem
    ///
    /// The firewall redirect; the daemon; the CA files; the agent's CA variables in a login
    /// shell and outside one (root; or run it as the agent to check your own environment);
    /// for each runtime on the machine (curl, wget, git, python, requests, httpx, pip, node,
    /// npm, java, go, grpc) whether it will trust the AgenShield CA, by what it reads; and the
    /// hosts where clients refused the CA recently (from the audit log). Exit 0 when nothing
    /// failed, 1 when something did, 3 when AgenShield is not installed here (no install
    /// manifest and no agent user: nothing to check).
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy doctor\n  agenshield proxy doctor   # as the agent: your own environment"
    )]
    Doctor(DoctorArgs),

    /// Policy bundles for a fleet: `bundle` packs a policy directory for `[policy.source]`
    #[command(
        subcommand,
        after_help = "Examples:\n  agenshield proxy policy bundle ./policies --out bundle.tar.gz --revision 42\n  minisign -S -s policy.key -m bundle.tar.gz"
    )]
    Policy(PolicyTool),

    /// Shell completions for agenshield, on stdout
    #[command(
        after_help = "Examples:\n  agenshield proxy completions bash > /etc/bash_completion.d/agenshield\n  agenshield proxy completions zsh > \"${fpath[1]}/_agenshield\"\n  agenshield proxy completions fish \\\n      > ~/.config/fish/completions/agenshield.fish"
    )]
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },

    /// The manual page (roff), on stdout, or one page per command into DIR
    #[command(
        after_help = "Examples:\n  agenshield proxy man | man -l -\n  agenshield proxy man --dir /usr/local/share/man/man1"
    )]
    Man {
        /// Write agenshield.1 and a page for every subcommand (agenshield-proxy-ctl.1, …) here
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct DoctorArgs {
    /// Daemon configuration file (TOML); default as for `run`
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Machine-readable output: one JSON object (`ok`, counts, `findings` with area,
    /// subject, status, detail and fix)
    #[arg(long)]
    pub json: bool,

    /// How far back to look for clients that refused the CA
    #[arg(long, value_name = "DURATION", default_value = "24h")]
    pub since: humantime::Duration,
}

#[derive(Debug, clap::Args)]
pub struct InstallArgs {
    /// Print every step and change nothing
    #[arg(long)]
    pub dry_run: bool,

    /// The config to install as /opt/agenshield/config/proxy.toml (TOML; its paths must be
    /// absolute). Without it: the config already installed there (a re-run keeps it), else
    /// the shipped example with the redirect on and daemon.worker_user = "ash_default_broker"
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Also add the CA to the machine's own trust store (update-ca-certificates,
    /// update-ca-trust, or the macOS System keychain), for agent processes no environment
    /// reaches. Every user of the machine then trusts certificates the CA signs.
    #[arg(long)]
    pub trust_system_store: bool,

    /// Uninstall's --purge (never set for install).
    #[arg(skip)]
    pub purge: bool,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// Print every step and change nothing
    #[arg(long)]
    pub dry_run: bool,

    /// Also delete the audit log's directory and the agent's home (counted in the plan)
    #[arg(long)]
    pub purge: bool,

    /// Daemon configuration file (TOML); default as for `run`
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ExecArgs {
    /// Daemon configuration file (TOML), for the explicit listener and the CA; default as
    /// for `run`
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The command and its arguments (after `--`)
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(Debug, clap::Args)]
pub struct CtlArgs {
    #[command(subcommand)]
    pub command: CtlCommand,

    /// Daemon configuration file (TOML), for the socket and policy paths; default as for `run`
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Admin socket to use instead of the configured one
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,

    /// The daemon's HTTPS admin listener (listen.admin_https) instead of the socket, e.g.
    /// https://host:15443; needs --cert and --key (these go before the subcommand)
    #[arg(long, value_name = "URL", conflicts_with = "socket")]
    pub remote: Option<String>,

    /// With --remote: the client certificate (PEM chain) listen.client_ca issued
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub cert: Option<PathBuf>,

    /// With --remote: the client certificate's private key (PEM)
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub key: Option<PathBuf>,

    /// With --remote: the CA (PEM) the listener's certificate chains to (default: the
    /// system's roots)
    #[arg(long, value_name = "FILE", requires = "remote")]
    pub ca: Option<PathBuf>,

    /// Machine-readable output
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Uptime, listeners, firewall state, CA, policy hash and load time, last reload error, counts
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl status\n  agenshield proxy ctl status --json | jq .policy.hash"
    )]
    Status,
    /// Reload the policy now (a bad policy keeps the current one; exit 1 with the reason)
    #[command(after_help = "Example:\n  agenshield proxy ctl reload")]
    Reload,
    /// Request counters and certificate cache figures
    #[command(after_help = "Example:\n  agenshield proxy ctl stats")]
    Stats,
    /// Recent decisions; with -f, follow new ones as they happen. With --json, one JSON
    /// object per line (JSON Lines), as the audit log writes them
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl tail -n 20\n  agenshield proxy ctl tail -f --decision deny --host api.github.com\n  agenshield proxy ctl tail --json | jq -c 'select(.secrets != [])'"
    )]
    Tail {
        /// Keep printing decisions as they happen (after the last 10, unless -n says)
        #[arg(short, long)]
        follow: bool,
        /// Only the last N decisions of those kept (default: all of them; with -f, 10)
        #[arg(short = 'n', long = "lines", value_name = "N")]
        lines: Option<usize>,
        /// Only this decision, as the audit log and metrics spell it
        #[arg(long, value_parser = ["allow", "deny", "limited", "ask_approved", "ask_denied", "ask_timeout", "error"])]
        decision: Option<String>,
        /// Only this host
        #[arg(long)]
        host: Option<String>,
    },
    /// Check, lint, show, or learn (suggest) policy
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl policy check GET https://api.github.com/user\n  agenshield proxy ctl policy lint ./policies"
    )]
    Policy(PolicyCommand),
    /// Requests held by `ask` rules
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl pending list\n  agenshield proxy ctl pending approve p1"
    )]
    Pending(PendingCommand),
    /// MCP tool definitions pinned per server (rules with `mcp = { pin = true }`)
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl mcp list\n  agenshield proxy ctl mcp accept mcp.example.com:443 read_file"
    )]
    Mcp(McpCommand),
    /// The CA whose leaves the agent sees (read from the certificate directory)
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl ca show\n  agenshield proxy ctl ca export > agenshield-ca.pem"
    )]
    Ca(CaCommand),
    /// Secrets the proxy injects for the agent (values are never shown)
    #[command(subcommand)]
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl secrets list\n  agenshield proxy ctl secrets set openai < key.txt"
    )]
    Secrets(SecretsCommand),
    /// The audit log (read directly; the daemon need not run)
    #[command(subcommand)]
    #[command(after_help = "Example:\n  agenshield proxy ctl audit verify")]
    Audit(AuditCommand),
}

/// How an OAuth2 client authenticates to its token endpoint.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ClientAuthArg {
    /// HTTP Basic (client_secret_basic)
    Basic,
    /// In the form body (client_secret_post)
    Post,
}

#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// Check the hash chain; exit 1 naming the first broken line. Default: the configured
    /// log and its rotated files, oldest first; or FILEs, in the order given
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl audit verify\n  agenshield proxy ctl audit verify \\\n      /var/log/agenshield/proxy-audit.jsonl.1 \\\n      /var/log/agenshield/proxy-audit.jsonl\n  agenshield proxy ctl audit verify --checkpoints --key host1-audit.pub \\\n      /srv/syslog/host1/agenshield.jsonl"
    )]
    Verify {
        /// Audit log files in order, oldest first (default: the configured log and its
        /// rotations)
        files: Vec<PathBuf>,
        /// Also check the signed checkpoints, going on past damage: exit 1 naming each
        /// damaged range by the checkpoints around it. Works on a shipped copy (the lines
        /// as the syslog receiver wrote them), also one whose beginning is missing
        #[arg(long)]
        checkpoints: bool,
        /// Public key(s) the checkpoints must be signed with (PEM, as `ctl audit key`
        /// exports it); repeat for several. Default: this host's key (for evidence, use one
        /// exported earlier and kept elsewhere)
        #[arg(long = "key", value_name = "FILE", requires = "checkpoints")]
        keys: Vec<PathBuf>,
    },
    /// Print the public key that verifies the audit log's checkpoints (PEM), or write it
    /// to a file; its key id is what checkpoint records name
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl audit key > audit-key.pub\n  agenshield proxy ctl audit key --out /srv/keys/host1-audit.pub\n  agenshield proxy ctl audit verify --checkpoints \\\n      --key host1-audit.pub shipped.jsonl"
    )]
    Key {
        /// Write the key here instead of printing it
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SecretsCommand {
    /// Store a secret: the value is read from stdin (or prompted for, without echo, on a
    /// terminal), never from the command line; one trailing newline is dropped. Or have the
    /// daemon fetch it: from a command's output (--from-command) or as an OAuth2 access token
    /// (--oauth2-token-url; the client secret is what stdin or the prompt gives). A fetched
    /// secret is fetched once at once (and refused, with why, if that fails), then again on
    /// the first use after its time to live.
    #[command(after_help = "Examples:\n  \
        agenshield proxy ctl secrets set openai              # prompts, no echo\n  \
        agenshield proxy ctl secrets set openai < key.txt\n  \
        printf %s \"$TOKEN\" | agenshield proxy ctl secrets set github\n  \
        agenshield proxy ctl secrets set gh \\\n      \
        --from-command 'gh auth token' --ttl 55m\n  \
        agenshield proxy ctl secrets set api --client-id agent \\\n      \
        --oauth2-token-url https://auth.example.com/token < client-secret.txt")]
    Set {
        /// 1-64 of A-Z a-z 0-9 _ -; the agent's placeholder is agenshield:secret:NAME
        name: String,
        /// Take the value from this command's standard output, run by the daemon as its own
        /// (worker) user with `sh`, no stdin, within --timeout. `-` reads the command from
        /// stdin, so it is in no process's arguments (`ps` shows any user ours)
        #[arg(long, value_name = "COMMAND", conflicts_with = "oauth2_token_url")]
        from_command: Option<String>,
        /// Fetch an OAuth2 access token (client credentials grant) from this https:// URL
        #[arg(long, value_name = "URL", requires = "client_id")]
        oauth2_token_url: Option<String>,
        /// The OAuth2 client id
        #[arg(long, value_name = "ID", requires = "oauth2_token_url")]
        client_id: Option<String>,
        /// The OAuth2 scope to ask for
        #[arg(long, value_name = "SCOPE", requires = "oauth2_token_url")]
        scope: Option<String>,
        /// How the OAuth2 client authenticates: HTTP Basic, or in the form body
        #[arg(long, value_enum, value_name = "HOW", requires = "oauth2_token_url")]
        client_auth: Option<ClientAuthArg>,
        /// How long a fetched value is used: a command's output, or a token whose endpoint
        /// gives no expiry [default: 15m]
        #[arg(long, value_name = "DURATION")]
        ttl: Option<humantime::Duration>,
        /// How long a fetch may take [default: 10s]
        #[arg(long, value_name = "DURATION")]
        timeout: Option<humantime::Duration>,
    },
    /// Names, kinds, the rules that bind them, when each was set and last used, and for
    /// fetched secrets their source and expiry; never values
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl secrets list\n  agenshield proxy ctl secrets list --json"
    )]
    List,
    /// Remove a secret (refused while a rule binds it)
    #[command(after_help = "Example:\n  agenshield proxy ctl secrets rm openai")]
    Rm {
        /// The secret's name
        name: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// What the policy decides for METHOD URL: decision, rule, explanation, obligations, and
    /// for a refusal by the default a hint (the nearest rule, or how to add one). `check DNS
    /// NAME`: whether the agent's DNS stub answers NAME from its resolver (allow) or refuses
    /// it without asking any resolver (deny: a synthetic address whose connections are
    /// refused naming the rule, or NXDOMAIN with dns.denied = "nxdomain")
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl policy check GET https://api.github.com/user\n  agenshield proxy ctl policy check POST \\\n      https://api.openai.com/v1/chat/completions --agent coder\n  agenshield proxy ctl policy check GET https://x.test/ \\\n      --policy ./policies --exit-code\n  agenshield proxy ctl policy check DNS github.com"
    )]
    Check {
        /// The request's method (GET, POST, …), or DNS to ask about a name
        method: String,
        /// The full URL (https://host/path), or the name for DNS
        url: String,
        /// Decide offline against these policy files (a directory, or one file) instead of
        /// asking the daemon. Without it, and with the daemon down, the configured policy
        /// directory is used offline
        #[arg(long, value_name = "DIR|FILE")]
        policy: Option<PathBuf>,
        /// Decide as this agent would be decided: its name (the user ash_NAME_agent) or uid.
        /// Without it, rules that name `agents` do not apply
        #[arg(long, value_name = "NAME|UID")]
        agent: Option<String>,
        /// Exit 1 unless the request would be allowed outright (denied, held for approval,
        /// or denied under report mode): for CI checks of a policy change
        #[arg(long)]
        exit_code: bool,
        /// Also check this MCP tool call (`tools/call` NAME) against the rule's `mcp`
        #[arg(long, value_name = "NAME")]
        mcp_tool: Option<String>,
        /// Also check this MCP (JSON-RPC) method against the rule's `mcp.methods`
        #[arg(long, value_name = "METHOD")]
        mcp_method: Option<String>,
    },
    /// Validate policy files (a directory, or files; default: the configured policy
    /// directory); exit 2 on errors
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl policy lint\n  agenshield proxy ctl policy lint ./policies\n  agenshield proxy ctl policy lint new-rules.toml --json"
    )]
    Lint {
        /// A policy directory, or policy files (TOML or AgenShield JSON)
        #[arg(value_name = "DIR|FILE")]
        files: Vec<PathBuf>,
    },
    /// The policy in force: directory, hash, rules, mode, load time, last reload error
    #[command(after_help = "Example:\n  agenshield proxy ctl policy show")]
    Show,
    /// Learn mode: draft allow rules from the audit log's refusals and report-mode
    /// would-be refusals, grouped by host, with counts. Run with `mode = "report"` for a
    /// while, suggest, review, move the file into the policy directory, enforce
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl policy suggest\n  agenshield proxy ctl policy suggest --since 1d --agent coder \\\n      --write /tmp/suggested.toml"
    )]
    Suggest {
        /// Only decisions this recent: how far back from now, as a number and a unit (s, m,
        /// h, d, w), e.g. 30m, 6h, 1d, 1w, 1d12h
        #[arg(long, value_name = "DURATION", value_parser = back_from_now)]
        since: Option<humantime::Duration>,
        /// Only this agent's decisions (its name or uid); the rules then name it in `agents`
        #[arg(long, value_name = "NAME|UID")]
        agent: Option<String>,
        /// Write the draft to FILE (a new file, outside the policy directory) instead of stdout
        #[arg(long, value_name = "FILE")]
        write: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyTool {
    /// Pack the policy directory DIR (`*.toml`, `*.json`, `custom/*.json`) and a
    /// `manifest.toml` into a gzip tar for `[policy.source]`, after loading it with the
    /// daemon's own loader (an invalid policy is refused, exit 2). Sign the result with
    /// `minisign -S`; serve both files side by side (`FILE` and `FILE.minisig`)
    #[command(
        after_help = "Examples:\n  agenshield proxy policy bundle ./policies --out bundle.tar.gz\n  agenshield proxy policy bundle ./policies --out bundle.tar.gz \\\n      --revision 43 --local deny-only\n  minisign -S -s policy.key -m bundle.tar.gz"
    )]
    Bundle {
        /// The policy directory
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// Where to write the bundle (replaced if it exists)
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// The bundle's revision: daemons refuse one lower than (or equal to, with other
        /// content) the one they run. Default: now, in seconds since 1970
        #[arg(long, value_name = "N")]
        revision: Option<u64>,
        /// What each daemon's local policy directory may do under the bundle: `merge` (add
        /// any rule), `deny-only` (add deny rules only) or `ignore`
        #[arg(long, value_name = "MODE", default_value = "deny-only", value_parser = ["merge", "deny-only", "ignore"])]
        local: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CaCommand {
    /// Path, subject, SHA-256 fingerprint and expiry of the CA certificate
    #[command(after_help = "Example:\n  agenshield proxy ctl ca show")]
    Show,
    /// The CA certificate (PEM) on stdout, to trust it elsewhere
    #[command(after_help = "Example:\n  agenshield proxy ctl ca export > agenshield-ca.pem")]
    Export,
}

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Every pinned tool: server, name, hash, and a changed definition waiting, if any
    #[command(after_help = "Example:\n  agenshield proxy ctl mcp list")]
    List,
    /// Accept a pinned tool's changed definition: it is listed and callable again
    #[command(
        after_help = "Example:\n  agenshield proxy ctl mcp accept mcp.example.com:443 read_file"
    )]
    Accept {
        /// The server, `host:port` as `ctl mcp list` shows it
        server: String,
        /// The tool's name
        tool: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum PendingCommand {
    /// Requests waiting for an answer
    #[command(after_help = "Example:\n  agenshield proxy ctl pending list")]
    List,
    /// Let a held request through
    #[command(
        after_help = "Examples:\n  agenshield proxy ctl pending list   # the ids: p1, p2, …\n  agenshield proxy ctl pending approve p1\n  agenshield proxy ctl pending approve p1 --remember"
    )]
    Approve {
        /// The held request's id (`ctl pending list`)
        id: String,
        /// Also let this agent's later requests with the same method, host, port and path
        /// (the query may differ) through, until the daemon restarts
        #[arg(long)]
        remember: bool,
    },
    /// Refuse a held request (the agent gets a 403)
    #[command(after_help = "Example:\n  agenshield proxy ctl pending deny p1")]
    Deny {
        /// The held request's id (`ctl pending list`)
        id: String,
    },
}

#[derive(Debug, clap::Args)]
pub struct FirewallArgs {
    #[command(subcommand)]
    pub action: FirewallAction,

    /// Daemon configuration file (TOML); default as for `run`
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,

    /// Machine-readable output
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Clone, Subcommand)]
pub enum FirewallAction {
    /// Install (or atomically replace) the rules for the configured agent users
    #[command(after_help = "Example:\n  sudo agenshield proxy firewall up")]
    Up,
    /// Remove the rules: the agent users' traffic goes direct again
    #[command(after_help = "Example:\n  sudo agenshield proxy firewall down")]
    Down,
    /// Whether the rules are in place, match the configuration, and which uids they cover
    /// (exit 0 only when in place and matching)
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy firewall status\n  sudo agenshield proxy firewall status --json"
    )]
    Status,
    /// Close the local resolvers' sockets (systemd-resolved's varlink socket, nscd's) to the
    /// agent users, so their lookups go to the DNS stub (Linux; a POSIX ACL entry on each
    /// socket; install's systemd drop-ins run this whenever those services start)
    #[command(
        after_help = "Examples:\n  sudo agenshield proxy firewall resolvers\n  sudo agenshield proxy firewall resolvers --open"
    )]
    Resolvers {
        /// Reopen them to the agent users instead
        #[arg(long)]
        open: bool,
        /// These sockets instead of the known ones (repeatable)
        #[arg(long = "socket", value_name = "PATH")]
        sockets: Vec<PathBuf>,
    },
}

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// Daemon configuration file (TOML)
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// For tests only (hidden): treat every transparent connection as headed to ADDR instead of
    /// asking the firewall for its original destination
    #[arg(long, value_name = "ADDR", hide = true)]
    pub orig_dst_override: Option<SocketAddr>,

    /// Give `run`'s verdict on the configuration, part by part (config file read, worker
    /// user, listeners, admin socket, redirect, audit log, policy, secrets, CA, upstream
    /// trust, users), without starting: each listener is bound and released at once, the
    /// firewall is asked and not changed, nothing is created; exit 0 (would start) or 2
    #[arg(long)]
    pub check: bool,

    /// With --check: one JSON object (`ok`, `config`, `parts` with part, verdict, detail)
    #[arg(long, requires = "check")]
    pub json: bool,

    /// Internal: the unprivileged half of a split daemon, started by its supervisor with the
    /// bound sockets on stdin
    #[arg(long, hide = true)]
    pub worker: bool,
}

#[cfg(test)]
#[path = "cli_tests.rs"]
mod tests;

/// `--since` given something that is not a duration.
#[derive(Debug, thiserror::Error)]
#[error(
    "{0:?} is not a duration back from now; give a number and a unit (s, m, h, d, w), e.g. \
     --since 30m, --since 6h, --since 1d (yesterday and since), --since 1w, --since 1d12h"
)]
pub struct NotASince(String);

/// `--since`: a duration back from now; anything else is refused with the forms it takes.
fn back_from_now(text: &str) -> Result<humantime::Duration, NotASince> {
    text.parse::<humantime::Duration>()
        .map_err(|_| NotASince(text.to_string()))
}
