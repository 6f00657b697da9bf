//! Credentials for the DLP tests (`tests/tests/e2e/dlp.rs`): one real-looking value per
//! format, generated from a fixed seed (checksum-valid where the format has one; the same
//! shapes as the daemon's `dlp/testgen.rs`), the request positions a value is put in, and a
//! small raw HTTP/1.1 client over a TLS stream (so every byte of the request is the test's).
//! None of these values is a real key.

use base64::Engine as _;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BASE62: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
const URL64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const STD64: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const BASE32: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
const DIGITS: &[u8] = b"0123456789";

/// A small deterministic generator (xorshift64*): the values are the same on every run.
pub struct Gen(u64);

impl Gen {
    pub fn new(seed: u64) -> Gen {
        Gen(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick(&mut self, alphabet: &[u8], n: usize) -> String {
        (0..n)
            .map(|_| char::from(alphabet[self.below(alphabet.len())]))
            .collect()
    }

    /// With at least one upper case letter, one lower case and one digit.
    pub fn mixed(&mut self, alphabet: &[u8], n: usize) -> String {
        loop {
            let s = self.pick(alphabet, n);
            if s.bytes().any(|b| b.is_ascii_uppercase())
                && s.bytes().any(|b| b.is_ascii_lowercase())
                && s.bytes().any(|b| b.is_ascii_digit())
            {
                return s;
            }
        }
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// A credential format: its name as records and refusals give it, a home host (mapped to
/// the loopback upstream in the tests) where it has one.
#[derive(Debug, Clone, Copy)]
pub struct Format {
    pub name: &'static str,
    pub home: Option<&'static str>,
}

pub const FORMATS: [Format; 15] = [
    Format {
        name: "aws_access_key_id",
        home: Some("sts.amazonaws.com"),
    },
    Format {
        name: "aws_secret_access_key",
        home: Some("sts.amazonaws.com"),
    },
    Format {
        name: "github_token",
        home: Some("api.github.com"),
    },
    Format {
        name: "gitlab_token",
        home: Some("gitlab.com"),
    },
    Format {
        name: "slack_token",
        home: Some("slack.com"),
    },
    Format {
        name: "slack_webhook",
        home: Some("hooks.slack.com"),
    },
    Format {
        name: "stripe_key",
        home: Some("api.stripe.com"),
    },
    Format {
        name: "openai_key",
        home: Some("api.openai.com"),
    },
    Format {
        name: "anthropic_key",
        home: Some("api.anthropic.com"),
    },
    Format {
        name: "google_api_key",
        home: Some("generativelanguage.googleapis.com"),
    },
    // A key file carries a private key, which has no home: refused everywhere.
    Format {
        name: "google_service_account",
        home: None,
    },
    Format {
        name: "pem_private_key",
        home: None,
    },
    Format {
        name: "openssh_private_key",
        home: None,
    },
    Format {
        name: "pgp_private_key",
        home: None,
    },
    Format {
        name: "jwt",
        home: None,
    },
];

/// Every home host, for the upstream's certificate and the daemon's name map.
pub fn home_hosts() -> Vec<&'static str> {
    let mut hosts: Vec<&str> = FORMATS.iter().filter_map(|f| f.home).collect();
    hosts.sort();
    hosts.dedup();
    hosts
}

/// GitHub's checksum: CRC32 of the 30 random characters, 6 base62 digits.
fn github_token(g: &mut Gen, prefix: &str) -> String {
    let random = g.pick(BASE62, 30);
    let mut n = crc32fast::hash(random.as_bytes());
    let mut check = [b'0'; 6];
    for slot in check.iter_mut().rev() {
        *slot = BASE62[(n % 62) as usize];
        n /= 62;
    }
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

fn pem(g: &mut Gen, label: &str) -> String {
    let der = g.bytes(600);
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        wrapped_base64(&der, 64)
    )
}

/// One generated value of the format named `name`.
pub fn value(name: &str, seed: u64) -> String {
    let g = &mut Gen::new(seed);
    match name {
        "aws_access_key_id" => format!("AKIA{}", g.pick(BASE32, 16)),
        "aws_secret_access_key" => format!("AKIA{} {}", g.pick(BASE32, 16), g.mixed(STD64, 40)),
        "github_token" => {
            let prefix = ["ghp_", "gho_", "ghu_", "ghs_", "ghr_"][g.below(5)];
            github_token(g, prefix)
        }
        "gitlab_token" => format!("glpat-{}", g.mixed(URL64, 20)),
        "slack_token" => format!(
            "xoxb-{}-{}-{}",
            g.pick(DIGITS, 12),
            g.pick(DIGITS, 13),
            g.mixed(BASE62, 24)
        ),
        "slack_webhook" => format!(
            "https://hooks.slack.com/services/T{}/B{}/{}",
            g.pick(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 8),
            g.pick(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", 10),
            g.mixed(BASE62, 24)
        ),
        "stripe_key" => format!("sk_live_{}", g.mixed(BASE62, 99)),
        "openai_key" => format!("sk-proj-{}T3BlbkFJ{}", g.mixed(URL64, 74), g.mixed(URL64, 74)),
        "anthropic_key" => format!("sk-ant-api03-{}AA", g.mixed(URL64, 93)),
        "google_api_key" => format!("AIza{}", g.mixed(URL64, 35)),
        "google_service_account" => {
            let key = pem(g, "PRIVATE KEY");
            serde_json::json!({
                "type": "service_account",
                "project_id": format!("demo-{}", g.pick(DIGITS, 6)),
                "private_key_id": g.pick(b"0123456789abcdef", 40),
                "private_key": key,
                "client_email": "robot@demo.iam.gserviceaccount.com",
                "token_uri": "https://oauth2.googleapis.com/token"
            })
            .to_string()
        }
        "pem_private_key" => pem(g, "RSA PRIVATE KEY"),
        "openssh_private_key" => {
            let mut body = b"openssh-key-v1\0".to_vec();
            body.extend(g.bytes(400));
            format!(
                "-----BEGIN OPENSSH PRIVATE KEY-----\n{}\n-----END OPENSSH PRIVATE KEY-----\n",
                wrapped_base64(&body, 70)
            )
        }
        "pgp_private_key" => format!(
            "-----BEGIN PGP PRIVATE KEY BLOCK-----\nComment: test\n\n{}\n={}\n-----END PGP PRIVATE KEY BLOCK-----\n",
            wrapped_base64(&g.bytes(500), 64),
            g.pick(STD64, 4)
        ),
        "jwt" => {
            let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
            let header = e.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
            let payload = format!(
                r#"{{"sub":"{}","iat":{},"scope":"repo"}}"#,
                g.pick(BASE62, 12),
                1_700_000_000 + g.below(100_000_000)
            );
            format!("{header}.{}.{}", e.encode(payload), g.pick(URL64, 43))
        }
        other => panic!("no generator for {other}"),
    }
}

/// A value as a header may carry it: line breaks written as `\n` (which the detector reads
/// as the line breaks of a key block).
pub fn header_safe(v: &str) -> String {
    v.replace('\n', "\\n")
}

/// A request as the raw client sends it.
pub struct RawRequest {
    pub method: &'static str,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawRequest {
    pub fn get(path: impl Into<String>) -> RawRequest {
        RawRequest {
            method: "GET",
            path: path.into(),
            headers: Vec::new(),
            body: Vec::new(),
        }
    }

    pub fn post(path: impl Into<String>, content_type: &str, body: Vec<u8>) -> RawRequest {
        RawRequest {
            method: "POST",
            path: path.into(),
            headers: vec![("Content-Type".into(), content_type.into())],
            body,
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> RawRequest {
        self.headers.push((name.into(), value.into()));
        self
    }

    fn bytes(&self, host: &str) -> Vec<u8> {
        let mut out = format!("{} {} HTTP/1.1\r\nHost: {host}\r\n", self.method, self.path);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        if self.method != "GET" || !self.body.is_empty() {
            out.push_str(&format!("Content-Length: {}\r\n", self.body.len()));
        }
        out.push_str("Connection: close\r\n\r\n");
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

/// A response: its status and body.
pub struct RawResponse {
    pub status: u16,
    pub body: String,
}

/// Sends `req` over `stream` (HTTP/1.1, `Connection: close`) and reads the response whole.
pub async fn send<S>(mut stream: S, host: &str, req: &RawRequest) -> RawResponse
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    // The proxy may answer (a refusal) before the body is all written: ignore a failed write.
    let _ = stream.write_all(&req.bytes(host)).await;
    let _ = stream.flush().await;
    let mut buf = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(20),
        stream.read_to_end(&mut buf),
    )
    .await;
    let _ = read;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    RawResponse { status, body }
}
