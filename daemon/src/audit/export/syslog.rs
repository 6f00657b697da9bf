//! RFC 5424 messages, octet-counted for a stream (RFC 6587 §3.4.1, which RFC 5425 uses
//! over TLS too): `LEN SP <PRI>1 TIMESTAMP HOSTNAME APP-NAME PROCID MSGID [SD] MSG`.
//!
//! The record goes in MSG untouched (format `agenshield`: the log's own line, so a shipped
//! copy verifies with `ctl audit verify` as the local one does); what the receiver needs to
//! tell hosts and records apart goes around it: the host id as HOSTNAME and in the
//! structured data, with the record's `seq`; its `kind` as MSGID; its `time` as TIMESTAMP.

/// Facility 13 (log audit), severity 6 (informational).
const PRI: u8 = 13 * 8 + 6;
/// The SD-ID of our element: RFC 5612's documentation enterprise number, until we own one.
const SD_ID: &str = "agenshield@32473";
const APP_NAME: &str = "agenshield";

/// Frames records for one sink: what is the same for every record (the host id, escaped
/// once) is kept, and one header buffer is reused, so a record costs its copy into the
/// batch and a few appends.
pub(crate) struct Framer {
    host_id: String,
    host_sd: String,
    procid: u32,
    head: Vec<u8>,
}

impl Framer {
    pub(crate) fn new(host_id: &str, procid: u32) -> Framer {
        Framer {
            host_id: host_id.to_string(),
            host_sd: sd_escape(host_id),
            procid,
            head: Vec::with_capacity(256),
        }
    }

    /// Appends one framed message carrying `msg` to `out`: the record's `time` as
    /// TIMESTAMP (`-` unless RFC 5424 takes it), its `kind` as MSGID, its `seq` in the
    /// structured data.
    pub(crate) fn frame(
        &mut self,
        out: &mut Vec<u8>,
        time: Option<&str>,
        kind: Option<&str>,
        seq: Option<u64>,
        msg: &[u8],
    ) {
        use std::io::Write as _;
        let head = &mut self.head;
        head.clear();
        // Writing into a Vec cannot fail.
        let _ = write!(
            head,
            "<{PRI}>1 {} {} {APP_NAME} {} {} [{SD_ID} host_id=\"{}\"",
            time.filter(|t| timestamp_ok(t)).unwrap_or("-"),
            self.host_id,
            self.procid,
            kind.filter(|k| msgid_ok(k)).unwrap_or("-"),
            self.host_sd,
        );
        if let Some(seq) = seq {
            let _ = write!(head, " seq=\"{seq}\"");
        }
        head.extend_from_slice(b"] ");
        let _ = write!(out, "{} ", head.len() + msg.len());
        out.extend_from_slice(head);
        out.extend_from_slice(msg);
    }
}

/// A TIMESTAMP as RFC 5424 takes it (the writer's RFC 3339 UTC with milliseconds is one).
fn timestamp_ok(t: &str) -> bool {
    t.len() <= 32
        && t.bytes()
            .all(|b| b.is_ascii_digit() || b"-:.TZ+".contains(&b))
        && t.contains('T')
}

/// A MSGID: 1-32 printable US-ASCII characters.
fn msgid_ok(k: &str) -> bool {
    (1..=32).contains(&k.len()) && k.bytes().all(|b| (33..=126).contains(&b))
}

/// A PARAM-VALUE: `"`, `\` and `]` escaped.
fn sd_escape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '"' | '\\' | ']') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The host id when the config gives none: `/etc/machine-id`, else the host name (Linux's), else
/// `-` (RFC 5424's nil value).
pub(crate) fn default_host_id() -> String {
    let from_file = std::fs::read_to_string("/etc/machine-id")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| crate::config::valid_host_id(s));
    if let Some(id) = from_file {
        return id;
    }
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .map(|h| h.trim().to_string())
        .find(|h| crate::config::valid_host_id(h))
        .unwrap_or_else(|| "-".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_framed_with_its_length_and_left_untouched() {
        let line =
            br#"{"v":2,"seq":7,"time":"2026-12-07T02:37:20.123Z","kind":"request","x":"]\""}"#;
        let mut out = Vec::new();
        let mut framer = Framer::new("h-1", 42);
        framer.frame(
            &mut out,
            Some("2026-12-07T02:37:20.123Z"),
            Some("request"),
            Some(7),
            line,
        );
        let text = String::from_utf8(out).expect("utf8");
        let (len, msg) = text.split_once(' ').expect("length");
        assert_eq!(len.parse::<usize>().expect("number"), msg.len());
        assert_eq!(
            msg,
            format!(
                "<110>1 2026-12-07T02:37:20.123Z h-1 agenshield 42 request \
                 [agenshield@32473 host_id=\"h-1\" seq=\"7\"] {}",
                std::str::from_utf8(line).expect("utf8")
            )
        );
        // The buffer is reused: a second record is framed as the first was.
        let mut again = Vec::new();
        framer.frame(
            &mut again,
            Some("2026-12-07T02:37:20.123Z"),
            Some("request"),
            Some(7),
            line,
        );
        assert_eq!(again, text.as_bytes());
        let mut out = Vec::new();
        Framer::new("a\"b", 1).frame(&mut out, Some("not a time"), Some("a kind"), None, b"x");
        let text = String::from_utf8(out).expect("utf8");
        assert!(
            text.contains("<110>1 - a\"b agenshield 1 - [agenshield@32473 host_id=\"a\\\"b\"] x"),
            "{text}"
        );
    }
}
