//! The `usage` object of an OpenAI- or Anthropic-compatible response, and the tokens it
//! counts. Fields seen later overwrite earlier ones (an Anthropic stream says `input_tokens`
//! in `message_start` and a cumulative `output_tokens` in each `message_delta`; an OpenAI
//! stream says everything in its last chunk).

use serde::Deserialize;

/// The token counts a response reported; every field optional (the APIs differ).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct Usage {
    /// OpenAI (chat completions, responses, embeddings).
    pub total_tokens: Option<u64>,
    /// OpenAI chat completions.
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// Anthropic messages (and OpenAI responses, beside `total_tokens`).
    pub input_tokens: Option<u64>,
    pub output_tokens: Option<u64>,
}

impl Usage {
    /// Takes every field `later` reports.
    pub(crate) fn merge(&mut self, later: &Usage) {
        let take = |mine: &mut Option<u64>, theirs: Option<u64>| {
            if theirs.is_some() {
                *mine = theirs;
            }
        };
        take(&mut self.total_tokens, later.total_tokens);
        take(&mut self.prompt_tokens, later.prompt_tokens);
        take(&mut self.completion_tokens, later.completion_tokens);
        take(&mut self.input_tokens, later.input_tokens);
        take(&mut self.output_tokens, later.output_tokens);
    }

    /// The tokens it counts: `total_tokens`, else `prompt_tokens + completion_tokens`, else
    /// `input_tokens + output_tokens`; `None` when it reports none of them.
    pub(crate) fn tokens(&self) -> Option<u64> {
        if let Some(t) = self.total_tokens {
            return Some(t);
        }
        let sum = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        sum(self.prompt_tokens, self.completion_tokens)
            .or_else(|| sum(self.input_tokens, self.output_tokens))
    }
}

/// Parses a `usage` value (`null` and unreadable values read as nothing).
pub(crate) fn parse(value: &[u8]) -> Option<Usage> {
    serde_json::from_slice::<Option<Usage>>(value)
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_each_api() {
        let openai = parse(br#"{"prompt_tokens":9,"completion_tokens":12,"total_tokens":21}"#);
        assert_eq!(openai.and_then(|u| u.tokens()), Some(21));
        let no_total = parse(br#"{"prompt_tokens":9,"completion_tokens":12}"#);
        assert_eq!(no_total.and_then(|u| u.tokens()), Some(21));
        let anthropic = parse(
            br#"{"input_tokens":25,"output_tokens":15,"cache_read_input_tokens":0,"service_tier":"standard"}"#,
        );
        assert_eq!(anthropic.and_then(|u| u.tokens()), Some(40));
        assert_eq!(parse(b"null"), None);
        assert_eq!(parse(b"{}").and_then(|u| u.tokens()), None);
        assert_eq!(parse(br#"{"total_tokens":-1}"#), None);
        assert_eq!(parse(br#"{"total_tokens":1.5}"#), None);
        assert_eq!(parse(b"{"), None);
    }

    #[test]
    fn later_fields_overwrite() {
        let mut u = parse(br#"{"input_tokens":25,"output_tokens":1}"#).expect("start");
        u.merge(&parse(br#"{"output_tokens":7}"#).expect("delta"));
        u.merge(&parse(br#"{"output_tokens":15}"#).expect("delta"));
        assert_eq!(u.tokens(), Some(40));
    }
}
