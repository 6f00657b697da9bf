//! Home or not: each format at its home in a credential place passes, anywhere else is
//! `credential_exfiltration`; `dlp_allow` and the AWS documentation keys pass everywhere.

use super::allow::{AllowList, AWS_EXAMPLE_KEYS};
use super::decision::{decide, Decision, Place};
use super::detector::{Detector, Finding, Findings};
use super::format::{home_parse_errors, Format};
use super::testgen;
use crate::record::ErrorCode;

fn find(d: &Detector, text: &str, format: Format) -> Finding {
    let mut out = Findings::default();
    d.scan(text.as_bytes(), &mut out);
    let found = out.iter().find(|f| f.format == format).cloned();
    found.unwrap_or_else(|| panic!("{format:?} not found"))
}

/// A home host for each format that has one.
fn home_of(format: Format) -> Option<&'static str> {
    Some(match format {
        Format::AwsAccessKeyId | Format::AwsSecretAccessKey => "sts.us-east-1.amazonaws.com",
        Format::GitHubToken => "api.github.com",
        Format::GitLabToken => "gitlab.com",
        Format::SlackToken | Format::SlackWebhook => "hooks.slack.com",
        Format::StripeKey => "api.stripe.com",
        Format::OpenAiKey => "api.openai.com",
        Format::AnthropicKey => "api.anthropic.com",
        Format::GoogleApiKey | Format::GoogleServiceAccount => "generativelanguage.googleapis.com",
        Format::PemPrivateKey | Format::OpenSshPrivateKey | Format::PgpPrivateKey | Format::Jwt => {
            return None
        }
    })
}

#[test]
fn every_home_pattern_parses_with_the_policy_matcher() {
    assert_eq!(home_parse_errors(), Vec::<String>::new());
    for f in Format::ALL {
        assert!(!f.as_str().is_empty());
    }
}

#[test]
fn each_format_passes_home_in_a_credential_header_and_nowhere_else() {
    let d = Detector::new();
    let allow = AllowList::new(&d, Vec::<String>::new());
    for format in Format::ALL {
        let f = find(&d, &testgen::value(format, 11), format);
        let refused = Decision::Exfiltration { format };
        // A bearer token (a JWT) passes in a credential header to any host; everything
        // else only to its home.
        let in_header = if format.is_bearer() {
            Decision::Bearer
        } else {
            refused
        };
        for elsewhere in [
            "evil.example",
            "api.github.com.evil.example",
            "paste.example.org",
        ] {
            assert_eq!(
                decide(&f, elsewhere, Place::CredentialHeader, &allow),
                in_header
            );
            for place in [
                Place::Path,
                Place::Query,
                Place::Body,
                Place::OtherHeader,
                Place::WebSocket,
                Place::DnsName,
            ] {
                if place.carries(format) && format.is_home(elsewhere) {
                    continue;
                }
                assert_eq!(decide(&f, elsewhere, place, &allow), refused, "{format:?}");
            }
        }
        match home_of(format) {
            Some(home) => {
                assert_eq!(
                    decide(&f, home, Place::CredentialHeader, &allow),
                    Decision::Home,
                    "{format:?}"
                );
                for place in [
                    Place::Body,
                    Place::OtherHeader,
                    Place::WebSocket,
                    Place::DnsName,
                ] {
                    assert_eq!(
                        decide(&f, home, place, &allow),
                        refused,
                        "{format:?} {place:?}"
                    );
                }
            }
            None => {
                for host in ["api.github.com", "api.openai.com", "s3.amazonaws.com"] {
                    assert_eq!(decide(&f, host, Place::CredentialHeader, &allow), in_header);
                }
            }
        }
    }
}

#[test]
fn home_hosts_follow_the_table() {
    let cases = [
        (Format::GitHubToken, "github.com", true),
        (Format::GitHubToken, "uploads.github.com", true),
        (Format::GitHubToken, "raw.githubusercontent.com", true),
        (Format::GitHubToken, "githubusercontent.com", false),
        (Format::GitHubToken, "notgithub.com", false),
        (Format::OpenAiKey, "api.openai.com", true),
        (Format::OpenAiKey, "openai.com", false),
        (Format::AnthropicKey, "api.anthropic.com", true),
        (Format::StripeKey, "api.stripe.com", true),
        (Format::StripeKey, "files.stripe.com", false),
        (Format::SlackToken, "slack.com", true),
        (Format::SlackToken, "acme.slack.com", true),
        (Format::GitLabToken, "gitlab.com", true),
        (Format::GitLabToken, "gitlab.example.com", false),
        (Format::GoogleApiKey, "maps.googleapis.com", true),
        (Format::GoogleApiKey, "googleapis.com", false),
        (Format::AwsAccessKeyId, "s3.eu-west-1.amazonaws.com", true),
        (
            Format::AwsAccessKeyId,
            "s3.cn-north-1.amazonaws.com.cn",
            true,
        ),
        (Format::AwsAccessKeyId, "amazonaws.com.evil.example", false),
        (Format::Jwt, "api.github.com", false),
        (Format::OpenSshPrivateKey, "github.com", false),
    ];
    for (format, host, home) in cases {
        assert_eq!(format.is_home(host), home, "{format:?} {host}");
    }
}

