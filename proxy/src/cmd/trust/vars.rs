//! The environment that makes an agent's tools trust our CA: the variables each runtime reads
//! a CA bundle from, and the JVM's trust store options.

use std::path::Path;

/// Variables naming a PEM bundle, and who reads them. OpenSSL, Ruby, Go, uv
/// (`SSL_CERT_FILE`); Python requests and httpx (`REQUESTS_CA_BUNDLE`); curl
/// (`CURL_CA_BUNDLE`); Node, added to its own roots (`NODE_EXTRA_CA_CERTS`); npm, which
/// *replaces* its list with the file, so it gets the whole bundle (`NPM_CONFIG_CAFILE`, over a
/// machine npmrc's `cafile`); git (`GIT_SSL_CAINFO`); pip (`PIP_CERT`); cargo
/// (`CARGO_HTTP_CAINFO`); Bundler (`BUNDLE_SSL_CA_CERT`); gRPC C-core (python grpcio, Ruby,
/// PHP, C++), which ships its own roots (`GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`); Deno
/// (`DENO_CERT`); the AWS SDKs and CLI (`AWS_CA_BUNDLE`); OpenAI Codex
/// (`CODEX_CA_CERTIFICATE`); Elixir's Hex (`HEX_CACERTS_PATH`); the Google Cloud SDK
/// (`CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE`); httplib2, under the older Google API clients
/// (`HTTPLIB2_CA_CERTS`); Nix (`NIX_SSL_CERT_FILE`). Images that set some of these to the
/// system bundle are common: any left unset here would keep pointing there.
pub const CA_FILE_VARS: [&str; 17] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "NPM_CONFIG_CAFILE",
    "GIT_SSL_CAINFO",
    "PIP_CERT",
    "CARGO_HTTP_CAINFO",
    "BUNDLE_SSL_CA_CERT",
    "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    "DENO_CERT",
    "AWS_CA_BUNDLE",
    "CODEX_CA_CERTIFICATE",
    "HEX_CACERTS_PATH",
    "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE",
    "HTTPLIB2_CA_CERTS",
    "NIX_SSL_CERT_FILE",
];

/// The JVM reads no CA variable: every launcher (java, javac, Gradle, Maven) reads this one,
/// and it names our PKCS12 trust store.
pub const JAVA_VAR: &str = "JAVA_TOOL_OPTIONS";

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
