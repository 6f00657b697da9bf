//! The credential formats the detector knows, and where each may go: its home hosts, written
//! as policy host patterns and matched by the policy's own matcher (`policy::HostPattern`),
//! so `*.github.com` means here exactly what it means in a rule.

use std::sync::LazyLock;

use crate::policy::{parse_host_pattern, HostPattern};

/// A well-known credential format. Records and refusals name it (`as_str`), never the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Format {
    /// `AKIA…` / `ASIA…`: 20 characters.
    AwsAccessKeyId,
    /// 40 characters of base64 beside an access key id or after an `aws_secret_access_key`
    /// style name.
    AwsSecretAccessKey,
    /// `ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_` (CRC32-checked) and `github_pat_`.
    GitHubToken,
    /// `glpat-`, `gloas-`, `gldt-`, `glrt-`, `glcbt-`, `glptt-`, `glft-`, `glimt-`, `glagent-`,
    /// `glsoat-`.
    GitLabToken,
    /// `xoxb-`, `xoxa-`, `xoxp-`, `xoxr-`, `xoxs-`.
    SlackToken,
    /// `https://hooks.slack.com/services/T…/B…/…`: the URL is the credential.
    SlackWebhook,
    /// `sk_live_`, `rk_live_`.
    StripeKey,
    /// `sk-…T3BlbkFJ…`, `sk-proj-…`, `sk-svcacct-…`, `sk-admin-…`.
    OpenAiKey,
    /// `sk-ant-api03-…` and its siblings.
    AnthropicKey,
    /// `AIza` and 35 more characters.
    GoogleApiKey,
    /// A service-account JSON key file (`"type": "service_account"` with a `"private_key"`).
    GoogleServiceAccount,
    /// `-----BEGIN … PRIVATE KEY-----` (PKCS#1, PKCS#8, SEC1, DSA, encrypted PKCS#8).
    PemPrivateKey,
    /// `-----BEGIN OPENSSH PRIVATE KEY-----`.
    OpenSshPrivateKey,
    /// `-----BEGIN PGP PRIVATE KEY BLOCK-----`.
    PgpPrivateKey,
    /// `header.payload.signature`, base64url, the header a JSON object with `"alg"`.
    Jwt,
}

impl Format {
    /// Every format (tests walk them).
    #[cfg(test)]
    pub(crate) const ALL: [Format; 15] = [
        Format::AwsAccessKeyId,
        Format::AwsSecretAccessKey,
        Format::GitHubToken,
        Format::GitLabToken,
        Format::SlackToken,
        Format::SlackWebhook,
        Format::StripeKey,
        Format::OpenAiKey,
        Format::AnthropicKey,
        Format::GoogleApiKey,
        Format::GoogleServiceAccount,
        Format::PemPrivateKey,
        Format::OpenSshPrivateKey,
        Format::PgpPrivateKey,
        Format::Jwt,
    ];

    /// The stable name records, refusals and metrics use.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Format::AwsAccessKeyId => "aws_access_key_id",
            Format::AwsSecretAccessKey => "aws_secret_access_key",
            Format::GitHubToken => "github_token",
            Format::GitLabToken => "gitlab_token",
            Format::SlackToken => "slack_token",
            Format::SlackWebhook => "slack_webhook",
            Format::StripeKey => "stripe_key",
            Format::OpenAiKey => "openai_key",
            Format::AnthropicKey => "anthropic_key",
            Format::GoogleApiKey => "google_api_key",
            Format::GoogleServiceAccount => "google_service_account",
            Format::PemPrivateKey => "pem_private_key",
            Format::OpenSshPrivateKey => "openssh_private_key",
            Format::PgpPrivateKey => "pgp_private_key",
            Format::Jwt => "jwt",
        }
    }

    /// A bearer token without a home: passes in a credential header to any host the rule
    /// allows (recorded), is exfiltration anywhere else.
    pub(crate) fn is_bearer(self) -> bool {
        self == Format::Jwt
    }

    /// The home host patterns, as policy text. Empty: the credential has no home. A JWT has
    /// none on purpose: which API accepts a bearer token is written only in its own
    /// unverifiable claims (`iss`, `aud`), and issuers are countless; so a JWT may go in a
    /// credential header to whatever host the rule allows ([`Format::is_bearer`]) and
    /// nowhere else. A private key goes nowhere.
    pub(crate) fn home_patterns(self) -> &'static [&'static str] {
        match self {
            Format::AwsAccessKeyId | Format::AwsSecretAccessKey => {
                &["*.amazonaws.com", "*.amazonaws.com.cn"]
            }
            Format::GitHubToken => &["github.com", "*.github.com", "*.githubusercontent.com"],
            Format::GitLabToken => &["gitlab.com", "*.gitlab.com"],
            Format::SlackToken | Format::SlackWebhook => &["slack.com", "*.slack.com"],
            Format::StripeKey => &["api.stripe.com"],
            Format::OpenAiKey => &["api.openai.com"],
            Format::AnthropicKey => &["api.anthropic.com"],
            Format::GoogleApiKey | Format::GoogleServiceAccount => &["*.googleapis.com"],
            Format::PemPrivateKey
            | Format::OpenSshPrivateKey
            | Format::PgpPrivateKey
            | Format::Jwt => &[],
        }
    }

    /// Whether canonical `host` is one of this format's homes.
    pub(crate) fn is_home(self, host: &str) -> bool {
        HOMES[self as usize].iter().any(|p| p.matches(host))
    }
}

/// The home patterns compiled once, indexed by `Format as usize`. The table is static text,
/// so a pattern that does not parse is a bug the tests catch (`every_home_pattern_parses`);
/// here it would only drop that home (fail closed: refused, never let through).
static HOMES: LazyLock<Vec<Vec<HostPattern>>> = LazyLock::new(|| {
    (0..FORMAT_COUNT)
        .map(|i| {
            format_at(i)
                .home_patterns()
                .iter()
                .filter_map(|p| parse_host_pattern(p).ok())
                .collect()
        })
        .collect()
});

const FORMAT_COUNT: usize = Format::Jwt as usize + 1;

fn format_at(i: usize) -> Format {
    match i {
        0 => Format::AwsAccessKeyId,
        1 => Format::AwsSecretAccessKey,
        2 => Format::GitHubToken,
        3 => Format::GitLabToken,
        4 => Format::SlackToken,
        5 => Format::SlackWebhook,
        6 => Format::StripeKey,
        7 => Format::OpenAiKey,
        8 => Format::AnthropicKey,
        9 => Format::GoogleApiKey,
        10 => Format::GoogleServiceAccount,
        11 => Format::PemPrivateKey,
        12 => Format::OpenSshPrivateKey,
        13 => Format::PgpPrivateKey,
        _ => Format::Jwt,
    }
}

#[cfg(test)]
pub(crate) fn home_parse_errors() -> Vec<String> {
    Format::ALL
        .iter()
        .flat_map(|f| f.home_patterns().iter())
        .filter_map(|p| parse_host_pattern(p).err().map(|e| e.to_string()))
        .collect()
}
