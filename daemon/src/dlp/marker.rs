//! The literal prefixes and markers the detector's one automaton looks for, each naming the
//! verifier that decides whether a credential really starts there. A literal alone is never
//! a finding: `sk-` or `eyJ` appear in ordinary text all the time.

/// Which verifier a literal calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    AwsKeyId,
    AwsSecretName,
    GitHubClassic,
    GitHubFineGrained,
    GitLab,
    Slack,
    SlackWebhook,
    Stripe,
    /// `sk-`: OpenAI, or Anthropic when `ant-` follows.
    SkDash,
    GoogleApiKey,
    ServiceAccount,
    PemBegin,
    Jwt,
}

/// Every literal and its verifier. Case-sensitive: each format fixes the case of its prefix
/// (the field names of an AWS secret are listed in the spellings tools write).
pub(super) const LITERALS: &[(&str, Marker)] = &[
    ("AKIA", Marker::AwsKeyId),
    ("ASIA", Marker::AwsKeyId),
    ("aws_secret_access_key", Marker::AwsSecretName),
    ("AWS_SECRET_ACCESS_KEY", Marker::AwsSecretName),
    ("SecretAccessKey", Marker::AwsSecretName),
    ("secretAccessKey", Marker::AwsSecretName),
    ("secret_access_key", Marker::AwsSecretName),
    ("ghp_", Marker::GitHubClassic),
    ("gho_", Marker::GitHubClassic),
    ("ghu_", Marker::GitHubClassic),
    ("ghs_", Marker::GitHubClassic),
    ("ghr_", Marker::GitHubClassic),
    ("github_pat_", Marker::GitHubFineGrained),
    ("glpat-", Marker::GitLab),
    ("gloas-", Marker::GitLab),
    ("gldt-", Marker::GitLab),
    ("glrt-", Marker::GitLab),
    ("glcbt-", Marker::GitLab),
    ("glptt-", Marker::GitLab),
    ("glft-", Marker::GitLab),
    ("glimt-", Marker::GitLab),
    ("glagent-", Marker::GitLab),
    ("glsoat-", Marker::GitLab),
    ("xoxb-", Marker::Slack),
    ("xoxa-", Marker::Slack),
    ("xoxp-", Marker::Slack),
    ("xoxr-", Marker::Slack),
    ("xoxs-", Marker::Slack),
    ("hooks.slack.com/services/", Marker::SlackWebhook),
    ("sk_live_", Marker::Stripe),
    ("rk_live_", Marker::Stripe),
    ("sk-", Marker::SkDash),
    ("AIza", Marker::GoogleApiKey),
    ("service_account", Marker::ServiceAccount),
    ("-----BEGIN", Marker::PemBegin),
    ("eyJ", Marker::Jwt),
];
