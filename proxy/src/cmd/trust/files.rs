//! The text of every file that carries the agent's trust: shell start-up lines, the
//! `KEY=value` environment file (PAM's `envfile`, systemd's `EnvironmentFile=` and
//! `environment.d`), wget's setting, the PAM profile that applies the environment file to the
//! agent's sessions only, and the macOS launchd agent that sets it for the agent's launchd
//! domain. Pure, so both platforms' files are golden-tested anywhere.

use super::runtimes::JAVA_VAR;
use super::vars::AgentTrust;

/// POSIX sh (bash and zsh): every variable exported; the JVM options are added to what the
/// agent's own `JAVA_TOOL_OPTIONS` holds, once however often the file is read.
pub fn shell_lines(t: &AgentTrust) -> String {
    let mut s = String::new();
    for (k, v) in t.env() {
        if k == JAVA_VAR {
            let q = sh_quote(&v);
            s.push_str(&format!(
                "case \" ${{{k}-}} \" in *{q}*) ;; *) export {k}=\"${{{k}:+${k} }}\"{q} ;; esac\n"
            ));
        } else {
            s.push_str(&format!("export {k}={}\n", sh_quote(&v)));
        }
    }
    s
}

/// `KEY=value` lines, unquoted: the format pam_env's `envfile=`, systemd's
/// `EnvironmentFile=` and `environment.d` share for values without quotes or `$`.
pub fn env_lines(t: &AgentTrust) -> String {
    t.env()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

/// The environment file install writes next to the bundle.
pub fn env_file(t: &AgentTrust) -> String {
    format!(
        "# The AgenShield agent's CA variables (written by `agenshield proxy install`).\n\
         # Read by PAM for the agent's sessions (su, sudo, cron, ssh, login) and usable as a\n\
         # systemd unit's EnvironmentFile= for services that run as the agent.\n{}",
        env_lines(t)
    )
}

/// wget (GnuTLS builds ignore every CA variable) reads `~/.wgetrc`.
pub fn wgetrc_lines(t: &AgentTrust) -> String {
    format!("ca_certificate = {}\n", t.bundle.display())
}

/// Debian's tool that enables PAM profiles.
pub const PAM_AUTH_UPDATE: &str = "/usr/sbin/pam-auth-update";

/// The session stack Debian's `pam-auth-update` writes the profile into.
pub const PAM_SESSION_STACK: &str = "/etc/pam.d/common-session";

/// Whether the session stack applies `env_file` (our profile is enabled).
pub fn pam_applies(env_file: &std::path::Path) -> bool {
    std::fs::read_to_string(PAM_SESSION_STACK)
        .is_ok_and(|t| t.contains(&env_file.display().to_string()))
}

/// Debian's `pam-auth-update` profile: for the agent's sessions only, pam_env applies the
/// environment file. `pam_succeed_if` skips the next line for every other user.
pub fn pam_profile(agent: &str, env_file: &std::path::Path) -> String {
    format!(
        "Name: AgenShield: the CA variables for {agent}'s sessions (agenshield proxy install)\n\
         Default: yes\n\
         Priority: 0\n\
         Session-Type: Additional\n\
         Session:\n\
         \t[success=1 default=ignore]\tpam_succeed_if.so quiet user != {agent}\n\
         \toptional\tpam_env.so readenv=1 user_readenv=0 envfile={}\n",
        env_file.display()
    )
}

/// The two PAM lines, for distributions without `pam-auth-update`.
pub fn pam_lines(agent: &str, env_file: &std::path::Path) -> String {
    format!(
        "session [success=1 default=ignore] pam_succeed_if.so quiet user != {agent}\n\
         session optional pam_env.so readenv=1 user_readenv=0 envfile={}\n",
        env_file.display()
    )
}

/// macOS: a LaunchAgent in the agent's `~/Library/LaunchAgents` that runs `launchctl setenv`
/// for every variable when the agent's launchd domain starts, so what launchd starts for the
/// agent (its user agents, apps opened in its session) inherits them. launchd reads no
/// shell file.
pub fn launchd_env_plist(label: &str, t: &AgentTrust) -> String {
    let mut script = String::new();
    for (k, v) in t.env() {
        script.push_str(&format!("/bin/launchctl setenv {k} {}; ", sh_quote(&v)));
    }
    let script = script.trim_end_matches("; ");
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n\
         <!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" \"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n\
         <plist version=\"1.0\">\n\
         <dict>\n\
         \t<key>Label</key>\n\
         \t<string>{}</string>\n\
         \t<key>ProgramArguments</key>\n\
         \t<array>\n\
         \t\t<string>/bin/sh</string>\n\
         \t\t<string>-c</string>\n\
         \t\t<string>{}</string>\n\
         \t</array>\n\
         \t<key>RunAtLoad</key>\n\
         \t<true/>\n\
         \t<key>LimitLoadToSessionType</key>\n\
         \t<array>\n\
         \t\t<string>Aqua</string>\n\
         \t\t<string>Background</string>\n\
         \t\t<string>StandardIO</string>\n\
         \t</array>\n\
         </dict>\n\
         </plist>\n",
        xml_escape(label),
        xml_escape(script)
    )
}

/// Single-quoted for POSIX sh.
pub fn sh_quote(v: &str) -> String {
    format!("'{}'", v.replace('\'', r"'\''"))
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn trust() -> AgentTrust<'static> {
        AgentTrust {
            bundle: Path::new("/opt/agenshield/certs/agent-ca-bundle.pem"),
            truststore: Some(Path::new("/opt/agenshield/certs/agent-truststore.p12")),
        }
    }

    /// The shell lines set every variable, and the JVM options once, kept beside the
    /// agent's own, however often the lines are read (by sh itself).
    #[test]
    fn the_shell_lines_export_everything_and_add_java_options_once() {
        let lines = shell_lines(&trust());
        let script = format!(
            "JAVA_TOOL_OPTIONS=-Xmx1g\n{lines}{lines}\
             printf '%s\\n' \"$JAVA_TOOL_OPTIONS\" \"$GRPC_DEFAULT_SSL_ROOTS_FILE_PATH\""
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .env_clear()
            .output()
            .expect("sh");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut l = text.lines();
        let java = l.next().expect("java");
        assert!(
            java.starts_with("-Xmx1g -Djavax.net.ssl.trustStore="),
            "{java}"
        );
        assert_eq!(java.matches("trustStore=").count(), 1, "{java}");
        assert_eq!(l.next(), Some("/opt/agenshield/certs/agent-ca-bundle.pem"));
    }

    #[test]
    fn a_quote_in_a_path_stays_quoted() {
        assert_eq!(sh_quote("/a'b"), r"'/a'\''b'");
    }
}
