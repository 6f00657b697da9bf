//! The hosts where the agent's clients recently refused our leaf (`client_rejected_ca`
//! connection records in the audit log): each is a tool that does not trust the CA.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use super::finding::{Area, Finding};

/// One host's refusals in the window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejections {
    /// The SNI (or the host, without one) and port.
    pub host: String,
    pub port: u64,
    pub count: u64,
    /// The last one's `time`.
    pub last: String,
    pub agent_uids: Vec<u64>,
}

/// What reading the log found.
#[derive(Debug)]
pub struct Scan {
    pub hosts: Vec<Rejections>,
    pub files: usize,
}

/// The `client_rejected_ca` records newer than `since` in `files` (a rotation set, oldest
/// first), grouped by host, most refused first. A file last written before the window is
/// not read.
pub fn scan(files: &[PathBuf], since: Duration, now: SystemTime) -> std::io::Result<Scan> {
    let cutoff = now.checked_sub(since).unwrap_or(SystemTime::UNIX_EPOCH);
    let cutoff_dt = OffsetDateTime::from(cutoff);
    let mut by_host: BTreeMap<(String, u64), Rejections> = BTreeMap::new();
    let mut read = 0;
    for f in files {
        match std::fs::metadata(f).and_then(|m| m.modified()) {
            Ok(m) if m < cutoff => continue,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(with_path(f, e)),
        }
        let file = std::fs::File::open(f).map_err(|e| with_path(f, e))?;
        read += 1;
        for line in BufReader::new(file).split(b'\n') {
            let line = line.map_err(|e| with_path(f, e))?;
            if memchr::memmem::find(&line, b"client_rejected_ca").is_none() {
                continue;
            }
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&line) else {
                continue;
            };
            if v["error_code"] != "client_rejected_ca" {
                continue;
            }
            let Some(at) = v["time"].as_str() else {
                continue;
            };
            if OffsetDateTime::parse(at, &Rfc3339).map_or(true, |t| t < cutoff_dt) {
                continue;
            }
            // A `repeated` record counts the refusals after the one written in full, over
            // any hosts (a sample of which it names): with one host, they are that host's.
            let repeated = v["kind"] == "repeated";
            let (host, port, count, last) = if repeated {
                let hosts: Vec<&str> = v["hosts"]
                    .as_array()
                    .map(|a| a.iter().filter_map(|h| h.as_str()).collect())
                    .unwrap_or_default();
                let host = match hosts.as_slice() {
                    [one] => one.to_string(),
                    [] => "(hosts not named)".to_string(),
                    many => format!("several hosts ({})", many.join(", ")),
                };
                let port = by_host
                    .keys()
                    .find(|(h, _)| *h == host)
                    .map_or(0, |(_, p)| *p);
                let count = v["count"].as_u64().unwrap_or(1);
                (
                    host,
                    port,
                    count,
                    v["last"].as_str().unwrap_or(at).to_string(),
                )
            } else {
                let host = v["sni"]
                    .as_str()
                    .or(v["host"].as_str())
                    .unwrap_or("?")
                    .to_string();
                (host, v["port"].as_u64().unwrap_or(0), 1, at.to_string())
            };
            let r = by_host
                .entry((host.clone(), port))
                .or_insert_with(|| Rejections {
                    host,
                    port,
                    count: 0,
                    last: String::new(),
                    agent_uids: Vec::new(),
                });
            r.count += count;
            if last > r.last {
                r.last = last;
            }
            if let Some(uid) = v["agent_uid"].as_u64() {
                if !r.agent_uids.contains(&uid) {
                    r.agent_uids.push(uid);
                }
            }
        }
    }
    let mut hosts: Vec<Rejections> = by_host.into_values().collect();
    hosts.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.host.cmp(&b.host)));
    Ok(Scan { hosts, files: read })
}

/// `24h`, `7d`, or humantime's spelling for what is not whole hours.
fn window(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        _ if s >= 172_800 && s.is_multiple_of(86_400) => format!("{}d", s / 86_400),
        _ if s >= 3_600 && s.is_multiple_of(3_600) => format!("{}h", s / 3_600),
        _ => humantime::format_duration(d).to_string(),
    }
}

