//! A client with compiled-in roots, as apps built on rustls + webpki-roots are: it reads no CA
//! variable and no system store, trusting only the CA file named on its command line (the
//! compat suite's stand-in for the compiled-in list). Through the proxy it works only where
//! a `tls = "passthrough"` rule passes its TLS through unopened.
//!
//! Usage: pinned-get HOST PORT CA_FILE PATH → prints the response's status line.

use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, host, port, ca, path] = &args[..] else {
        eprintln!("usage: pinned-get HOST PORT CA_FILE PATH");
        std::process::exit(2);
    };
    if let Err(e) = run(host, port, ca, path).await {
        eprintln!("pinned-get: {e}");
        std::process::exit(1);
    }
}

async fn run(
    host: &str,
    port: &str,
    ca: &str,
    path: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca)? {
        roots.add(cert?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(format!("{host}:{port}")).await?;
    let name = ServerName::try_from(host.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(name, tcp)
        .await?;
    let ask = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    tls.write_all(ask.as_bytes()).await?;
    let mut out = Vec::new();
    let _ = tls.read_to_end(&mut out).await;
    println!(
        "{}",
        String::from_utf8_lossy(&out).lines().next().unwrap_or("")
    );
    Ok(())
}
