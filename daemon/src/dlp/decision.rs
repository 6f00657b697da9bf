//! May this credential go there? A credential passes only to one of its format's home hosts
//! and only in a place that service reads credentials from (a credential header, and the
//! few other places a format documents); anywhere else it is `credential_exfiltration`.

use crate::record::ErrorCode;

use super::allow::AllowList;
use super::detector::Finding;
use super::format::Format;

/// Headers whose value is a credential for the host it goes to (names compared ignoring
/// ASCII case). `Proxy-Authorization` is not one: it is for a proxy, never for the home.
pub(crate) const CREDENTIAL_HEADERS: [&str; 8] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "x-auth-token",
    "private-token",
    "job-token",
    "x-amz-security-token",
];

/// Where in a request (or beside it) a finding was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Path,
    Query,
    /// A header in [`CREDENTIAL_HEADERS`].
    CredentialHeader,
    OtherHeader,
    Body,
    WebSocket,
    DnsName,
}

impl Place {
    /// The place of a header, by name.
    pub(crate) fn header(name: &str) -> Place {
        if CREDENTIAL_HEADERS
            .iter()
            .any(|h| h.eq_ignore_ascii_case(name))
        {
            Place::CredentialHeader
        } else {
            Place::OtherHeader
        }
    }

    /// Whether a `format` credential belongs here when it goes home: a credential header
    /// always; the query for an AWS key id (presigned URLs) and a Google API key
    /// (`?key=`); the path for a Slack webhook (an absolute-form request line).
    pub(super) fn carries(self, format: Format) -> bool {
        match self {
            Place::CredentialHeader => true,
            Place::Query => matches!(format, Format::AwsAccessKeyId | Format::GoogleApiKey),
            Place::Path => format == Format::SlackWebhook,
            Place::OtherHeader | Place::Body | Place::WebSocket | Place::DnsName => false,
        }
    }
}

/// The verdict on one finding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// To its home, in a credential place.
    Home,
    /// A bearer token with no home of its own (a JWT) in a credential header: that is how
    /// such tokens are used, with whatever host the rule lets the agent reach; passed and
    /// recorded. In any other place it is exfiltration.
    Bearer,
    /// A value the rule's `dlp_allow` (or the defaults) lists.
    Allowed,
    /// Anywhere else: refused as `credential_exfiltration`, naming the format.
    Exfiltration { format: Format },
}

impl Decision {
    /// The refusal's code, for an exfiltration.
    pub(crate) fn error_code(self) -> Option<ErrorCode> {
        matches!(self, Decision::Exfiltration { .. }).then_some(ErrorCode::CredentialExfiltration)
    }
}

/// Decides one finding headed to canonical `host` (as the policy normalized it) in `place`.
pub(crate) fn decide(finding: &Finding, host: &str, place: Place, allow: &AllowList) -> Decision {
    if allow.allows(finding) {
        Decision::Allowed
    } else if place.carries(finding.format) && finding.format.is_home(host) {
        Decision::Home
    } else if place == Place::CredentialHeader && finding.format.is_bearer() {
        Decision::Bearer
    } else {
        Decision::Exfiltration {
            format: finding.format,
        }
    }
}
