//! What a request record says about the credentials found in it (`dlp`, `docs/dlp.md`):
//! the overall action and, for each finding, its format and where it was. Never a value,
//! a length or a fingerprint.

use serde::Serialize;

/// What the credential check did with the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DlpAction {
    /// Every finding went home or was allowed (`dlp_allow`).
    Passed,
    /// A credential was not going home; the rule's `dlp = "report"` let it through.
    Reported,
    /// A credential was not going home: refused (`credential_exfiltration`).
    Blocked,
}

/// Where a finding was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DlpPlace {
    Path,
    Query,
    /// A credential header (`Authorization`, `X-Api-Key`, …).
    CredentialHeader,
    Header,
    Body,
    Websocket,
    DnsName,
}

/// What the check decided about one finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum DlpVerdict {
    /// To its home, in a credential place.
    Home,
    /// A homeless bearer token (a JWT) in a credential header: passed.
    Bearer,
    /// Listed in `dlp_allow` (or the defaults).
    Allowed,
    Exfiltration,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DlpFinding {
    /// The format's name (`github_token`, …).
    pub format: &'static str,
    pub place: DlpPlace,
    pub verdict: DlpVerdict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DlpFacts {
    pub action: DlpAction,
    /// Each (format, place, verdict) once.
    pub findings: Vec<DlpFinding>,
}
