//! The one table of runtimes whose trust install sets up: for each, what makes it trust our
//! CA (a variable naming the PEM bundle, the JVM options naming the trust store, wget's rc
//! file), whether that beats the tool's own configuration files, and, for the runtimes
//! `doctor` traces, which one it is. `trust` sets the variables in the table's order (the
//! golden files pin it); `doctor` reports the runtimes it traces in [`Runtime::ALL`]'s order.
//!
//! Images that set some of these variables to the system bundle are common: any left unset
//! here would keep pointing there, so the table lists every runtime we know to read one, not
//! only those doctor traces.

/// The JVM reads no CA variable: every launcher (java, javac, Gradle, Maven) reads this one,
/// and it names our PKCS12 trust store.
pub const JAVA_VAR: &str = "JAVA_TOOL_OPTIONS";

/// What install sets up for a runtime (what doctor's fix restores).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ours {
    /// A variable naming our PEM bundle.
    Bundle(&'static str),
    /// [`JAVA_VAR`], naming our trust store.
    JavaOptions,
    /// wget reads no variable: `ca_certificate` in `~/.wgetrc`.
    Wgetrc,
}

impl Ours {
    /// The variable install sets; `None` for wget.
    pub const fn var(self) -> Option<&'static str> {
        match self {
            Ours::Bundle(v) => Some(v),
            Ours::JavaOptions => Some(JAVA_VAR),
            Ours::Wgetrc => None,
        }
    }
}

/// The runtimes doctor traces (where each takes its roots from: `doctor/sources.rs`), in the
/// order it reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Curl,
    Wget,
    Git,
    /// Python's `ssl` and `urllib` (OpenSSL's default paths).
    Python,
    Requests,
    Httpx,
    Pip,
    Node,
    Npm,
    Java,
    Go,
    /// gRPC C-core as python's grpcio ships it (also Ruby's and PHP's).
    Grpc,
}

/// One runtime: what each user of the table needs of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuntimeTrust {
    /// As doctor names it.
    pub name: &'static str,
    pub ours: Ours,
    /// Our variable overrides the tool's configuration files (git, pip, npm); curl's
    /// `~/.curlrc` is a command line and beats it.
    pub beats_config: bool,
    /// Doctor's key, for the runtimes it traces.
    pub traced: Option<Runtime>,
}

const fn row(name: &'static str, ours: Ours, traced: Option<Runtime>) -> RuntimeTrust {
    RuntimeTrust {
        name,
        ours,
        beats_config: false,
        traced,
    }
}

const fn bundle(name: &'static str, var: &'static str) -> RuntimeTrust {
    row(name, Ours::Bundle(var), None)
}

const fn traced(name: &'static str, var: &'static str, rt: Runtime) -> RuntimeTrust {
    row(name, Ours::Bundle(var), Some(rt))
}

const fn over_config(r: RuntimeTrust) -> RuntimeTrust {
    RuntimeTrust {
        beats_config: true,
        ..r
    }
}

/// Every runtime, in the order `trust` sets their variables. npm *replaces* its list with the
/// file, so it gets the whole bundle (over a machine npmrc's `cafile`); node adds the file to
/// its own roots; gRPC C-core (python grpcio, Ruby, PHP, C++) ships its own roots.
pub const RUNTIMES: [RuntimeTrust; 24] = [
    traced("python (ssl, urllib)", "SSL_CERT_FILE", Runtime::Python),
    bundle("openssl", "SSL_CERT_FILE"),
    bundle("ruby", "SSL_CERT_FILE"),
    traced("go", "SSL_CERT_FILE", Runtime::Go),
    bundle("uv", "SSL_CERT_FILE"),
    traced("python httpx", "SSL_CERT_FILE", Runtime::Httpx),
    traced("python requests", "REQUESTS_CA_BUNDLE", Runtime::Requests),
    traced("curl", "CURL_CA_BUNDLE", Runtime::Curl),
    traced("node", "NODE_EXTRA_CA_CERTS", Runtime::Node),
    over_config(traced("npm", "NPM_CONFIG_CAFILE", Runtime::Npm)),
    over_config(traced("git", "GIT_SSL_CAINFO", Runtime::Git)),
    over_config(traced("pip", "PIP_CERT", Runtime::Pip)),
    bundle("cargo", "CARGO_HTTP_CAINFO"),
    bundle("bundler", "BUNDLE_SSL_CA_CERT"),
    traced(
        "grpc (grpcio)",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
        Runtime::Grpc,
    ),
    bundle("deno", "DENO_CERT"),
    bundle("the AWS SDKs and CLI", "AWS_CA_BUNDLE"),
    bundle("OpenAI Codex", "CODEX_CA_CERTIFICATE"),
    bundle("Elixir's Hex", "HEX_CACERTS_PATH"),
    bundle("the Google Cloud SDK", "CLOUDSDK_CORE_CUSTOM_CA_CERTS_FILE"),
    bundle(
        "httplib2 (the older Google API clients)",
        "HTTPLIB2_CA_CERTS",
    ),
    bundle("nix", "NIX_SSL_CERT_FILE"),
    row("wget", Ours::Wgetrc, Some(Runtime::Wget)),
    row("java", Ours::JavaOptions, Some(Runtime::Java)),
];

