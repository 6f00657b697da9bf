//! Test values: real-looking credentials of every format, generated from a seeded random
//! source (checksum-valid where the format has one). None is a real key.

use base64::Engine as _;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::checksum::github_checksum;
use super::format::Format;

pub(super) const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
pub(super) const URL64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const STD64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE32: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

pub(super) fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

pub(super) fn pick(rng: &mut StdRng, alphabet: &[u8], n: usize) -> String {
    (0..n)
        .map(|_| char::from(alphabet[rng.random_range(0..alphabet.len())]))
        .collect()
}

/// Random characters with at least one upper case letter, one lower case and one digit.
fn mixed(rng: &mut StdRng, alphabet: &[u8], n: usize) -> String {
    loop {
        let s = pick(rng, alphabet, n);
        let ok = s.bytes().any(|b| b.is_ascii_uppercase())
            && s.bytes().any(|b| b.is_ascii_lowercase())
            && s.bytes().any(|b| b.is_ascii_digit());
        if ok {
            return s;
        }
    }
}

pub(super) fn github_token(rng: &mut StdRng, prefix: &str) -> String {
    let random = pick(rng, BASE62, 30);
    let check = github_checksum(random.as_bytes());
    format!("{prefix}{random}{}", String::from_utf8_lossy(&check))
}

fn wrapped_base64(bytes: &[u8], width: usize) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
    b64.as_bytes()
        .chunks(width)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect::<Vec<_>>()
        .join("\n")
}

fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.random()).collect()
}

pub(super) fn pem_key(rng: &mut StdRng, label: &str) -> String {
    let der = random_bytes(rng, 600);
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        wrapped_base64(&der, 64)
    )
}

pub(super) fn jwt(rng: &mut StdRng) -> String {
    let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = e.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let payload = format!(
        r#"{{"sub":"{}","iat":{},"scope":"repo"}}"#,
        pick(rng, BASE62, 12),
        rng.random_range(1_600_000_000u64..1_800_000_000)
    );
    let sig = pick(rng, URL64, 43);
    format!("{header}.{}.{sig}", e.encode(payload))
}

/// One generated value per format (a service-account file also holds a PEM key).
pub(super) fn value(format: Format, seed: u64) -> String {
    let r = &mut rng(seed);
    match format {
        Format::AwsAccessKeyId => format!("AKIA{}", pick(r, BASE32, 16)),
        Format::AwsSecretAccessKey => {
            // Found beside its key id.
            format!("AKIA{} {}", pick(r, BASE32, 16), mixed(r, STD64, 40))
        }
        Format::GitHubToken => {
            let prefix = ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"][r.random_range(0..5)];
            github_token(r, prefix)
        }
        Format::GitLabToken => format!("glpat-{}", mixed(r, URL64, 20)),
        Format::SlackToken => format!(
            "xoxb-{}-{}-{}",
            pick(r, b"0123456789", 12),
            pick(r, b"0123456789", 13),
            mixed(r, BASE62, 24)
        ),
        Format::SlackWebhook => format!(
            "https://hooks.slack.com/services/T{}/B{}/{}",
            pick(r, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 8),
            pick(r, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 10),
            mixed(r, BASE62, 24)
        ),
        Format::StripeKey => format!("sk_live_{}", mixed(r, BASE62, 99)),
        Format::OpenAiKey => format!(
            "sk-proj-{}T3BlbkFJ{}",
            mixed(r, URL64, 74),
            mixed(r, URL64, 74)
        ),
        Format::AnthropicKey => format!("sk-ant-api03-{}AA", mixed(r, URL64, 93)),
        Format::GoogleApiKey => format!("AIza{}", mixed(r, URL64, 35)),
        Format::GoogleServiceAccount => {
            let key = pem_key(r, "PRIVATE KEY");
            serde_json::json!({
                "type": "service_account",
                "project_id": format!("demo-{}", pick(r, b"0123456789", 6)),
                "private_key_id": pick(r, b"0123456789abcdef", 40),
                "private_key": key,
                "client_email": "robot@demo.iam.gserviceaccount.com",
                "token_uri": "https://oauth2.googleapis.com/token"
            })
            .to_string()
        }
        Format::PemPrivateKey => pem_key(r, "RSA PRIVATE KEY"),
        Format::OpenSshPrivateKey => {
            let mut body = b"openssh-key-v1\0".to_vec();
            body.extend(random_bytes(r, 400));
            format!(
                "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
                wrapped_base64(&body, 70)
            )
        }
        Format::PgpPrivateKey => format!(
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: test\n\n{}\n={}\n-----END PGP PRIVATE KEY BLOCK-----\n",
            wrapped_base64(&random_bytes(r, 500), 64),
            pick(r, STD64, 4)
        ),
        Format::Jwt => jwt(r),
    }
}

/// The encodings a value is hidden under in the tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Wrap {
    Raw,
    /// Every byte as `%XX`.
    PercentAll,
    /// Everything but letters and digits as `%XX` (what a form encoder does).
    PercentForm,
    /// Every character as `\u00XX`.
    JsonUnicode,
    /// `serde_json` string escaping (`\n`, `\"`), then `/` as `\/`.
    JsonSlashes,
    Base64,
    Base64Url,
    Hex,
}

pub(super) const WRAPS: [Wrap; 8] = [
    Wrap::Raw,
    Wrap::PercentAll,
    Wrap::PercentForm,
    Wrap::JsonUnicode,
    Wrap::JsonSlashes,
    Wrap::Base64,
    Wrap::Base64Url,
    Wrap::Hex,
];

/// `value` hidden under `wrap`, in a small realistic frame.
pub(super) fn wrap(value: &str, wrap: Wrap) -> String {
    match wrap {
        Wrap::Raw => format!("{{\"note\": \"please use {value} for this\"}}"),
        Wrap::PercentAll => {
            let enc: String = value.bytes().map(|b| format!("%{b:02X}")).collect();
            format!("/v1/items?token={enc}&page=2")
        }
        Wrap::PercentForm => {
            let enc =
                percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC);
            format!("name=build&secret={enc}&submit=1")
        }
        Wrap::JsonUnicode => {
            let enc: String = value
                .chars()
                .map(|c| format!("\\u{:04x}", u32::from(c)))
                .collect();
            format!("{{\"config\": \"{enc}\", \"n\": 1}}")
        }
        Wrap::JsonSlashes => {
            let s = serde_json::to_string(value)
                .unwrap_or_default()
                .replace('/', "\\/");
            format!("{{\"config\": {s}}}")
        }
        Wrap::Base64 => format!(
            "data: {}\n",
            base64::engine::general_purpose::STANDARD.encode(format!("token={value}\n"))
        ),
        Wrap::Base64Url => format!(
            "/upload/{}?x=1",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("key: {value}"))
        ),
        Wrap::Hex => {
            let enc: String = value.bytes().map(|b| format!("{b:02x}")).collect();
            format!("payload={enc}&v=2")
        }
    }
}