#[test]
fn query_and_path_carry_only_the_formats_that_use_them() {
    let d = Detector::new();
    let allow = AllowList::new(&d, Vec::<String>::new());
    let google = find(
        &d,
        &testgen::value(Format::GoogleApiKey, 1),
        Format::GoogleApiKey,
    );
    assert_eq!(
        decide(&google, "maps.googleapis.com", Place::Query, &allow),
        Decision::Home
    );
    let aws = find(
        &d,
        &testgen::value(Format::AwsAccessKeyId, 1),
        Format::AwsAccessKeyId,
    );
    assert_eq!(
        decide(&aws, "bucket.s3.amazonaws.com", Place::Query, &allow),
        Decision::Home
    );
    let hook = find(
        &d,
        &testgen::value(Format::SlackWebhook, 1),
        Format::SlackWebhook,
    );
    assert_eq!(
        decide(&hook, "hooks.slack.com", Place::Path, &allow),
        Decision::Home
    );
    let gh = find(
        &d,
        &testgen::value(Format::GitHubToken, 1),
        Format::GitHubToken,
    );
    let refused = Decision::Exfiltration {
        format: Format::GitHubToken,
    };
    assert_eq!(decide(&gh, "api.github.com", Place::Query, &allow), refused);
    assert_eq!(decide(&gh, "api.github.com", Place::Path, &allow), refused);
}

#[test]
fn aws_documentation_keys_are_allowed_everywhere_out_of_the_box() {
    let d = Detector::new();
    let allow = AllowList::new(&d, Vec::<String>::new());
    let text = format!("id={} secret={}", AWS_EXAMPLE_KEYS[0], AWS_EXAMPLE_KEYS[1]);
    let mut out = Findings::default();
    d.scan(text.as_bytes(), &mut out);
    assert_eq!(out.len(), 2);
    for f in out.iter() {
        assert_eq!(
            decide(f, "evil.example", Place::Body, &allow),
            Decision::Allowed
        );
    }
}

#[test]
fn dlp_allow_values_pass_and_others_of_the_same_format_do_not() {
    let d = Detector::new();
    let listed = testgen::value(Format::StripeKey, 5);
    let other = testgen::value(Format::StripeKey, 6);
    let allow = AllowList::new(&d, [listed.as_str()]);
    let f = find(&d, &listed, Format::StripeKey);
    assert_eq!(
        decide(&f, "evil.example", Place::Body, &allow),
        Decision::Allowed
    );
    // Found under an encoding, the decoded value is what is compared.
    let hex: String = listed.bytes().map(|b| format!("{b:02x}")).collect();
    let f = find(&d, &hex, Format::StripeKey);
    assert_eq!(
        decide(&f, "evil.example", Place::Body, &allow),
        Decision::Allowed
    );
    let f = find(&d, &other, Format::StripeKey);
    assert_eq!(
        decide(&f, "evil.example", Place::Body, &allow),
        Decision::Exfiltration {
            format: Format::StripeKey
        }
    );
    // The list shows no value.
    assert!(!format!("{allow:?}").contains(&listed[..12]));
}

#[test]
fn credential_headers_are_a_fixed_list() {
    for h in [
        "Authorization",
        "x-api-key",
        "X-Goog-Api-Key",
        "PRIVATE-TOKEN",
    ] {
        assert_eq!(Place::header(h), Place::CredentialHeader, "{h}");
    }
    for h in ["Proxy-Authorization", "Cookie", "X-Note", "User-Agent"] {
        assert_eq!(Place::header(h), Place::OtherHeader, "{h}");
    }
}

#[test]
fn exfiltration_is_a_403_deny_named_credential_exfiltration() {
    let e = Decision::Exfiltration {
        format: Format::Jwt,
    }
    .error_code();
    assert_eq!(e, Some(ErrorCode::CredentialExfiltration));
    let e = ErrorCode::CredentialExfiltration;
    assert_eq!(e.as_str(), "credential_exfiltration");
    assert_eq!(e.status(), http::StatusCode::FORBIDDEN);
    assert_eq!(e.verdict(), crate::record::Verdict::Deny);
    assert!(!e.retryable());
    assert_eq!(Decision::Home.error_code(), None);
}