/// The variables naming the PEM bundle, each once, in [`RUNTIMES`]' order.
pub const CA_FILE_VARS: [&str; distinct_bundle_vars()] = {
    let mut out = [""; distinct_bundle_vars()];
    let (mut i, mut n) = (0, 0);
    while i < RUNTIMES.len() {
        if let Some(v) = new_bundle_var(i) {
            out[n] = v;
            n += 1;
        }
        i += 1;
    }
    out
};

/// Row `i`'s bundle variable, unless an earlier row has it.
const fn new_bundle_var(i: usize) -> Option<&'static str> {
    let Ours::Bundle(v) = RUNTIMES[i].ours else {
        return None;
    };
    let mut j = 0;
    while j < i {
        if let Ours::Bundle(w) = RUNTIMES[j].ours {
            if same(w, v) {
                return None;
            }
        }
        j += 1;
    }
    Some(v)
}

const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn distinct_bundle_vars() -> usize {
    let (mut i, mut n) = (0, 0);
    while i < RUNTIMES.len() {
        if new_bundle_var(i).is_some() {
            n += 1;
        }
        i += 1;
    }
    n
}

/// Each traced runtime's row in [`RUNTIMES`], found when compiling: a traced runtime with no
/// row or two fails the build.
const ROW_OF: [usize; Runtime::ALL.len()] = {
    let mut of = [usize::MAX; Runtime::ALL.len()];
    let mut i = 0;
    while i < RUNTIMES.len() {
        if let Some(rt) = RUNTIMES[i].traced {
            assert!(of[rt as usize] == usize::MAX, "a runtime with two rows");
            of[rt as usize] = i;
        }
        i += 1;
    }
    let mut k = 0;
    while k < of.len() {
        assert!(of[k] != usize::MAX, "a traced runtime without a row");
        assert!(Runtime::ALL[k] as usize == k, "Runtime::ALL out of order");
        k += 1;
    }
    of
};

impl Runtime {
    pub const ALL: [Runtime; 12] = [
        Runtime::Curl,
        Runtime::Wget,
        Runtime::Git,
        Runtime::Python,
        Runtime::Requests,
        Runtime::Httpx,
        Runtime::Pip,
        Runtime::Node,
        Runtime::Npm,
        Runtime::Java,
        Runtime::Go,
        Runtime::Grpc,
    ];

    /// Its row of [`RUNTIMES`].
    pub fn trust(self) -> &'static RuntimeTrust {
        &RUNTIMES[ROW_OF[self as usize]]
    }

    pub fn name(self) -> &'static str {
        self.trust().name
    }

    pub fn ours(self) -> Ours {
        self.trust().ours
    }

    /// Our variable, where it overrides the tool's configuration files.
    pub fn overriding_var(self) -> Option<&'static str> {
        let t = self.trust();
        t.ours.var().filter(|_| t.beats_config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_sets_every_bundle_variable_once_in_its_order() {
        assert_eq!(
            CA_FILE_VARS,
            [
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
            ]
        );
    }

    #[test]
    fn each_traced_runtime_reads_its_row() {
        assert_eq!(Runtime::Curl.name(), "curl");
        assert_eq!(Runtime::Grpc.name(), "grpc (grpcio)");
        assert_eq!(Runtime::Go.ours(), Ours::Bundle("SSL_CERT_FILE"));
        assert_eq!(Runtime::Java.ours().var(), Some(JAVA_VAR));
        assert_eq!(Runtime::Wget.ours().var(), None);
        let overriding: Vec<Runtime> = Runtime::ALL
            .into_iter()
            .filter(|rt| rt.overriding_var().is_some())
            .collect();
        assert_eq!(overriding, [Runtime::Git, Runtime::Pip, Runtime::Npm]);
    }
}
