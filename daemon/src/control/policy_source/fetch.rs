//! Fetching a bundle and its signature: `https://` with a conditional GET (`If-None-Match`
//! with the ETag of the bundle in force) over our rustls, one connection per fetch, or
//! `file://` (a mounted volume; its "ETag" is the file's size, time and inode). Every read is
//! capped while it happens (a `Content-Length` over the cap is refused before the body), and
//! the whole fetch has a deadline.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{header, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls_pki_types::ServerName;

use crate::config::BundleUrl;

/// A signature is a few hundred bytes; more is not one.
const MAX_SIGNATURE: u64 = 16 * 1024;

/// What a fetch found.
#[derive(Debug)]
pub(super) enum Fetched {
    /// The bundle has the ETag asked with (HTTP 304, or an unchanged file).
    NotModified,
    New {
        bundle: Vec<u8>,
        signature: Vec<u8>,
        etag: Option<String>,
    },
}

/// Why a fetch failed.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    /// The source could not be reached or did not serve the file: a sync failure, no record.
    #[error("{0}")]
    Unreachable(String),
    /// Over the cap: the bundle is refused (and recorded). `etag`: the one it was served with.
    #[error("the {what} is larger than {max} bytes")]
    TooLarge {
        what: &'static str,
        max: u64,
        etag: Option<String>,
    },
}

pub(super) struct Fetcher {
    url: BundleUrl,
    tls: Arc<ClientConfig>,
    max: u64,
    timeout: Duration,
}

impl Fetcher {
    pub(super) fn new(
        url: BundleUrl,
        mut tls: ClientConfig,
        max: u64,
        timeout: Duration,
    ) -> Fetcher {
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Fetcher {
            url,
            tls: Arc::new(tls),
            max,
            timeout,
        }
    }

    /// Fetches the bundle unless its ETag is `etag`, then its signature.
    pub(super) async fn fetch(&self, etag: Option<&str>) -> Result<Fetched, FetchError> {
        let work = async {
            match &self.url {
                BundleUrl::Https(url) => self.https(url, etag).await,
                BundleUrl::File(path) => self.file(path, etag).await,
            }
        };
        tokio::time::timeout(self.timeout, work)
            .await
            .unwrap_or_else(|_| {
                Err(FetchError::Unreachable(format!(
                    "no answer within {:?}",
                    self.timeout
                )))
            })
    }

    async fn https(&self, url: &url::Url, etag: Option<&str>) -> Result<Fetched, FetchError> {
        let got = self.get(url, etag, self.max, "bundle").await?;
        let Some((bundle, new_etag)) = got else {
            return Ok(Fetched::NotModified);
        };
        let sig_url = url::Url::parse(&format!("{url}.minisig"))
            .map_err(|e| FetchError::Unreachable(format!("the signature's URL: {e}")))?;
        let (signature, _) = self
            .get(&sig_url, None, MAX_SIGNATURE, "signature")
            .await?
            .ok_or_else(|| FetchError::Unreachable("the signature answered 304".into()))?;
        Ok(Fetched::New {
            bundle,
            signature,
            etag: new_etag,
        })
    }

