//! The environment that makes an agent's tools trust our CA: every bundle variable of the
//! runtime table ([`super::runtimes`]) naming the bundle, and the JVM's trust store options.

use std::path::Path;

use super::runtimes::{CA_FILE_VARS, JAVA_VAR};

/// What the agent trusts: the PEM bundle, and the JVM trust store made from it.
#[derive(Debug, Clone, Copy)]
pub struct AgentTrust<'a> {
    pub bundle: &'a Path,
    pub truststore: Option<&'a Path>,
}

impl AgentTrust<'_> {
    /// The JVM options naming the trust store. Its password only guards integrity (the
    /// store holds public certificates), so it is Java's conventional one.
    pub fn java_options(&self) -> Option<String> {
        self.truststore.map(|t| {
            format!(
                "-Djavax.net.ssl.trustStore={} -Djavax.net.ssl.trustStoreType=PKCS12 \
                 -Djavax.net.ssl.trustStorePassword={}",
                t.display(),
                super::truststore::PASSWORD
            )
        })
    }

    /// Every variable and its value, in a fixed order.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let bundle = self.bundle.display().to_string();
        let mut v: Vec<(&'static str, String)> =
            CA_FILE_VARS.iter().map(|k| (*k, bundle.clone())).collect();
        if let Some(j) = self.java_options() {
            v.push((JAVA_VAR, j));
        }
        v
    }

    /// The names of [`AgentTrust::env`].
    pub fn names(&self) -> Vec<&'static str> {
        self.env().into_iter().map(|(k, _)| k).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_file_variable_names_the_bundle_and_java_the_store() {
        let t = AgentTrust {
            bundle: Path::new("/opt/agenshield/certs/agent-ca-bundle.pem"),
            truststore: Some(Path::new("/opt/agenshield/certs/agent-truststore.p12")),
        };
        let env = t.env();
        assert_eq!(env.len(), CA_FILE_VARS.len() + 1);
        assert!(env[..CA_FILE_VARS.len()]
            .iter()
            .all(|(_, v)| v == "/opt/agenshield/certs/agent-ca-bundle.pem"));
        let java = &env.last().expect("java").1;
        assert!(java
            .starts_with("-Djavax.net.ssl.trustStore=/opt/agenshield/certs/agent-truststore.p12 "));
        let no_java = AgentTrust {
            truststore: None,
            ..t
        };
        assert!(no_java.env().iter().all(|(k, _)| *k != JAVA_VAR));
    }
}
