//! `[policy.source]`: where the daemon pulls its signed policy bundle from. The file model
//! (every key but `url` and `public_key` has a default), its checks, and the effective
//! [`PolicySourceConfig`] with every path absolute.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::forms;

/// `[policy]`: today only its `source` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySection {
    #[serde(default)]
    pub(super) source: Option<PolicySourceFile>,
}

/// `[policy.source]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PolicySourceFile {
    url: String,
    public_key: PathBuf,
    #[serde(default = "default_interval", deserialize_with = "forms::duration")]
    interval: Duration,
    #[serde(default = "default_max_size")]
    max_size: u64,
    #[serde(default)]
    require_first_sync: bool,
    #[serde(default)]
    cache: Option<PathBuf>,
    #[serde(default)]
    ca: Option<PathBuf>,
    #[serde(default = "default_timeout", deserialize_with = "forms::duration")]
    timeout: Duration,
}

fn default_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_max_size() -> u64 {
    16 * 1024 * 1024
}

fn default_timeout() -> Duration {
    Duration::from_secs(20)
}

/// Smallest and largest `policy.source.max_size`.
pub const MIN_BUNDLE_SIZE: u64 = 1024;
pub const MAX_BUNDLE_SIZE: u64 = 256 * 1024 * 1024;

/// Where a bundle comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BundleUrl {
    /// `https://…`: fetched with a conditional GET; the signature at the same URL + `.minisig`.
    Https(url::Url),
    /// `file:///…`: a mounted volume; the signature beside it (`FILE.minisig`).
    File(PathBuf),
}

impl BundleUrl {
    fn parse(text: &str) -> Result<BundleUrl, PolicySourceError> {
        let url = url::Url::parse(text).map_err(|e| PolicySourceError::Url {
            url: text.to_string(),
            why: e.to_string(),
        })?;
        let bad = |why: &str| PolicySourceError::Url {
            url: text.to_string(),
            why: why.to_string(),
        };
        match url.scheme() {
            "https" => {
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(bad("no host"));
                }
                if !url.username().is_empty() || url.password().is_some() {
                    return Err(bad("credentials in the URL are not taken"));
                }
                if url.fragment().is_some() {
                    return Err(bad("no fragment"));
                }
                if url.query().is_some() {
                    return Err(bad(
                        "no query: the URL is shown in records, logs and `ctl status` (a \
                         token there would leak), and the signature is at URL + \".minisig\"",
                    ));
                }
                Ok(BundleUrl::Https(url))
            }
            "file" => {
                let path = url
                    .to_file_path()
                    .map_err(|()| bad("not an absolute local path"))?;
                Ok(BundleUrl::File(path))
            }
            "http" => Err(bad(
                "plain http is not taken: the signature protects the content but not which \
                 revision is served; use https:// or file://",
            )),
            other => Err(bad(&format!("scheme {other}:// (https:// or file://)"))),
        }
    }
}

impl std::fmt::Display for BundleUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BundleUrl::Https(u) => f.write_str(u.as_str()),
            BundleUrl::File(p) => write!(f, "file://{}", p.display()),
        }
    }
}

/// The effective `[policy.source]`.
#[derive(Debug, Clone)]
pub struct PolicySourceConfig {
    pub url: BundleUrl,
    /// The minisign public key file.
    pub public_key: PathBuf,
    /// Between two syncs (each waits this plus or minus up to a tenth, at random).
    pub interval: Duration,
    /// A bundle (or signature) larger than this is refused while it is read.
    pub max_size: u64,
    /// With no cached bundle, refuse every agent request (`policy_unavailable`) until the
    /// first verified bundle arrives; otherwise the local directory alone decides meanwhile.
    pub require_first_sync: bool,
    /// The last verified bundle, its signature and ETag (written by the daemon only).
    pub cache: PathBuf,
    /// A PEM file of CAs the bundle server's certificate may chain to (besides the system
    /// roots); without it, `upstream.extra_ca` is used.
    pub ca: Option<PathBuf>,
    /// One fetch (bundle and signature) must finish within this.
    pub timeout: Duration,
}