fn with_path(p: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", p.display()))
}

/// The findings: a warning per host, or one line saying there were none.
pub fn findings(scan: std::io::Result<Scan>, since: Duration) -> Vec<Finding> {
    let window = window(since);
    let scan = match scan {
        Ok(s) => s,
        Err(e) => {
            return vec![Finding::skipped(
                Area::RejectedCa,
                "audit log",
                format!("cannot read it: {e}"),
            )]
        }
    };
    if scan.hosts.is_empty() {
        return vec![Finding::ok(
            Area::RejectedCa,
            "audit log",
            format!(
                "no client refused the CA in the last {window} ({} file(s) read)",
                scan.files
            ),
        )];
    }
    scan.hosts
        .iter()
        .map(|r| {
            Finding::warn(
                Area::RejectedCa,
                format!("{}:{}", r.host, r.port),
                format!(
                    "{} handshake(s) refused our leaf in the last {window}, the last at {} \
                     (agent uid {})",
                    r.count,
                    r.last,
                    r.agent_uids
                        .iter()
                        .map(u64::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(format!(
                    "the tool that connects to {} does not trust the CA: see the runtime checks \
                     above; if it pins certificates or has its roots compiled in, allow the host \
                     with `tls = \"passthrough\"` (no paths, secrets or leak checks for it)",
                    r.host
                )),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_in_the_window_are_grouped_by_host() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("audit.jsonl");
        let rec = |time: &str, sni: &str, code: &str| {
            format!(
                "{{\"v\":2,\"time\":\"{time}\",\"kind\":\"connection\",\"protocol\":\"tls\",\
                 \"agent_uid\":5200,\"sni\":\"{sni}\",\"host\":\"{sni}\",\"port\":443,\
                 \"error_code\":\"{code}\"}}\n"
            )
        };
        let now = SystemTime::now();
        let fmt = |t: SystemTime| OffsetDateTime::from(t).format(&Rfc3339).expect("format");
        let recent = fmt(now - Duration::from_secs(60));
        let old = fmt(now - Duration::from_secs(3 * 86_400));
        let text = [
            rec(&old, "old.example", "client_rejected_ca"),
            rec(&recent, "a.example", "client_rejected_ca"),
            rec(&recent, "b.example", "client_rejected_ca"),
            rec(&recent, "a.example", "client_rejected_ca"),
            rec(&recent, "c.example", "tls_handshake_failed"),
            // The audit's count of the refusals after a.example's within its window.
            format!(
                "{{\"v\":2,\"time\":\"{recent}\",\"kind\":\"repeated\",\"agent_uid\":5200,\
                 \"error_code\":\"client_rejected_ca\",\"count\":3,\"last\":\"{recent}\",\
                 \"hosts\":[\"a.example\"]}}\n"
            ),
            "not json client_rejected_ca\n".into(),
        ]
        .concat();
        std::fs::write(&log, text).expect("write");
        let s = scan(
            &[log.clone(), dir.path().join("gone")],
            Duration::from_secs(86_400),
            now,
        )
        .expect("scan");
        assert_eq!(s.files, 1);
        let got: Vec<(&str, u64)> = s.hosts.iter().map(|r| (r.host.as_str(), r.count)).collect();
        assert_eq!(got, vec![("a.example", 5), ("b.example", 1)]);
        assert_eq!(s.hosts[0].agent_uids, vec![5200]);
        let f = findings(Ok(s), Duration::from_secs(86_400));
        assert_eq!(f[0].subject, "a.example:443");
        assert!(
            f[0].detail
                .starts_with("5 handshake(s) refused our leaf in the last 24h"),
            "{}",
            f[0].detail
        );
        // A file not written in the window is not read at all.
        let later = now + Duration::from_secs(10 * 86_400);
        let s = scan(&[log], Duration::from_secs(86_400), later).expect("scan");
        assert_eq!((s.files, s.hosts.len()), (0, 0));
    }
}
