//! curl, the agent's most common tool, as a test client.

use std::time::Duration;

#[derive(Debug)]
pub struct CurlOut {
    /// curl's exit code (0 = transfer done, whatever the HTTP status).
    pub exit: i32,
    pub status: u16,
    /// `1.1`, `2`...
    pub http_version: String,
    pub body: Vec<u8>,
    pub size_download: u64,
    pub stderr: String,
}

impl CurlOut {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }
}

/// Runs curl with `args`, never following its environment's proxy settings unless told.
/// `body_to_null` discards the body (large downloads) but still reports its size.
pub async fn curl(args: &[&str], body_to_null: bool) -> CurlOut {
    curl_as(&[], args, body_to_null).await
}

/// Runs curl under `prefix` (e.g. `setpriv --reuid=…` to act as the agent user). The body
/// comes back on stdout, so the agent needs no writable file of ours.
pub async fn curl_as(prefix: &[String], args: &[&str], body_to_null: bool) -> CurlOut {
    const MARK: &str = "\n@@agenshield-curl@@ ";
    let out = if body_to_null { "/dev/null" } else { "-" };
    let (program, pre) = match prefix.split_first() {
        Some((p, rest)) => (p.as_str(), rest.to_vec()),
        None => ("curl", Vec::new()),
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(&pre);
    if !prefix.is_empty() {
        cmd.arg("curl");
    }
    cmd.args(["-sS", "--max-time", "30", "-o", out])
        .args([
            "-w",
            &format!("{MARK}%{{http_code}} %{{http_version}} %{{size_download}}"),
        ])
        .args(args)
        .env_remove("http_proxy")
        .env_remove("https_proxy")
        .env_remove("HTTPS_PROXY")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy");
    let output = tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .expect("curl finished in time")
        .expect("curl runs (is it installed?)");
    let stdout = output.stdout;
    let mark = MARK.as_bytes();
    let split = stdout
        .windows(mark.len())
        .rposition(|w| w == mark)
        .unwrap_or(stdout.len());
    let body = stdout[..split].to_vec();
    let w =
        String::from_utf8_lossy(stdout.get(split + mark.len()..).unwrap_or_default()).into_owned();
    let mut parts = w.split_whitespace();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let http_version = parts.next().unwrap_or("").to_string();
    let size_download = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    CurlOut {
        exit: output.status.code().unwrap_or(-1),
        status,
        http_version,
        body,
        size_download,
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}
