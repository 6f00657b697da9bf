//! The lines install owns in a shell start-up file: one block between markers. Adding it
//! replaces an older block in place; removing it leaves every other line as it was.

use super::layout::{ENV_BEGIN, ENV_END};

/// `text` with `block` (markers included) in it: replacing the current block, or appended.
pub fn with_block(text: &str, block: &str) -> String {
    let stripped = without_block(text);
    let mut out = stripped;
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    out.push_str(block);
    out
}

/// `text` with our block (and only it) removed.
pub fn without_block(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for line in text.split_inclusive('\n') {
        let bare = line.trim_end_matches(['\n', '\r']);
        if !inside && bare == ENV_BEGIN {
            inside = true;
        } else if inside && bare == ENV_END {
            inside = false;
        } else if !inside {
            out.push_str(line);
        }
    }
    out
}

/// Whether `text` holds exactly `block` once, with nothing of ours besides.
pub fn has_block(text: &str, block: &str) -> bool {
    text.matches(ENV_BEGIN).count() == 1 && text.contains(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(v: &str) -> String {
        format!("{ENV_BEGIN}\nexport X='{v}'\n{ENV_END}\n")
    }

    #[test]
    fn add_replace_and_remove_keep_the_owners_lines() {
        let mine = "# my profile\nexport PATH=\"$HOME/bin:$PATH\"";
        let once = with_block(mine, &block("a"));
        assert_eq!(once, format!("{mine}\n{}", block("a")));
        assert!(has_block(&once, &block("a")));
        assert!(!has_block(&once, &block("b")));
        let twice = with_block(&once, &block("b"));
        assert_eq!(twice, format!("{mine}\n{}", block("b")));
        assert_eq!(with_block(&twice, &block("b")), twice, "idempotent");
        assert_eq!(without_block(&twice), format!("{mine}\n"));
        assert_eq!(without_block(&block("a")), "");
        assert_eq!(with_block("", &block("a")), block("a"));
    }

    #[test]
    fn lines_after_the_block_survive_its_removal() {
        let text = format!("a\n{}b\n", block("x"));
        assert_eq!(without_block(&text), "a\nb\n");
    }
}
