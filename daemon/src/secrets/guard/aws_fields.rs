//! Credentials an AWS response hands out, redacted on the way to the agent. Under a `sigv4`
//! rule the proxy signs with keys the agent never holds; an API that answers with fresh
//! credentials (STS, SSO, Cognito, ECR, Redshift), whether the rule allowed the call or an
//! object stored them, would give the agent keys no redaction knows. The values of these
//! fields, in XML (`<SessionToken>…</SessionToken>`) and JSON (`"sessionToken": "…"`), any
//! case, become `[redacted]` as the body streams.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::body::{BodyError, ProxyBody};

/// Field names whose values are credentials (compared ignoring ASCII case).
const FIELDS: [&str; 6] = [
    "SecretAccessKey",
    "SecretKey",
    "SessionToken",
    "AuthorizationToken",
    "DbPassword",
    "Password",
];
const LONGEST: usize = 15;
const REDACTED: &[u8] = b"[redacted]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Looking for `<Field>` or `"Field"`.
    Text,
    /// After `"Field"`: whitespace, then `:`.
    Colon,
    /// After `"Field":`: whitespace, then the opening quote of a string value.
    Quote,
    /// Inside a value, dropped up to `end` (`<` for XML, `"` for JSON).
    Value { end: u8, escaped: bool },
}

/// The redacting state over one stream.
#[derive(Debug)]
pub(crate) struct FieldScanner {
    state: State,
    /// Text not decided yet: it may be the start of `<Field>` or `"Field"`.
    held: Vec<u8>,
    /// Values replaced so far.
    pub(crate) redacted: usize,
}

impl Default for FieldScanner {
    fn default() -> Self {
        FieldScanner {
            state: State::Text,
            held: Vec::new(),
            redacted: 0,
        }
    }
}

/// Whether `rest` (after an opening `<` or `"`) is a field name and its closer: `Some(n)`,
/// its length with the closer; `None`: it is not; `Err(())`: not enough bytes to tell.
fn field_at(rest: &[u8], closer: u8) -> Result<Option<usize>, ()> {
    let mut undecided = false;
    for f in FIELDS {
        let f = f.as_bytes();
        let n = f.len();
        match rest.get(..=n) {
            Some(got) => {
                if got[..n].eq_ignore_ascii_case(f) && got[n] == closer {
                    return Ok(Some(n + 1));
                }
            }
            None => {
                let have = rest.len().min(n);
                if rest[..have].eq_ignore_ascii_case(&f[..have]) {
                    undecided = true;
                }
            }
        }
    }
    if undecided {
        Err(())
    } else {
        Ok(None)
    }
}

impl FieldScanner {
    /// Scans `input` after what was held; appends what can go on to `out`. At the end of the
    /// stream (`last`), whatever was held goes on.
    pub(crate) fn feed(&mut self, input: &[u8], last: bool, out: &mut BytesMut) {
        let mut buf = std::mem::take(&mut self.held);
        buf.extend_from_slice(input);
        let mut i = 0;
        while i < buf.len() {
            let b = buf[i];
            match self.state {
                State::Text => {
                    if b != b'<' && b != b'"' {
                        out.extend_from_slice(&[b]);
                        i += 1;
                        continue;
                    }
                    let closer = if b == b'<' { b'>' } else { b'"' };
                    match field_at(&buf[i + 1..], closer) {
                        Ok(Some(n)) => {
                            out.extend_from_slice(&buf[i..=i + n]);
                            i += n + 1;
                            self.state = if b == b'<' {
                                self.redacted += 1;
                                out.extend_from_slice(REDACTED);
                                State::Value {
                                    end: b'<',
                                    escaped: false,
                                }
                            } else {
                                State::Colon
                            };
                        }
                        Ok(None) => {
                            out.extend_from_slice(&[b]);
                            i += 1;
                        }
                        Err(()) if last => {
                            out.extend_from_slice(&buf[i..]);
                            i = buf.len();
                        }
                        Err(()) => {
                            debug_assert!(buf.len() - i <= LONGEST + 2);
                            self.held = buf[i..].to_vec();
                            return;
                        }
                    }
                }
                State::Colon | State::Quote if b.is_ascii_whitespace() => {
                    out.extend_from_slice(&[b]);
                    i += 1;
                }
                State::Colon if b == b':' => {
                    out.extend_from_slice(&[b]);
                    i += 1;
                    self.state = State::Quote;
                }
                State::Quote if b == b'"' => {
                    out.extend_from_slice(&[b]);
                    out.extend_from_slice(REDACTED);
                    self.redacted += 1;
                    i += 1;
                    self.state = State::Value {
                        end: b'"',
                        escaped: false,
                    };
                }
                // Not a string value after all (a number, null, an object): text again.
                State::Colon | State::Quote => self.state = State::Text,
                State::Value { end, escaped } => {
                    i += 1;
                    if escaped {
                        self.state = State::Value {
                            end,
                            escaped: false,
                        };
                    } else if end == b'"' && b == b'\\' {
                        self.state = State::Value { end, escaped: true };
                    } else if b == end {
                        out.extend_from_slice(&[b]);
                        self.state = State::Text;
                    }
                }
            }
        }
    }
}

