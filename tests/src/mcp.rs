//! A real MCP server and client for the MCP-aware rules' tests (`tests/tests/e2e/mcp.rs`):
//! the official Python SDK (`mcp` from PyPI) in the venv `.ci/run` creates, running
//! `tests/mcp/server.py` (three tools over Streamable HTTP, on a loopback port it picks) and
//! `tests/mcp/client.py` (a session through the proxy named by `HTTP_PROXY`).

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Where `.ci/run` creates the venv (`AGENSHIELD_MCP_VENV` overrides it; `.ci/run` sets it).
pub const DEFAULT_VENV: &str = "/opt/agenshield-mcp-venv";

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp")
}

/// The venv's python with the SDK importable, or why not: a skip, or a failure under CI
/// (which creates it).
pub fn python() -> Result<PathBuf, String> {
    let venv = std::env::var_os("AGENSHIELD_MCP_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(DEFAULT_VENV));
    let python = venv.join("bin/python");
    let ok = Command::new(&python)
        .args(["-c", "import mcp, uvicorn"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        return Ok(python);
    }
    let why = format!(
        "skipped: needs the MCP Python SDK in {} (.ci/run creates it: python3 -m venv, pip install mcp)",
        venv.display()
    );
    assert!(std::env::var("CI").as_deref() != Ok("true"), "{why}");
    Err(why)
}

/// How the server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// Streamable HTTP, answers as SSE (the SDK's default).
    StreamableSse,
    /// Streamable HTTP, answers as JSON.
    StreamableJson,
    /// The older HTTP+SSE transport (`/sse`, then POSTs to the endpoint it announces).
    HttpSse,
}

impl Transport {
    /// The URL a client opens on `port`.
    pub fn url(self, port: u16) -> String {
        match self {
            Transport::HttpSse => format!("http://mcp.test:{port}/sse"),
            _ => format!("http://mcp.test:{port}/mcp"),
        }
    }
}

/// `tests/mcp/server.py` running, killed on drop.
pub struct McpServer {
    child: Child,
    pub addr: SocketAddr,
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl McpServer {
    /// The server: Streamable HTTP answering POSTs with SSE, or with JSON, or the older
    /// HTTP+SSE transport.
    pub fn start(python: &Path, transport: Transport) -> McpServer {
        let mut cmd = Command::new(python);
        cmd.arg("-W").arg("ignore").arg(scripts().join("server.py"));
        match transport {
            Transport::StreamableSse => {}
            Transport::StreamableJson => {
                cmd.arg("--json");
            }
            Transport::HttpSse => {
                cmd.arg("--sse");
            }
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn the MCP server");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let port: u16 = match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(line) => line.trim().parse().expect("the server prints its port"),
            Err(_) => {
                let _ = child.kill();
                panic!("the MCP server did not start within 30 s");
            }
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Bounded wait for the listener to accept.
        for _ in 0..100 {
            if std::net::TcpStream::connect(addr).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        McpServer { child, addr }
    }
}

/// One client session through the proxy at `proxy` (`http://IP:PORT`) to the server on
/// `port`: the tools listed, then each call (`NAME=JSON_ARGS`). The client's JSON report.
pub async fn session(
    python: &Path,
    proxy: &str,
    transport: Transport,
    port: u16,
    calls: &[&str],
) -> serde_json::Value {
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg("-W").arg("ignore").arg(scripts().join("client.py"));
    if transport == Transport::HttpSse {
        cmd.arg("--sse");
    }
    let out = cmd
        .arg(transport.url(port))
        .args(calls)
        .env("HTTP_PROXY", proxy)
        .env("http_proxy", proxy)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .env_remove("ALL_PROXY")
        .env_remove("all_proxy")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(90), out)
        .await
        .expect("the MCP client finished within 90 s")
        .expect("run the MCP client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the MCP client failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("client report ({e}): {stdout}"))
}
