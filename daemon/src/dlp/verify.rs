//! Verification of one candidate: given where a literal matched, is a credential really
//! there, and where does it end? Charset, length, boundaries, checksum and structure, each in
//! time bounded by the longest credential (never a scan to the end of the input).

use std::ops::Range;

use base64::Engine as _;

use super::checksum::github_checksum_ok;
use super::format::Format;
use super::marker::Marker;

/// How far after an AWS access key id its secret key is looked for.
const AWS_SECRET_WINDOW: usize = 256;
/// How far a service-account marker looks for its `private_key`.
const SERVICE_ACCOUNT_WINDOW: usize = 8 * 1024;
/// The longest PEM/OpenSSH/PGP block followed (an RSA-8192 key is about 6.5 KiB).
const PEM_MAX: usize = 16 * 1024;
/// Base64 characters a private-key block needs to count (a bare header in a document or a
/// regular expression is not a key).
const PEM_MIN_BODY: usize = 64;
/// The longest JWT part decoded to check its header.
const JWT_HEADER_MAX: usize = 2048;
/// The longest token followed for variable-length formats.
const TOKEN_MAX: usize = 512;

/// A verified credential in the scanned buffer.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Hit {
    pub format: Format,
    pub range: Range<usize>,
}

/// Verifies the candidate `marker` matched at `at..at + len` and emits what it finds (an
/// AWS key id may bring its secret key along).
pub(super) fn verify(
    marker: Marker,
    hay: &[u8],
    at: usize,
    len: usize,
    emit: &mut impl FnMut(Hit),
) {
    let hit = |format, range| Hit { format, range };
    match marker {
        Marker::AwsKeyId => {
            if let Some(end) = aws_key_id(hay, at) {
                emit(hit(Format::AwsAccessKeyId, at..end));
                let window = end..(end + AWS_SECRET_WINDOW).min(hay.len());
                if let Some(r) = aws_secret_in(hay, window) {
                    emit(hit(Format::AwsSecretAccessKey, r));
                }
            }
        }
        Marker::AwsSecretName => {
            if let Some(r) = aws_secret_after_name(hay, at + len) {
                emit(hit(Format::AwsSecretAccessKey, r));
            }
        }
        Marker::GitHubClassic => {
            if let Some(end) = github_classic(hay, at) {
                emit(hit(Format::GitHubToken, at..end));
            }
        }
        Marker::GitHubFineGrained => {
            if let Some(end) = github_fine_grained(hay, at, len) {
                emit(hit(Format::GitHubToken, at..end));
            }
        }
        Marker::GitLab => {
            if let Some(end) = gitlab(hay, at, len) {
                emit(hit(Format::GitLabToken, at..end));
            }
        }
        Marker::Slack => {
            if let Some(end) = slack(hay, at, len) {
                emit(hit(Format::SlackToken, at..end));
            }
        }
        Marker::SlackWebhook => {
            if let Some(end) = slack_webhook(hay, at + len) {
                emit(hit(Format::SlackWebhook, at..end));
            }
        }
        Marker::Stripe => {
            if left_boundary(hay, at) {
                let n = run(hay, at + len, TOKEN_MAX, is_alnum);
                if (24..=247).contains(&n) && mixed(&hay[at + len..at + len + n]) {
                    emit(hit(Format::StripeKey, at..at + len + n));
                }
            }
        }
        Marker::SkDash => {
            if let Some((format, end)) = sk_dash(hay, at) {
                emit(hit(format, at..end));
            }
        }
        Marker::GoogleApiKey => {
            if left_boundary(hay, at) && run(hay, at + 4, 36, is_url64) == 35 {
                emit(hit(Format::GoogleApiKey, at..at + 39));
            }
        }
        Marker::ServiceAccount => {
            if service_account(hay, at, len) {
                emit(hit(Format::GoogleServiceAccount, at..at + len));
            }
        }
        Marker::PemBegin => {
            if let Some((format, end)) = pem(hay, at, len) {
                emit(hit(format, at..end));
            }
        }
        Marker::Jwt => {
            if let Some(end) = jwt(hay, at) {
                emit(hit(Format::Jwt, at..end));
            }
        }
    }
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// base64url's alphabet, which most random tokens use.
fn is_url64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

fn is_std64(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'+' || b == b'/'
}

fn is_hex(b: u8) -> bool {
    b.is_ascii_hexdigit()
}

/// How many bytes from `from` satisfy `pred`, counting at most `max + 1` (so "longer than
/// max" is visible without walking further).
fn run(hay: &[u8], from: usize, max: usize, pred: fn(u8) -> bool) -> usize {
    hay.get(from..)
        .unwrap_or(&[])
        .iter()
        .take(max + 1)
        .take_while(|b| pred(**b))
        .count()
}

/// A token starts here: the byte before is not a letter or digit, or ends an escape (`%2F`,
/// `\n`, `\u0022`) that the raw text carries in front of it.
pub(super) fn left_boundary(hay: &[u8], at: usize) -> bool {
    let Some(&prev) = at.checked_sub(1).and_then(|i| hay.get(i)) else {
        return true;
    };
    if !prev.is_ascii_alphanumeric() {
        return true;
    }
    let before = &hay[..at];
    let n = before.len();
    (n >= 3 && before[n - 3] == b'%' && is_hex(before[n - 2]) && is_hex(before[n - 1]))
        || (n >= 2 && before[n - 2] == b'\\')
        || (n >= 6 && &before[n - 6..n - 4] == b"\\u" && before[n - 4..].iter().all(|b| is_hex(*b)))
}

/// At least two of: lower case, upper case, digit (random tokens; not a word or a number).
fn mixed(s: &[u8]) -> bool {
    let lower = s.iter().any(u8::is_ascii_lowercase);
    let upper = s.iter().any(u8::is_ascii_uppercase);
    let digit = s.iter().any(u8::is_ascii_digit);
    usize::from(lower) + usize::from(upper) + usize::from(digit) >= 2
}

fn aws_key_id(hay: &[u8], at: usize) -> Option<usize> {
    let ok = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit();
    let n = hay
        .get(at + 4..)?
        .iter()
        .take(17)
        .take_while(|b| ok(**b))
        .count();
    (left_boundary(hay, at) && n == 16 && !hay.get(at + 20).is_some_and(|b| is_alnum(*b)))
        .then_some(at + 20)
}

/// A 40-character secret key: exactly 40 of base64's standard alphabet between boundaries,
/// with upper and lower case (a hex digest is 40 characters too).
fn aws_secret_at(hay: &[u8], at: usize) -> Option<Range<usize>> {
    let n = run(hay, at, 40, is_std64);
    let end = at + n;
    let s = &hay[at..end];
    let after_ok = !hay.get(end).is_some_and(|b| *b == b'=' || is_url64(*b));
    let before_ok = at == 0 || !is_std64(hay[at - 1]);
    (n == 40
        && after_ok
        && before_ok
        && s.iter().any(u8::is_ascii_uppercase)
        && s.iter().any(u8::is_ascii_lowercase)
        && s.iter()
            .any(|b| b.is_ascii_digit() || *b == b'/' || *b == b'+'))
    .then_some(at..end)
}

fn aws_secret_in(hay: &[u8], window: Range<usize>) -> Option<Range<usize>> {
    let mut i = window.start;
    while i < window.end {
        if is_std64(hay[i]) {
            if let Some(r) = aws_secret_at(hay, i) {
                return Some(r);
            }
            i += run(hay, i, TOKEN_MAX, is_std64).max(1);
        } else {
            i += 1;
        }
    }
    None
}

/// After a name such as `aws_secret_access_key`: up to 16 bytes of quotes, `:`, `=`, `>`,
/// spaces or backslashes, then the key.
fn aws_secret_after_name(hay: &[u8], from: usize) -> Option<Range<usize>> {
    let sep = |b: u8| matches!(b, b'"' | b'\'' | b':' | b'=' | b'>' | b' ' | b'\t' | b'\\');
    let skip = run(hay, from, 16, sep);
    (skip <= 16)
        .then(|| aws_secret_at(hay, from + skip))
        .flatten()
}

/// `gh?_` + 30 random base62 + 6 base62 of their CRC32.
fn github_classic(hay: &[u8], at: usize) -> Option<usize> {
    let body = at + 4;
    if !left_boundary(hay, at)
        || run(hay, body, 36, is_alnum) != 36
        || hay.get(body + 36) == Some(&b'_')
    {
        return None;
    }
    github_checksum_ok(&hay[body..body + 30], &hay[body + 30..body + 36]).then_some(body + 36)
}

/// `github_pat_` + 22 base62 + `_` + 59 base62. GitHub documents no public checksum for
/// this form, so structure and length are what is checked.
fn github_fine_grained(hay: &[u8], at: usize, len: usize) -> Option<usize> {
    let a = at + len;
    let ok = left_boundary(hay, at)
        && run(hay, a, 22, is_alnum) == 22
        && hay.get(a + 22) == Some(&b'_')
        && run(hay, a + 23, 59, is_url64) == 59
        && mixed(&hay[a..a + 22]);
    ok.then_some(a + 82)
}

/// A GitLab prefix + 20 or more of base64url (and `.` in routable tokens), random-looking.
fn gitlab(hay: &[u8], at: usize, len: usize) -> Option<usize> {
    let ok = |b: u8| is_url64(b) || b == b'.';
    let from = at + len;
    let mut n = hay
        .get(from..)?
        .iter()
        .take(TOKEN_MAX + 1)
        .take_while(|b| ok(**b))
        .count();
    while n > 0 && hay[from + n - 1] == b'.' {
        n -= 1;
    }
    (left_boundary(hay, at) && (20..=TOKEN_MAX).contains(&n) && mixed(&hay[from..from + n]))
        .then_some(from + n)
}

/// `xox?-` + a number, `-`, then more `-`-separated parts: 20 or more characters.
fn slack(hay: &[u8], at: usize, len: usize) -> Option<usize> {
    let from = at + len;
    let ok = |b: u8| is_alnum(b) || b == b'-';
    let n = hay
        .get(from..)?
        .iter()
        .take(TOKEN_MAX + 1)
        .take_while(|b| ok(**b))
        .count();
    let s = &hay[from..from + n];
    let first = s.split(|b| *b == b'-').next().unwrap_or(&[]);
    let parts = s.split(|b| *b == b'-').filter(|p| !p.is_empty()).count();
    let good = left_boundary(hay, at)
        && (20..=TOKEN_MAX).contains(&n)
        && !first.is_empty()
        && first.iter().all(u8::is_ascii_digit)
        && parts >= 3
        && mixed(s);
    good.then_some(from + n)
}

/// After `hooks.slack.com/services/`: `T…/B…/` and a secret of 20 or more base62.
fn slack_webhook(hay: &[u8], from: usize) -> Option<usize> {
    let id = |b: u8| b.is_ascii_uppercase() || b.is_ascii_digit();
    let mut i = from;
    for lead in [b'T', b'B'] {
        if hay.get(i) != Some(&lead) {
            return None;
        }
        let n = run(hay, i + 1, 32, id);
        if !(6..=32).contains(&n) || hay.get(i + 1 + n) != Some(&b'/') {
            return None;
        }
        i += n + 2;
    }
    let n = run(hay, i, 64, is_alnum);
    (20..=64).contains(&n).then_some(i + n)
}

/// `sk-ant-<word><2 digits>-…` (Anthropic), else OpenAI: a key carrying `T3BlbkFJ`
/// (base64 of "OpenAI", in every key format OpenAI issued), or a project, service-account or
/// admin key of 40 or more characters.
fn sk_dash(hay: &[u8], at: usize) -> Option<(Format, usize)> {
    if !left_boundary(hay, at) {
        return None;
    }
    let from = at + 3;
    let n = run(hay, from, TOKEN_MAX, is_url64);
    if n > TOKEN_MAX {
        return None;
    }
    let s = &hay[from..from + n];
    if let Some(rest) = s.strip_prefix(b"ant-") {
        let word = rest.iter().take_while(|b| b.is_ascii_lowercase()).count();
        let digits = rest[word..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        let key = rest.get(word + digits + 1..).unwrap_or(&[]);
        let ok = word >= 3
            && digits == 2
            && rest.get(word + digits) == Some(&b'-')
            && key.len() >= 32
            && mixed(key);
        return ok.then_some((Format::AnthropicKey, from + n));
    }
    let marked = s.windows(8).any(|w| w == b"T3BlbkFJ");
    let typed = ["proj-", "svcacct-", "admin-"]
        .iter()
        .find_map(|p| s.strip_prefix(p.as_bytes()))
        .is_some_and(|k| k.len() >= 40 && mixed(k));
    ((marked && n >= 32) || typed).then_some((Format::OpenAiKey, from + n))
}

/// `service_account` as a JSON string value (`"…"`, or `\"…\"` inside another string) after
/// a `type` key, with a `private_key` field nearby: a service-account key file.
fn service_account(hay: &[u8], at: usize, len: usize) -> bool {
    let quoted_before = at >= 1 && hay[at - 1] == b'"';
    let end = at + len;
    let quoted_after =
        hay.get(end) == Some(&b'"') || hay.get(end..end + 2) == Some(b"\\\"".as_slice());
    if !quoted_before || !quoted_after {
        return false;
    }
    let before = &hay[at.saturating_sub(48)..at];
    if !before
        .windows(6)
        .any(|w| w == b"\"type\"" || w == b"\"type\\")
    {
        return false;
    }
    let lo = at.saturating_sub(SERVICE_ACCOUNT_WINDOW);
    let hi = (end + SERVICE_ACCOUNT_WINDOW).min(hay.len());
    hay[lo..hi].windows(11).any(|w| w == b"private_key")
}

/// `-----BEGIN <label>-----` whose label ends in `PRIVATE KEY` (or `PRIVATE KEY BLOCK`),
/// then a body of at least [`PEM_MIN_BODY`] base64 characters (line breaks raw or as the
/// JSON escapes `\n`, `\r`; PGP armor headers allowed), up to its `-----END …-----`.
fn pem(hay: &[u8], at: usize, len: usize) -> Option<(Format, usize)> {
    let mut i = at + len;
    if !matches!(hay.get(i), Some(b' ' | b'+')) {
        return None;
    }
    let label_start = i + 1;
    let label_len = run(hay, label_start, 40, |b| {
        b.is_ascii_uppercase() || b == b' ' || b == b'+'
    });
    let label: Vec<u8> = hay[label_start..label_start + label_len.min(40)]
        .iter()
        .map(|b| if *b == b'+' { b' ' } else { *b })
        .collect();
    i = label_start + label.len();
    if hay.get(i..i + 5) != Some(b"-----".as_slice()) {
        return None;
    }
    let format = match label.as_slice() {
        b"OPENSSH PRIVATE KEY" => Format::OpenSshPrivateKey,
        b"PGP PRIVATE KEY BLOCK" => Format::PgpPrivateKey,
        l if l.ends_with(b"PRIVATE KEY") => Format::PemPrivateKey,
        _ => return None,
    };
    i += 5;
    let limit = (at + PEM_MAX).min(hay.len());
    let mut body = 0usize;
    while i < limit {
        let b = hay[i];
        if b == b'-' {
            if hay[i..limit].starts_with(b"-----END") {
                let close = hay[i + 8..limit].windows(5).position(|w| w == b"-----");
                i = close.map_or(limit, |p| i + 8 + p + 5);
            }
            break;
        }
        if is_std64(b) || b == b'=' {
            body += 1;
        } else if !matches!(b, b'\n' | b'\r' | b' ' | b'\t' | b'\\' | b':' | b'.' | b',') {
            break;
        }
        i += 1;
    }
    (body >= PEM_MIN_BODY).then_some((format, i))
}

/// `eyJ…` `.` `…` `.` `…`: three base64url parts, the header a JSON object with an `alg`
/// member, the payload a JSON object, a signature of 16 or more characters (an unsigned
/// `alg: none` token is not a credential).
fn jwt(hay: &[u8], at: usize) -> Option<usize> {
    if !left_boundary(hay, at) {
        return None;
    }
    let h = run(hay, at, JWT_HEADER_MAX, is_url64);
    let p_at = at + h + 1;
    if !(10..=JWT_HEADER_MAX).contains(&h) || hay.get(at + h) != Some(&b'.') {
        return None;
    }
    let p = run(hay, p_at, 64 * 1024, is_url64);
    let s_at = p_at + p + 1;
    if p < 4 || hay.get(p_at + p) != Some(&b'.') || !hay[p_at..].starts_with(b"eyJ") {
        return None;
    }
    let s = run(hay, s_at, TOKEN_MAX * 2, is_url64);
    if s < 16 || hay.get(s_at + s) == Some(&b'.') {
        return None;
    }
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(&hay[at..at + h])
        .ok()?;
    let map: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header).ok()?;
    map.get("alg")
        .is_some_and(serde_json::Value::is_string)
        .then_some(s_at + s)
}