/// A response body with credential fields redacted as it streams.
pub(crate) struct FieldsRedacted {
    inner: ProxyBody,
    scanner: FieldScanner,
    done: bool,
}

impl FieldsRedacted {
    pub(crate) fn new(inner: ProxyBody) -> FieldsRedacted {
        FieldsRedacted {
            inner,
            scanner: FieldScanner::default(),
            done: false,
        }
    }
}

impl Body for FieldsRedacted {
    type Data = Bytes;
    type Error = BodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BodyError>>> {
        let this = &mut *self;
        loop {
            if this.done {
                return Poll::Ready(None);
            }
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(f))) => {
                    let f = match f.into_data() {
                        Ok(data) => {
                            let mut out = BytesMut::with_capacity(data.len());
                            this.scanner.feed(&data, false, &mut out);
                            if out.is_empty() {
                                continue;
                            }
                            Frame::data(out.freeze())
                        }
                        Err(f) => f,
                    };
                    return Poll::Ready(Some(Ok(f)));
                }
                Poll::Ready(None) => {
                    this.done = true;
                    let mut out = BytesMut::new();
                    this.scanner.feed(&[], true, &mut out);
                    if this.scanner.redacted > 0 {
                        tracing::info!(
                            fields = this.scanner.redacted,
                            "AWS response: credential fields redacted"
                        );
                    }
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out.freeze()))));
                    }
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(chunks: &[&str]) -> String {
        let mut s = FieldScanner::default();
        let mut out = BytesMut::new();
        for c in chunks {
            s.feed(c.as_bytes(), false, &mut out);
        }
        s.feed(&[], true, &mut out);
        String::from_utf8_lossy(&out).into_owned()
    }

    const STS_XML: &str =
        "<GetSessionTokenResult><Credentials><AccessKeyId>ASIAEXAMPLE</AccessKeyId>\
<SecretAccessKey>wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY</SecretAccessKey>\
<SessionToken>FwoGZXIvYXdzEXAMPLETOKEN+/==</SessionToken>\
<Expiration>2026-11-27T20:00:00Z</Expiration></Credentials></GetSessionTokenResult>";

    #[test]
    fn credentials_in_xml_and_json_are_redacted_split_anywhere() {
        let want_xml = "<GetSessionTokenResult><Credentials><AccessKeyId>ASIAEXAMPLE</AccessKeyId>\
<SecretAccessKey>[redacted]</SecretAccessKey>\
<SessionToken>[redacted]</SessionToken>\
<Expiration>2026-11-27T20:00:00Z</Expiration></Credentials></GetSessionTokenResult>";
        for i in 0..=STS_XML.len() {
            assert_eq!(
                run(&[&STS_XML[..i], &STS_XML[i..]]),
                want_xml,
                "split at {i}"
            );
        }
        let json = r#"{"roleCredentials": {"accessKeyId": "ASIA", "secretAccessKey" : "abc\"def/ghi", "sessionToken":"tok", "expiration": 123}, "SecretKey": null}"#;
        let want = r#"{"roleCredentials": {"accessKeyId": "ASIA", "secretAccessKey" : "[redacted]", "sessionToken":"[redacted]", "expiration": 123}, "SecretKey": null}"#;
        for i in 0..=json.len() {
            assert_eq!(run(&[&json[..i], &json[i..]]), want, "split at {i}");
        }
        // Look-alikes stay.
        let plain =
            r#"<SecretAccessKeyId>x</SecretAccessKeyId> "SessionTokens": "y" <Session>z</Session>"#;
        assert_eq!(run(&[plain]), plain);
        assert_eq!(run(&["ends in <Sess"]), "ends in <Sess");
    }
}
