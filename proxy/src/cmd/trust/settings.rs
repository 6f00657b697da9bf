//! Reading one setting out of the small configuration files tools keep their CA bundle in:
//! `/etc/environment` (`export SSL_CERT_FILE="…"`), npmrc (`cafile=…`), pip.conf
//! (`cert = …`), gitconfig (`sslCAInfo = …`), wgetrc (`ca_certificate = …`), curlrc
//! (`cacert "…"`, `--cacert=…`). Sections are not tracked: the keys we look for are unique
//! to their file.

/// Every `(key, value)` among `keys` (matched without regard to case) in `text`, in order.
/// A key is followed by `=`, `:` or white space; values lose one pair of quotes. Comments
/// (`#`, `;`) and other lines are skipped.
pub fn settings<'t, 'k>(
    text: &'t str,
    keys: &'k [&'k str],
) -> impl Iterator<Item = (&'k str, &'t str)> + use<'t, 'k> {
    text.lines().filter_map(move |line| setting_of(line, keys))
}

/// The value of the last of `keys` set in `text` (later lines override earlier ones, as in
/// every one of these formats).
pub fn last_setting<'t>(text: &'t str, keys: &[&str]) -> Option<&'t str> {
    text.lines()
        .filter_map(|line| setting_of(line, keys).map(|(_, v)| v))
        .next_back()
}

fn setting_of<'t, 'k>(line: &'t str, keys: &'k [&'k str]) -> Option<(&'k str, &'t str)> {
    let line = line.trim();
    if line.starts_with(['#', ';']) {
        return None;
    }
    let line = line.strip_prefix("export ").unwrap_or(line);
    let line = line.strip_prefix("--").unwrap_or(line);
    keys.iter().find_map(|key| {
        let head = line.get(..key.len())?;
        if !head.eq_ignore_ascii_case(key) {
            return None;
        }
        let rest = &line[key.len()..];
        if !rest.starts_with(|c: char| c == '=' || c == ':' || c.is_whitespace()) {
            return None;
        }
        let value = rest.trim_start().trim_start_matches(['=', ':']).trim();
        (!value.is_empty()).then(|| (*key, unquote(value)))
    })
}

fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_files_syntax_is_read() {
        let cases = [
            (
                "export SSL_CERT_FILE=\"/a b.pem\"\n",
                "SSL_CERT_FILE",
                "/a b.pem",
            ),
            ("cafile=/etc/npm.pem\n", "cafile", "/etc/npm.pem"),
            ("[global]\ncert = /etc/pip.pem\n", "cert", "/etc/pip.pem"),
            ("[http]\n\tsslCAInfo = /g.pem\n", "sslcainfo", "/g.pem"),
            ("ca_certificate = /w.pem\n", "ca_certificate", "/w.pem"),
            ("cacert \"/c.pem\"\n", "cacert", "/c.pem"),
            ("--cacert=/d.pem\n", "cacert", "/d.pem"),
            ("cacert: '/e.pem'\n", "cacert", "/e.pem"),
        ];
        for (text, key, want) in cases {
            assert_eq!(last_setting(text, &[key]), Some(want), "{text:?}");
        }
    }

    #[test]
    fn comments_longer_keys_and_empty_values_are_not_settings() {
        let text = "# cafile=/x\n; cafile=/y\ncafile_other=/z\ncertificate = /q\ncafile=\n";
        assert_eq!(last_setting(text, &["cafile", "cert"]), None);
    }

    #[test]
    fn the_last_setting_wins() {
        let text = "ca_certificate = /first.pem\nca_certificate = /second.pem\n";
        assert_eq!(last_setting(text, &["ca_certificate"]), Some("/second.pem"));
    }
}
