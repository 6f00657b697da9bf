//! Whether each of the agent's contexts carries the CA variables install sets, and (Linux)
//! whether PAM gives them to sessions outside a login shell, (macOS) whether the LaunchAgent
//! that sets them in the agent's launchd domain is in place.

use std::path::Path;

use super::agent::Agent;
use super::agent_access::Access;
use super::contexts::Context;
use super::finding::{Area, Finding};
use super::installed::Installed;
use super::runtimes::unset_fix;
use crate::cmd::install::layout::{LAUNCHD_ENV_LABEL, PAM_PROFILE_PATH};
use crate::cmd::trust::files;

/// The finding for one captured context.
pub fn context(ctx: &Context, agent: &Agent, inst: &Installed) -> Finding {
    let trust = inst.trust();
    let java_flag = format!("-Djavax.net.ssl.trustStore={}", inst.truststore.display());
    let mut missing = Vec::new();
    let mut elsewhere = Vec::new();
    let expected = trust.env();
    for (var, want) in &expected {
        match ctx.get(var) {
            None => missing.push(*var),
            Some(v) if *var == crate::cmd::trust::runtimes::JAVA_VAR => {
                if !v.split_whitespace().any(|t| t == java_flag) {
                    elsewhere.push(format!("{var}={v}"));
                }
            }
            Some(v) if v != want => elsewhere.push(format!("{var}={v}")),
            Some(_) => {}
        }
    }
    let subject = ctx.kind.name();
    if !missing.is_empty() {
        return Finding::fail(
            Area::Environment,
            subject,
            format!(
                "{} of {} variables are not set: {}",
                missing.len(),
                expected.len(),
                missing.join(", ")
            ),
            unset_fix(missing[0], ctx.kind, agent, inst),
        );
    }
    if !elsewhere.is_empty() {
        return Finding::warn(
            Area::Environment,
            subject,
            format!(
                "set, but not to ours: {} (the runtime checks say whether that trusts the CA)",
                elsewhere.join(", ")
            ),
            None,
        );
    }
    Finding::ok(
        Area::Environment,
        subject,
        format!(
            "all {} variables name {} (and the trust store)",
            expected.len(),
            inst.bundle.display()
        ),
    )
}

/// Linux: our PAM profile, which gives sessions outside a login shell the variables.
pub fn pam(enabled: bool, agent: &Agent, env_file: &Path) -> Finding {
    let subject = "PAM session environment";
    if enabled {
        return Finding::ok(
            Area::Environment,
            subject,
            format!(
                "{} applies {} to {}'s sessions",
                files::PAM_SESSION_STACK,
                env_file.display(),
                agent.name
            ),
        );
    }
    let fix = if Path::new(files::PAM_AUTH_UPDATE).exists() {
        if Path::new(PAM_PROFILE_PATH).exists() {
            "`sudo pam-auth-update --enable agenshield`".to_string()
        } else {
            "`sudo agenshield proxy install` (adds the PAM profile and enables it)".to_string()
        }
    } else {
        format!(
            "no pam-auth-update here: add these lines to the session stack (e.g. \
             {}): {}",
            files::PAM_SESSION_STACK,
            files::pam_lines(&agent.name, env_file)
                .lines()
                .collect::<Vec<_>>()
                .join(" | ")
        )
    };
    Finding::fail(
        Area::Environment,
        subject,
        format!(
            "not in the session stack: su, sudo -u, cron and ssh sessions of {} outside a login \
             shell get no CA variables",
            agent.name
        ),
        fix,
    )
}

/// macOS: the LaunchAgent that runs `launchctl setenv` for each variable in the agent's
/// launchd domain (apps and launchd jobs read no shell file). It is in the agent's home, so
/// it is read as the agent.
pub fn launch_agent(agent: &Agent, inst: &Installed, access: &Access) -> Finding {
    let path = agent
        .home
        .join(format!("Library/LaunchAgents/{LAUNCHD_ENV_LABEL}.plist"));
    let want = files::launchd_env_plist(LAUNCHD_ENV_LABEL, &inst.trust());
    let subject = "launchd (apps, launchd jobs)";
    match access.read_text(&path) {
        Ok(text) if text == want => Finding::ok(
            Area::Environment,
            subject,
            format!("{} sets the variables", path.display()),
        ),
        Ok(_) => Finding::fail(
            Area::Environment,
            subject,
            format!("{} differs from what install writes", path.display()),
            "`sudo agenshield proxy install` rewrites it",
        ),
        Err(e) => Finding::fail(
            Area::Environment,
            subject,
            format!("{}: {e}", path.display()),
            "`sudo agenshield proxy install` writes it",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::doctor::contexts::ContextKind;
    use crate::cmd::doctor::finding::Status;
    use std::path::PathBuf;

    #[test]
    fn missing_variables_fail_and_foreign_ones_warn() {
        let inst = Installed {
            ca: "/c/ca.pem".into(),
            bundle: "/c/agent-ca-bundle.pem".into(),
            truststore: "/c/agent-truststore.p12".into(),
            env_file: "/c/agent-env".into(),
            pam_enabled: Some(true),
        };
        let agent = Agent {
            name: "a".into(),
            uid: 1,
            gids: vec![],
            home: PathBuf::from("/h"),
        };
        let trust = inst.trust();
        let mut env: std::collections::BTreeMap<String, String> = trust
            .env()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        // The agent's own JVM options around ours are fine.
        let java = env["JAVA_TOOL_OPTIONS"].clone();
        env.insert("JAVA_TOOL_OPTIONS".into(), format!("-Xmx1g {java}"));
        let mut ctx = Context {
            kind: ContextKind::NonLogin,
            env,
        };
        assert_eq!(context(&ctx, &agent, &inst).status, Status::Ok);
        ctx.env.insert("PIP_CERT".into(), "/elsewhere.pem".into());
        let f = context(&ctx, &agent, &inst);
        assert_eq!(f.status, Status::Warn);
        assert!(f.detail.contains("PIP_CERT=/elsewhere.pem"), "{}", f.detail);
        ctx.env.remove("GIT_SSL_CAINFO");
        let f = context(&ctx, &agent, &inst);
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.detail
                .starts_with("1 of 18 variables are not set: GIT_SSL_CAINFO"),
            "{}",
            f.detail
        );
        assert!(
            f.fix.as_deref().unwrap_or("").contains("/c/agent-env"),
            "{f:?}"
        );
    }
}
