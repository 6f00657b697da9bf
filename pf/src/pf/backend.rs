//! [`PfRedirector`]: the pf anchor put in place, verified and taken out on macOS.
//!
//! Sequence of `apply` (idempotent; the reconcile loop calls it whenever `status` is not
//! `Matches`):
//! 1. load the rendered anchor with `pfctl -a com.apple/agenshield -f -`: pfctl replaces the
//!    anchor's tables, translation and filter rules in one transaction;
//! 2. if the main ruleset lost the stock `rdr-anchor`/`anchor "com.apple/*"` hooks (another
//!    tool loaded its own pf.conf), add hooks for our anchor by name (`pfctl` crate,
//!    `DIOCINSERTRULE`), as sshuttle does for its own anchor;
//! 3. hold an enable reference (`pfctl -E`), replacing a stale token left on disk by an
//!    earlier process only after the new one is taken (see [`super::token`]);
//! 4. read everything back and compare ([`anchor::compare`]): not in effect is an error.
//!
//! `remove` flushes the anchor (rules through the `pfctl` crate's transaction, tables with
//! `pfctl -F Tables`), removes the hooks it added by name (never the stock wildcard ones),
//! and releases the token. It never flushes states: `pfctl -F all` would kill every
//! connection on the host, not only ours.

use std::net::IpAddr;

use pfctl::{AnchorKind, PfCtl, RulesetKind};

use super::anchor::{self, Live, Verdict, ANCHOR};
use super::token::{parse_enable_output, EnableRef, TokenFile, TokenKeeper, DEFAULT_TOKEN_PATH};
use super::{run, Output};
use crate::redirect::{FirewallState, FirewallStatus, RedirectError, RedirectSpec, Redirector};

/// Drives pf through `pfctl` and `/dev/pf`. Needs root.
#[derive(Debug)]
pub struct PfRedirector {
    pfctl: String,
    tokens: TokenKeeper,
}

impl Default for PfRedirector {
    fn default() -> Self {
        PfRedirector::new()
    }
}

impl PfRedirector {
    /// The daemon's backend: token in [`DEFAULT_TOKEN_PATH`]; `AGENSHIELD_PFCTL` overrides
    /// the pfctl binary (default `/sbin/pfctl`, not a PATH lookup: this runs as root).
    pub fn new() -> PfRedirector {
        PfRedirector::with_token_path(DEFAULT_TOKEN_PATH)
    }

    pub fn with_token_path(path: impl Into<std::path::PathBuf>) -> PfRedirector {
        PfRedirector {
            pfctl: std::env::var("AGENSHIELD_PFCTL").unwrap_or_else(|_| "/sbin/pfctl".into()),
            tokens: TokenKeeper::new(TokenFile::new(path)),
        }
    }

    fn pfctl(&self, args: &[&str], stdin: Option<&str>) -> Result<Output, RedirectError> {
        run(&self.pfctl, args, stdin)
    }

    /// A listing of our anchor; empty when the anchor does not exist (pfctl then fails with
    /// "Invalid argument" from DIOCGETRULES, or says it does not exist).
    fn anchor_listing(&self, what: &str) -> Result<String, RedirectError> {
        match self.pfctl(&["-a", ANCHOR, what], None) {
            Ok(out) => Ok(out.stdout),
            Err(RedirectError::Command { stderr, .. }) if missing(&stderr) => Ok(String::new()),
            Err(e) => Err(e),
        }
    }

    fn table(&self, name: &str) -> Result<Option<String>, RedirectError> {
        match self.pfctl(&["-a", ANCHOR, "-t", name, "-T", "show"], None) {
            Ok(out) => Ok(Some(out.stdout)),
            Err(RedirectError::Command { stderr, .. }) if missing(&stderr) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Everything `status` compares, read from pf now.
    fn live(&self) -> Result<Live, RedirectError> {
        let enabled = device()?.is_enabled().map_err(crate_err("DIOCGETSTATUS"))?;
        let mut tables = Vec::new();
        for name in anchor::table_names() {
            tables.push((name.to_string(), self.table(name)?));
        }
        Ok(Live {
            enabled,
            main_filter: self.pfctl(&["-sr"], None)?.stdout,
            main_nat: self.pfctl(&["-sn"], None)?.stdout,
            filter: self.anchor_listing("-sr")?,
            nat: self.anchor_listing("-sn")?,
            tables,
            host_addrs: host_addrs()?,
        })
    }

    fn ensure_hooks(&self, dev: &mut PfCtl) -> Result<(), RedirectError> {
        let main_filter = self.pfctl(&["-sr"], None)?.stdout;
        let main_nat = self.pfctl(&["-sn"], None)?.stdout;
        let (filter, rdr) = anchor::hooks_present(&main_filter, &main_nat);
        if !filter {
            tracing::warn!(
                "pf: the main ruleset has no anchor \"com.apple/*\"; adding anchor \"{ANCHOR}\""
            );
            dev.try_add_anchor(ANCHOR, AnchorKind::Filter)
                .map_err(crate_err("adding the filter anchor hook"))?;
        }
        if !rdr {
            tracing::warn!("pf: the main ruleset has no rdr-anchor \"com.apple/*\"; adding rdr-anchor \"{ANCHOR}\"");
            dev.try_add_anchor(ANCHOR, AnchorKind::Redirect)
                .map_err(crate_err("adding the rdr-anchor hook"))?;
        }
        Ok(())
    }
}

/// `pfctl -E` / `pfctl -X TOKEN`.
struct PfctlRef<'a>(&'a PfRedirector);

impl EnableRef for PfctlRef<'_> {
    fn acquire(&self) -> Result<u64, RedirectError> {
        let out = self.0.pfctl(&["-E"], None)?;
        parse_enable_output(&out.stderr)
            .or_else(|| parse_enable_output(&out.stdout))
            .ok_or_else(|| RedirectError::Command {
                command: format!("{} -E", self.0.pfctl),
                stderr: format!("no \"Token : N\" in its output: {}", out.stderr),
            })
    }