/// What `[policy.source]` may not say.
#[derive(Debug, thiserror::Error)]
pub enum PolicySourceError {
    #[error("policy.source.url: {url:?}: {why}")]
    Url { url: String, why: String },
    #[error("policy.source.interval must be at least 1s")]
    IntervalTooShort,
    #[error(
        "policy.source.max_size must be between {MIN_BUNDLE_SIZE} and {MAX_BUNDLE_SIZE} bytes"
    )]
    MaxSize,
    #[error("policy.source.timeout must be between 1s and 10m")]
    Timeout,
}

impl PolicySourceFile {
    /// Checks the section and makes its paths absolute (`relative`: the config's rule;
    /// `default_cache`: where the cache goes when `cache` is not set).
    pub(super) fn check(
        self,
        relative: &dyn Fn(&Path) -> PathBuf,
        default_cache: PathBuf,
    ) -> Result<PolicySourceConfig, PolicySourceError> {
        let url = BundleUrl::parse(&self.url)?;
        if self.interval < Duration::from_secs(1) {
            return Err(PolicySourceError::IntervalTooShort);
        }
        if !(MIN_BUNDLE_SIZE..=MAX_BUNDLE_SIZE).contains(&self.max_size) {
            return Err(PolicySourceError::MaxSize);
        }
        if self.timeout < Duration::from_secs(1) || self.timeout > Duration::from_secs(600) {
            return Err(PolicySourceError::Timeout);
        }
        Ok(PolicySourceConfig {
            url,
            public_key: relative(&self.public_key),
            interval: self.interval,
            max_size: self.max_size,
            require_first_sync: self.require_first_sync,
            cache: self.cache.map_or(default_cache, |p| relative(&p)),
            ca: self.ca.map(|p| relative(&p)),
            timeout: self.timeout,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<PolicySourceConfig, PolicySourceError> {
        let file: PolicySection = toml::from_str(text).expect("parses");
        file.source.expect("source").check(
            &|p: &Path| Path::new("/etc/ash").join(p),
            PathBuf::from("/var/lib/ash/policy-cache"),
        )
    }

    #[test]
    fn defaults_and_relative_paths() {
        let c = parse(
            "[source]\nurl = \"https://policy.example/b.tar.gz\"\npublic_key = \"policy.pub\"\n",
        )
        .expect("valid");
        assert_eq!(c.public_key, Path::new("/etc/ash/policy.pub"));
        assert_eq!(c.interval, Duration::from_secs(30));
        assert_eq!(c.cache, Path::new("/var/lib/ash/policy-cache"));
        assert!(!c.require_first_sync);
        assert_eq!(c.max_size, 16 * 1024 * 1024);
    }

    #[test]
    fn file_url_is_a_path() {
        let c = parse("[source]\nurl = \"file:///srv/b.tar.gz\"\npublic_key = \"/k.pub\"\n")
            .expect("valid");
        assert_eq!(c.url, BundleUrl::File(PathBuf::from("/srv/b.tar.gz")));
    }

    #[test]
    fn plain_http_and_other_schemes_are_refused() {
        // A query: it would end up in every record, log line and `ctl status` (an object
        // store's presigned token), and `.minisig` would be appended to it, not the path.
        for url in [
            "http://x/b",
            "ftp://x/b",
            "https://u:p@x/b",
            "nonsense",
            "https://x/b.tar.gz?X-Amz-Signature=abc",
        ] {
            let text = format!("[source]\nurl = {url:?}\npublic_key = \"/k\"\n");
            assert!(
                matches!(parse(&text), Err(PolicySourceError::Url { .. })),
                "{url}"
            );
        }
    }

    #[test]
    fn bounds_are_checked() {
        let base = "[source]\nurl = \"file:///b\"\npublic_key = \"/k\"\n";
        assert!(matches!(
            parse(&format!("{base}interval = \"100ms\"")),
            Err(PolicySourceError::IntervalTooShort)
        ));
        assert!(matches!(
            parse(&format!("{base}max_size = 10")),
            Err(PolicySourceError::MaxSize)
        ));
        assert!(toml::from_str::<PolicySection>(&format!("{base}colour = 1")).is_err());
    }
}
