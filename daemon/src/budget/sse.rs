//! Reads the usage out of a `text/event-stream` response as it streams by: lines are cut at
//! their end (LF or CRLF), each kept only up to [`MAX_LINE_BYTES`], and only a `data:` line
//! that names `"usage"` is parsed. The events that carry usage:
//!
//! - OpenAI chat completions (`stream_options.include_usage`): the last chunk, `{"usage":
//!   {...}}` (earlier chunks say `"usage": null`);
//! - OpenAI responses: `response.completed`, `{"response": {"usage": {...}}}`;
//! - Anthropic messages: `message_start`, `{"message": {"usage": {"input_tokens": ...}}}`,
//!   then `message_delta`, `{"usage": {"output_tokens": ...}}` (cumulative).

use serde_json::Value;

use super::usage::Usage;

/// The longest line kept; the rest of a longer one is skipped (it is never a usage event).
pub(crate) const MAX_LINE_BYTES: usize = 64 * 1024;

#[derive(Debug, Default)]
pub(crate) struct SseScan {
    line: Vec<u8>,
    /// The current line outgrew [`MAX_LINE_BYTES`]: skip to its end.
    skipping: bool,
    found: Option<Usage>,
    /// Lines skipped for their length (for tests and debugging).
    pub(crate) skipped: u64,
}

impl SseScan {
    /// Reads the next bytes of the stream.
    pub(crate) fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let end = memchr::memchr(b'\n', data);
            let (part, rest) = match end {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (data, &data[data.len()..]),
            };
            if !self.skipping {
                if self.line.len() + part.len() > MAX_LINE_BYTES {
                    self.skipping = true;
                    self.skipped += 1;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if end.is_some() {
                self.line_ended();
            }
            data = rest;
        }
    }

    /// What the stream said, once it ended (a last line without its line end is read too).
    pub(crate) fn finish(&mut self) -> Option<Usage> {
        self.line_ended();
        self.found
    }

    fn line_ended(&mut self) {
        if !self.skipping {
            let line = std::mem::take(&mut self.line);
            self.read_line(&line);
            self.line = line;
        }
        self.line.clear();
        self.skipping = false;
    }

    fn read_line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        if memchr::memmem::find(payload, b"\"usage\"").is_none() {
            return;
        }
        let Ok(event) = serde_json::from_slice::<Value>(payload) else {
            return;
        };
        for at in [
            event.get("usage"),
            event.get("message").and_then(|m| m.get("usage")),
            event.get("response").and_then(|r| r.get("usage")),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(u) = serde_json::from_value::<Option<Usage>>(at.clone())
                .ok()
                .flatten()
            {
                self.found.get_or_insert_with(Usage::default).merge(&u);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const OPENAI: &str = "data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c1\",\"choices\":[{\"delta\":{\"content\":\"lo \\\"usage\\\"\"}}],\"usage\":null}\n\n\
data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4,\"total_tokens\":15}}\n\n\
data: [DONE]\n\n";

    const ANTHROPIC: &str = "event: message_start\r\n\
data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":25,\"output_tokens\":1}}}\r\n\r\n\
event: content_block_delta\r\n\
data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\r\n\r\n\
event: message_delta\r\n\
data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":15}}\r\n\r\n\
event: message_stop\r\n\
data: {\"type\":\"message_stop\"}\r\n\r\n";

    fn tokens(stream: &[u8], at: usize) -> Option<u64> {
        let mut s = SseScan::default();
        s.feed(&stream[..at]);
        s.feed(&stream[at..]);
        s.finish().and_then(|u| u.tokens())
    }

    #[test]
    fn openai_and_anthropic_streams_at_every_split() {
        for (stream, want) in [(OPENAI, 15), (ANTHROPIC, 40)] {
            for at in 0..=stream.len() {
                assert_eq!(tokens(stream.as_bytes(), at), Some(want), "split at {at}");
            }
        }
        let responses = "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":4,\"total_tokens\":7}}}";
        assert_eq!(tokens(responses.as_bytes(), 10), Some(7));
    }

    #[test]
    fn streams_without_usage_and_overlong_lines() {
        let none = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(tokens(none.as_bytes(), 5), None);
        let mut long = b"data: {\"usage\":{\"total_tokens\":5},\"pad\":\"".to_vec();
        long.extend(std::iter::repeat_n(b'a', MAX_LINE_BYTES));
        long.extend_from_slice(b"\"}\n\ndata: {\"usage\":{\"total_tokens\":9}}\n\n");
        let mut s = SseScan::default();
        for chunk in long.chunks(1000) {
            s.feed(chunk);
        }
        assert_eq!(s.finish().and_then(|u| u.tokens()), Some(9));
        assert_eq!(s.skipped, 1);
        assert!(s.line.capacity() <= MAX_LINE_BYTES * 2);
    }
}