    /// One GET: `None` for 304, else the body and its ETag.
    async fn get(
        &self,
        url: &url::Url,
        etag: Option<&str>,
        max: u64,
        what: &'static str,
    ) -> Result<Option<(Vec<u8>, Option<String>)>, FetchError> {
        let unreachable =
            |e: &dyn std::fmt::Display| FetchError::Unreachable(format!("{url}: {e}"));
        let host = url.host_str().ok_or_else(|| unreachable(&"no host"))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = match bare.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((bare, port))
                .await
                .map_err(|e| unreachable(&e))?
                .collect(),
        };
        let tcp = tokio::net::TcpStream::connect(&addrs[..])
            .await
            .map_err(|e| unreachable(&e))?;
        let name = ServerName::try_from(bare.to_string()).map_err(|e| unreachable(&e))?;
        let tls = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| unreachable(&format!("TLS: {e}")))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| unreachable(&e))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let authority = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let path = match url.query() {
            Some(q) => format!("{}?{q}", url.path()),
            None => url.path().to_string(),
        };
        let mut req = Request::get(path)
            .header(header::HOST, authority)
            .header(
                header::USER_AGENT,
                concat!("agenshield/", env!("CARGO_PKG_VERSION")),
            )
            .header(header::ACCEPT_ENCODING, "identity");
        if let Some(etag) = etag {
            req = req.header(header::IF_NONE_MATCH, etag);
        }
        let req = req
            .body(Empty::<Bytes>::new())
            .map_err(|e| unreachable(&e))?;
        let resp = send.send_request(req).await.map_err(|e| unreachable(&e))?;
        if resp.status() == StatusCode::NOT_MODIFIED && etag.is_some() {
            return Ok(None);
        }
        if resp.status() != StatusCode::OK {
            return Err(unreachable(&format!("HTTP {}", resp.status())));
        }
        let new_etag = resp
            .headers()
            .get(header::ETAG)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let too_large = || FetchError::TooLarge {
            what,
            max,
            etag: new_etag.clone(),
        };
        let declared = resp
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            return Err(too_large());
        }
        let mut body = resp.into_body();
        let mut out = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| unreachable(&e))?;
            if let Ok(data) = frame.into_data() {
                if (out.len() + data.len()) as u64 > max {
                    return Err(too_large());
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(Some((out, new_etag)))
    }

    async fn file(&self, path: &Path, etag: Option<&str>) -> Result<Fetched, FetchError> {
        let unreachable =
            |e: &dyn std::fmt::Display| FetchError::Unreachable(format!("{}: {e}", path.display()));
        let meta = tokio::fs::metadata(path)
            .await
            .map_err(|e| unreachable(&e))?;
        let sig_path = PathBuf::from(format!("{}.minisig", path.display()));
        let sig_meta = tokio::fs::metadata(&sig_path)
            .await
            .map_err(|e| FetchError::Unreachable(format!("{}: {e}", sig_path.display())))?;
        if !meta.is_file() || !sig_meta.is_file() {
            return Err(unreachable(
                &"not a regular file (the bundle or its signature)",
            ));
        }
        let now = Some(file_etag(&meta, &sig_meta));
        if now.as_deref() == etag {
            return Ok(Fetched::NotModified);
        }
        let bundle = read_capped(path, self.max)
            .await
            .map_err(|e| e.into_fetch_error(path, "bundle", self.max, now.clone()))?;
        let signature = read_capped(&sig_path, MAX_SIGNATURE)
            .await
            .map_err(|e| e.into_fetch_error(&sig_path, "signature", MAX_SIGNATURE, now.clone()))?;
        Ok(Fetched::New {
            bundle,
            signature,
            etag: now,
        })
    }
}

/// A file's stand-in for an ETag: its and its signature's size, modification time and inode.
fn file_etag(m: &std::fs::Metadata, s: &std::fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "\"{}-{}.{}-{}/{}-{}.{}-{}\"",
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ino(),
        s.len(),
        s.mtime(),
        s.mtime_nsec(),
        s.ino()
    )
}

enum ReadError {
    Io(std::io::Error),
    TooLarge,
}

impl ReadError {
    fn into_fetch_error(
        self,
        path: &Path,
        what: &'static str,
        max: u64,
        etag: Option<String>,
    ) -> FetchError {
        match self {
            ReadError::Io(e) => FetchError::Unreachable(format!("{}: {e}", path.display())),
            ReadError::TooLarge => FetchError::TooLarge { what, max, etag },
        }
    }
}

/// Reads at most `max` bytes of `path`; more is [`ReadError::TooLarge`].
async fn read_capped(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    use tokio::io::AsyncReadExt;
    // Non-blocking open, then the opened file itself checked: a FIFO (or a device) would
    // block a thread of the blocking pool past the deadline, one more at every sync.
    let f = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_NONBLOCK)
        .open(path)
        .await
        .map_err(ReadError::Io)?;
    let meta = f.metadata().await.map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a regular file",
        )));
    }
    let mut out = Vec::new();
    f.take(max + 1)
        .read_to_end(&mut out)
        .await
        .map_err(ReadError::Io)?;
    if out.len() as u64 > max {
        return Err(ReadError::TooLarge);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fetcher(path: &Path) -> Fetcher {
        let tls = crate::upstream::trust::UpstreamTrust::load(&[] as &[PathBuf])
            .and_then(|t| t.client_config())
            .expect("tls");
        Fetcher::new(
            BundleUrl::File(path.to_path_buf()),
            tls,
            4096,
            Duration::from_secs(1),
        )
    }

    /// A FIFO (or any file that is not a regular one) at the bundle's path is refused at
    /// once: opening it would block a thread of the blocking pool for good (the deadline
    /// drops the future, not the thread), one more at every sync.
    #[tokio::test]
    async fn a_fifo_is_refused_without_blocking() {
        use std::os::unix::fs::OpenOptionsExt;
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("b.tar.gz");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::S_IRWXU).expect("mkfifo");
        std::fs::write(tmp.path().join("b.tar.gz.minisig"), b"sig").expect("sig");
        let got = fetcher(&path).fetch(None).await;
        // Unblock a reader stuck in open(2), if any, so the runtime can stop.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(nix::libc::O_NONBLOCK)
            .open(&path);
        match got {
            Err(FetchError::Unreachable(why)) => {
                assert!(why.contains("not a regular file"), "{why}")
            }
            other => panic!("{other:?}"),
        }
    }
}
