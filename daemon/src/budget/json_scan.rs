//! Finds the top-level `usage` value of a JSON response as it streams by, in one pass over
//! the bytes with a few words of state: only that value is kept (at most
//! [`MAX_USAGE_BYTES`]) and parsed. A `"usage"` inside a string (escaped quotes) or deeper
//! in the document is not it.

use super::usage::{self, Usage};

/// The longest `usage` value kept; a longer one is not read (the response is estimated).
pub(crate) const MAX_USAGE_BYTES: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct JsonScan {
    depth: u32,
    in_str: bool,
    escaped: bool,
    /// The string being read at depth 1 (a possible key), its first bytes.
    key: Vec<u8>,
    /// The last string at depth 1 was `"usage"`: a `:` next makes it the key.
    after_usage_key: bool,
    /// `"usage":` seen: the next value is it.
    armed: bool,
    capture: Option<Vec<u8>>,
    /// The value kept was longer than [`MAX_USAGE_BYTES`].
    overflowed: bool,
    found: Option<Usage>,
}

impl JsonScan {
    /// Reads the next bytes of the body.
    pub(crate) fn feed(&mut self, data: &[u8]) {
        for &b in data {
            self.byte(b);
        }
    }

    /// What the body said, once it ended (a value still open is read as it is).
    pub(crate) fn finish(&mut self) -> Option<Usage> {
        if let Some(v) = self.capture.take() {
            self.take(&v);
        }
        self.found
    }

    fn take(&mut self, value: &[u8]) {
        if let Some(u) = usage::parse(value) {
            self.found.get_or_insert_with(Usage::default).merge(&u);
        }
    }

    fn byte(&mut self, b: u8) {
        let depth_before = self.depth;
        if self.armed && !self.in_str && !b.is_ascii_whitespace() && depth_before == 1 {
            self.armed = false;
            self.capture = Some(Vec::with_capacity(128));
        }
        if let Some(cap) = &mut self.capture {
            // A scalar value ends at the delimiter after it, outside any string.
            let scalar_end = !self.in_str
                && depth_before == 1
                && !cap.is_empty()
                && !matches!(cap[0], b'{' | b'[' | b'"')
                && matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\r' | b'\n');
            if scalar_end {
                let v = self.capture.take().unwrap_or_default();
                self.take(&v);
            } else if cap.len() < MAX_USAGE_BYTES {
                cap.push(b);
            } else {
                self.capture = None;
                self.overflowed = true;
            }
        }
        if self.in_str {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_str = false;
                if self.depth == 1 {
                    self.after_usage_key = self.key == b"usage";
                }
                self.string_ended();
            } else if self.depth == 1 && self.key.len() <= 8 {
                self.key.push(b);
            }
            return;
        }
        match b {
            b'"' => {
                self.in_str = true;
                self.key.clear();
            }
            b'{' | b'[' => self.depth = self.depth.saturating_add(1),
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 1 {
                    self.value_closed();
                }
            }
            b':' if self.depth == 1 => {
                self.armed = self.after_usage_key;
                self.after_usage_key = false;
            }
            b if b.is_ascii_whitespace() => {}
            _ => self.after_usage_key = false,
        }
    }

    /// A string closed: a captured string value is complete.
    fn string_ended(&mut self) {
        if self.depth == 1
            && self
                .capture
                .as_ref()
                .is_some_and(|c| c.first() == Some(&b'"'))
        {
            let v = self.capture.take().unwrap_or_default();
            self.take(&v);
        }
    }

    /// An object or array closed back at depth 1: a captured one is complete.
    fn value_closed(&mut self) {
        if self
            .capture
            .as_ref()
            .is_some_and(|c| matches!(c.first(), Some(b'{' | b'[')))
        {
            let v = self.capture.take().unwrap_or_default();
            self.take(&v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_split(body: &[u8], at: usize) -> Option<u64> {
        let mut s = JsonScan::default();
        s.feed(&body[..at]);
        s.feed(&body[at..]);
        s.finish().and_then(|u| u.tokens())
    }

    fn every_split(body: &[u8]) -> Option<u64> {
        let whole = scan_split(body, 0);
        for at in 0..=body.len() {
            assert_eq!(scan_split(body, at), whole, "split at {at}");
        }
        let mut bytewise = JsonScan::default();
        for b in body {
            bytewise.feed(std::slice::from_ref(b));
        }
        assert_eq!(bytewise.finish().and_then(|u| u.tokens()), whole);
        whole
    }

    #[test]
    fn openai_and_anthropic_bodies() {
        let openai = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"the \"usage\": {\"total_tokens\": 999} is not it"}}],"usage":{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}}"#;
        assert_eq!(every_split(openai), Some(21));
        let anthropic = br#"{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],"model":"claude","stop_reason":"end_turn","usage":{"input_tokens":25,"output_tokens":15}}"#;
        assert_eq!(every_split(anthropic), Some(40));
        let pretty = b"{\n  \"usage\" : {\n    \"total_tokens\" : 7\n  },\n  \"x\": 1\n}\n";
        assert_eq!(every_split(pretty), Some(7));
    }

    #[test]
    fn only_the_top_level_usage_counts() {
        let nested =
            br#"{"data":{"usage":{"total_tokens":5}},"meta":[{"usage":{"total_tokens":6}}]}"#;
        assert_eq!(every_split(nested), None);
        let null = br#"{"usage":null,"choices":[]}"#;
        assert_eq!(every_split(null), None);
        let value_named_usage = br#"{"kind":"usage","n":{"total_tokens":3}}"#;
        assert_eq!(every_split(value_named_usage), None);
        assert_eq!(every_split(b"not json at all"), None);
        assert_eq!(every_split(b""), None);
        assert_eq!(every_split(br#"[{"usage":{"total_tokens":1}}]"#), None);
    }

    #[test]
    fn a_huge_usage_value_is_not_kept() {
        let mut body = br#"{"usage":{"total_tokens":5,"pad":""#.to_vec();
        body.extend(std::iter::repeat_n(b'a', MAX_USAGE_BYTES * 2));
        body.extend_from_slice(br#""}}"#);
        let mut s = JsonScan::default();
        s.feed(&body);
        assert_eq!(s.finish(), None);
        assert!(s.overflowed);
    }
}