    fn release(&self, token: u64) -> Result<(), RedirectError> {
        self.0.pfctl(&["-X", &token.to_string()], None).map(|_| ())
    }
}

impl Redirector for PfRedirector {
    fn apply(&self, spec: &RedirectSpec) -> Result<(), RedirectError> {
        self.pfctl(&["-a", ANCHOR, "-f", "-"], Some(&anchor::render(spec)))?;
        let mut dev = device()?;
        self.ensure_hooks(&mut dev)?;
        let running = dev.is_enabled().map_err(crate_err("DIOCGETSTATUS"))?;
        self.tokens.ensure(&PfctlRef(self), running)?;
        // Re-verify: loaded, hooked and enabled must now read as in effect. A mere
        // difference (pfctl spelled something unexpectedly) is logged, not fatal: the rules
        // pfctl accepted are in place.
        match anchor::compare(spec, &self.live()?) {
            Verdict::Matches => Ok(()),
            Verdict::Differs(why) => {
                tracing::warn!(
                    "pf anchor {ANCHOR} loaded but lists differently: {}",
                    why.join("; ")
                );
                Ok(())
            }
            Verdict::Absent(why) => Err(RedirectError::Command {
                command: format!("verifying pf anchor {ANCHOR} after loading it"),
                stderr: why.join("; "),
            }),
        }
    }

    fn remove(&self) -> Result<bool, RedirectError> {
        let had_rules = !self.anchor_listing("-sr")?.trim().is_empty()
            || !self.anchor_listing("-sn")?.trim().is_empty();
        let mut dev = device()?;
        for kind in [RulesetKind::Filter, RulesetKind::Redirect] {
            dev.flush_rules(ANCHOR, kind)
                .map_err(crate_err("flushing the anchor's rules"))?;
        }
        match self.pfctl(&["-a", ANCHOR, "-F", "Tables"], None) {
            Err(RedirectError::Command { stderr, .. }) if missing(&stderr) => {}
            other => {
                other?;
            }
        }
        for kind in [AnchorKind::Filter, AnchorKind::Redirect] {
            dev.try_remove_anchor(ANCHOR, kind)
                .map_err(crate_err("removing our anchor hook"))?;
        }
        let released = self.tokens.release(&PfctlRef(self))?;
        Ok(had_rules || released)
    }

    fn status(&self, spec: &RedirectSpec) -> Result<FirewallStatus, RedirectError> {
        let live = self.live()?;
        let expected = anchor::render(spec);
        Ok(match anchor::compare(spec, &live) {
            Verdict::Absent(why) => {
                tracing::warn!("pf anchor {ANCHOR} not in effect: {}", why.join("; "));
                FirewallStatus {
                    state: FirewallState::Absent,
                    installed_uids: Vec::new(),
                    installed: String::new(),
                    expected,
                }
            }
            verdict => {
                if let Verdict::Differs(why) = &verdict {
                    tracing::warn!("pf anchor {ANCHOR} differs: {}", why.join("; "));
                }
                FirewallStatus {
                    state: if verdict == Verdict::Matches {
                        FirewallState::Matches
                    } else {
                        FirewallState::Differs
                    },
                    installed_uids: anchor::installed_uids(&live.filter),
                    installed: format!("{}{}", live.nat, live.filter),
                    expected,
                }
            }
        })
    }

    fn describe(&self) -> String {
        format!("pf anchor {ANCHOR}")
    }
}

fn missing(stderr: &str) -> bool {
    stderr.contains("does not exist") || stderr.contains("Invalid argument")
}

fn device() -> Result<PfCtl, RedirectError> {
    PfCtl::new().map_err(crate_err("opening /dev/pf"))
}

fn crate_err(what: &'static str) -> impl Fn(pfctl::Error) -> RedirectError {
    move |e| RedirectError::Command {
        command: format!("pf ioctl ({what})"),
        stderr: e.to_string(),
    }
}

/// The host's interface addresses now: what pfctl expands `self` to at load time.
fn host_addrs() -> Result<Vec<IpAddr>, RedirectError> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| RedirectError::Spawn {
        command: "getifaddrs".into(),
        source: e.into(),
    })?;
    let mut out: Vec<IpAddr> = addrs
        .filter_map(|ifa| {
            let a = ifa.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                a.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect();
    out.sort_unstable();
    out.dedup();
    Ok(out)
}
