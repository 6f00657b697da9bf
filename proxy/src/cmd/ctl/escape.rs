//! Text from the daemon, made safe for the operator's terminal. A path, a host, a rule id or
//! a stored fetch error can carry ESC sequences, C1 controls (U+009B is a one-character CSI)
//! or bidi overrides that would rewrite what the operator reads: hide a line, move the
//! cursor, show `/etc/passwd` reversed into something harmless. Every human rendering goes
//! through here (`print`, `tail`, error lines), so no renderer can forget; `--json` output
//! is never touched and stays exact.
//!
//! Escaped: every control character (general category Cc: C0, DEL, C1), every format
//! character (Cf: the bidi embeddings, overrides and isolates U+202A..U+202E and
//! U+2066..U+2069, marks, zero-width characters, the BOM, tags…) and the line and paragraph
//! separators U+2028 and U+2029, shown as `\n`, `\r`, `\t`, `\x1b` or `\u{202e}`.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde_json::Value;
use unicode_general_category::{get_general_category, GeneralCategory};

fn unsafe_char(c: char) -> bool {
    // Printable ASCII is by far the common case; skip the table for it.
    if (' '..='~').contains(&c) {
        return false;
    }
    matches!(
        get_general_category(c),
        GeneralCategory::Control
            | GeneralCategory::Format
            | GeneralCategory::LineSeparator
            | GeneralCategory::ParagraphSeparator
    )
}

fn push_escaped(out: &mut String, c: char) {
    let _ = match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        '\0'..='\u{ff}' => write!(out, "\\x{:02x}", u32::from(c)),
        _ => write!(out, "\\u{{{:x}}}", u32::from(c)),
    };
}

/// `text` with every character a terminal would act on or reorder by shown as an escape;
/// borrowed when there is none (the common case). One field stays on one line.
pub(crate) fn escape(text: &str) -> Cow<'_, str> {
    let Some(first) = text.find(unsafe_char) else {
        return Cow::Borrowed(text);
    };
    let mut out = String::with_capacity(text.len() + 8);
    out.push_str(&text[..first]);
    for c in text[first..].chars() {
        if unsafe_char(c) {
            push_escaped(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A rendered block whose line breaks are the renderer's own: each line escaped, the `\n`
/// between lines kept.
pub(crate) fn escape_lines(text: &str) -> Cow<'_, str> {
    if !text.contains(|c| c != '\n' && unsafe_char(c)) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(text.split('\n').map(escape).collect::<Vec<_>>().join("\n"))
}

/// A copy of `v` with every string in it, object keys included, escaped: what the human
/// renderers read, so a field printed by any of them is safe and stays on its line.
pub(crate) fn escape_value(v: &Value) -> Value {
    match v {
        Value::String(s) => Value::String(escape(s).into_owned()),
        Value::Array(items) => Value::Array(items.iter().map(escape_value).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, x)| (escape(k).into_owned(), escape_value(x)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// What a human renderer shows of `v`: it reads the escaped value, and whatever it returns is
/// escaped once more (its own line breaks kept). The one way ctl renders for a person.
pub(crate) fn render_safely(v: &Value, render: impl Fn(&Value) -> String) -> String {
    let shown = render(&escape_value(v));
    escape_lines(&shown).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bidi_overrides_and_isolates_are_shown_escaped() {
        assert_eq!(escape("/a\u{202e}txt.exe"), "/a\\u{202e}txt.exe");
        for c in ['\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}'] {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", c as u32));
        }
        for c in ['\u{2066}', '\u{2067}', '\u{2068}', '\u{2069}'] {
            assert_eq!(escape(&c.to_string()), format!("\\u{{{:x}}}", c as u32));
        }
        // Other format characters: marks, zero-width, BOM, a tag character.
        assert_eq!(
            escape("a\u{200e}\u{200f}\u{200b}\u{feff}\u{e0041}b"),
            "a\\u{200e}\\u{200f}\\u{200b}\\u{feff}\\u{e0041}b"
        );
    }

    #[test]
    fn c0_del_and_c1_controls_are_shown_escaped() {
        assert_eq!(
            escape("\x1b[2J\x1b]0;pwned\x07"),
            "\\x1b[2J\\x1b]0;pwned\\x07"
        );
        assert_eq!(escape("a\u{7f}b"), "a\\x7fb");
        // U+009B is CSI on its own; U+0085 is NEL, a line break for some terminals.
        assert_eq!(escape("\u{9b}31m\u{85}\u{80}"), "\\x9b31m\\x85\\x80");
        assert_eq!(escape("one\ntwo\r\tthree\0"), "one\\ntwo\\r\\tthree\\x00");
        assert_eq!(escape("x\u{2028}y\u{2029}"), "x\\u{2028}y\\u{2029}");
    }

    #[test]
    fn ordinary_text_is_borrowed_unchanged() {
        for s in [
            "",
            "GET https://api.example.com/repos/a?b=c",
            "café.example 日本語 пример ✓ \\u{202e} stays as typed",
            "emoji 🙂 and combining e\u{301}",
        ] {
            assert!(matches!(escape(s), Cow::Borrowed(t) if t == s), "{s}");
        }
    }

    #[test]
    fn escaping_is_idempotent() {
        let once = escape("\x1b\u{202e}\u{9b}\n").into_owned();
        assert_eq!(escape(&once), once);
    }

    #[test]
    fn lines_keep_their_breaks_and_lose_everything_else() {
        assert_eq!(escape_lines("a\nb"), "a\nb");
        assert_eq!(
            escape_lines("ID p1\nrow \x1b[31mred\u{202e}\r"),
            "ID p1\nrow \\x1b[31mred\\u{202e}\\r"
        );
    }

    #[test]
    fn values_are_escaped_everywhere_numbers_untouched() {
        let v = serde_json::json!({
            "path": "/\u{202e}x",
            "list": ["ok", "\x1b[0m"],
            "nested": {"k\u{9b}": 5, "n": null, "b": true},
        });
        assert_eq!(
            escape_value(&v),
            serde_json::json!({
                "path": "/\\u{202e}x",
                "list": ["ok", "\\x1b[0m"],
                "nested": {"k\\x9b": 5, "n": null, "b": true},
            })
        );
    }
}
