//! Whether a trust source a tool reads holds our CA where the agent can read it: a PEM
//! bundle, a directory of PEM files (`SSL_CERT_DIR`), or a PKCS12 trust store.

use std::path::Path;

use super::agent::Agent;
use crate::cmd::trust::{bundle, truststore};

/// What a trust source turned out to be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holds {
    /// It holds the CA, and the agent can read it.
    Yes,
    /// It holds certificates, but not ours.
    NoCa,
    Missing,
    /// Root could not read it either.
    Unreadable(String),
    /// It holds the CA, but the agent cannot read it.
    AgentCannotRead(String),
    /// Not a PEM bundle (or no key store this password opens).
    NotCertificates,
    /// Roots compiled into (or shipped inside) the tool: our CA cannot be among them.
    Builtin,
}

impl Holds {
    pub fn trusts(&self) -> bool {
        *self == Holds::Yes
    }

    /// Completes "PATH …".
    pub fn describe(&self) -> String {
        match self {
            Holds::Yes => "holds the CA".into(),
            Holds::NoCa => "does not hold the AgenShield CA".into(),
            Holds::Missing => "does not exist".into(),
            Holds::Unreadable(e) => format!("cannot be read ({e})"),
            Holds::AgentCannotRead(why) => {
                format!("holds the CA but the agent cannot read it ({why})")
            }
            Holds::NotCertificates => "holds no certificate".into(),
            Holds::Builtin => "cannot hold the AgenShield CA".into(),
        }
    }
}

/// How a source's bytes are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format<'a> {
    Pem,
    /// A directory of PEM files, any of which may hold the CA.
    PemDir,
    /// A Java key store: PKCS12, read here; or any type `keytool` reads (JKS, as the JDK's
    /// `cacerts` often is), when it is given.
    KeyStore {
        password: &'a str,
        keytool: Option<&'a Path>,
    },
}

/// Whether `path`, read as `format`, holds `ca` (DER) where `agent` can read it.
pub fn holds(path: &Path, format: Format, ca: &[u8], agent: &Agent) -> Holds {
    let found = match format {
        Format::Pem => pem_file(path, ca),
        Format::PemDir => pem_dir(path, ca),
        Format::KeyStore { password, keytool } => key_store(path, password, keytool, ca),
    };
    match found {
        Ok(file) => match agent.cannot_read(&file) {
            None => Holds::Yes,
            Some(why) => Holds::AgentCannotRead(why),
        },
        Err(h) => h,
    }
}

fn io_holds(e: std::io::Error) -> Holds {
    match e.kind() {
        std::io::ErrorKind::NotFound => Holds::Missing,
        _ => Holds::Unreadable(e.to_string()),
    }
}

fn pem_file(path: &Path, ca: &[u8]) -> Result<std::path::PathBuf, Holds> {
    let text = std::fs::read(path).map_err(io_holds)?;
    let certs = bundle::certs_of(&String::from_utf8_lossy(&text));
    if certs.is_empty() {
        Err(Holds::NotCertificates)
    } else if certs.iter().any(|c| c.as_ref() == ca) {
        Ok(path.to_path_buf())
    } else {
        Err(Holds::NoCa)
    }
}

fn key_store(
    path: &Path,
    password: &str,
    keytool: Option<&Path>,
    ca: &[u8],
) -> Result<std::path::PathBuf, Holds> {
    let bytes = std::fs::read(path).map_err(io_holds)?;
    let certs = match truststore::certs_in_store(&bytes, password) {
        Some(certs) => certs,
        None => match keytool {
            Some(tool) => keytool_certs(tool, path, password).ok_or(Holds::NotCertificates)?,
            None => return Err(Holds::NotCertificates),
        },
    };
    if certs.contains(ca) {
        Ok(path.to_path_buf())
    } else if certs.is_empty() {
        Err(Holds::NotCertificates)
    } else {
        Err(Holds::NoCa)
    }
}

/// The certificates of a key store of any type the JDK reads, as `keytool -list -rfc`
/// prints them.
fn keytool_certs(
    keytool: &Path,
    store: &Path,
    password: &str,
) -> Option<std::collections::BTreeSet<Vec<u8>>> {
    let mut cmd = std::process::Command::new(keytool);
    cmd.args(["-list", "-rfc", "-storepass", password, "-keystore"])
        .arg(store);
    let out = super::bounded::output(cmd, std::time::Duration::from_secs(30))
        .ok()
        .filter(|o| o.status.success())?;
    Some(truststore::certs_of_bundle(&String::from_utf8_lossy(
        &out.stdout,
    )))
}

fn pem_dir(dir: &Path, ca: &[u8]) -> Result<std::path::PathBuf, Holds> {
    let entries = std::fs::read_dir(dir).map_err(io_holds)?;
    let mut any = false;
    for e in entries.flatten() {
        match pem_file(&e.path(), ca) {
            Ok(p) => return Ok(p),
            Err(Holds::NoCa) => any = true,
            Err(_) => {}
        }
    }
    Err(if any {
        Holds::NoCa
    } else {
        Holds::NotCertificates
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn pem(name: &str) -> (String, Vec<u8>) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), cert.der().to_vec())
    }

    fn agent() -> Agent {
        Agent {
            name: "agent-test".into(),
            uid: 65_001,
            gids: vec![65_001],
            home: "/nonexistent".into(),
        }
    }

    #[test]
    fn each_format_is_judged_by_its_contents_and_the_agents_access() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let (ours, ca) = pem("ours");
        let (other, _) = pem("other");
        let w = |name: &str, text: &str, mode| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write");
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
            p
        };
        let a = agent();
        let both = w("both.pem", &format!("{other}{ours}"), 0o644);
        assert_eq!(holds(&both, Format::Pem, &ca, &a), Holds::Yes);
        let theirs = w("theirs.pem", &other, 0o644);
        assert_eq!(holds(&theirs, Format::Pem, &ca, &a), Holds::NoCa);
        let junk = w("junk.pem", "hello", 0o644);
        assert_eq!(holds(&junk, Format::Pem, &ca, &a), Holds::NotCertificates);
        let private = w("private.pem", &ours, 0o600);
        assert!(matches!(
            holds(&private, Format::Pem, &ca, &a),
            Holds::AgentCannotRead(_)
        ));
        let gone = dir.path().join("gone.pem");
        assert_eq!(holds(&gone, Format::Pem, &ca, &a), Holds::Missing);
        // A directory: any file may hold it (the unreadable one does not count for the agent).
        assert!(matches!(
            holds(dir.path(), Format::PemDir, &ca, &a),
            Holds::Yes | Holds::AgentCannotRead(_)
        ));
        let p12 = truststore::from_bundle(&format!("{other}{ours}")).expect("p12");
        let store = dir.path().join("store.p12");
        std::fs::write(&store, p12).expect("write");
        std::fs::set_permissions(&store, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let right = Format::KeyStore {
            password: truststore::PASSWORD,
            keytool: None,
        };
        assert_eq!(holds(&store, right, &ca, &a), Holds::Yes);
        let wrong = Format::KeyStore {
            password: "nope",
            keytool: None,
        };
        assert_eq!(holds(&store, wrong, &ca, &a), Holds::NotCertificates);
    }
}
