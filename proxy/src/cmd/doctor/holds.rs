//! Whether a trust source a tool reads holds our CA where the agent can read it: a PEM
//! bundle, a directory of PEM files (`SSL_CERT_DIR`), or a PKCS12 trust store. A source the
//! agent named is read, and its `keytool` run, as the agent ([`Access`]).

use std::path::Path;

use super::agent::Agent;
use super::agent_access::{Access, ReadError, Want};
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
    /// The agent cannot read it (read as root: it holds the CA, but the agent cannot read it).
    AgentCannotRead(String),
    /// Not a regular file (a FIFO, a device; a file where a directory is wanted): not opened.
    NotAFile(&'static str),
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
            Holds::AgentCannotRead(why) => format!("the agent cannot read ({why})"),
            Holds::NotAFile(kind) => format!("is {kind}, not a file: not opened"),
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

/// Whether `path`, read as `format` through `access`, holds `ca` (DER) where `agent` can
/// read it.
pub fn holds(path: &Path, format: Format, ca: &[u8], agent: &Agent, access: &Access) -> Holds {
    let found = match format {
        Format::Pem => pem(path, Want::File, ca, access),
        Format::PemDir => pem(path, Want::Dir, ca, access),
        Format::KeyStore { password, keytool } => key_store(path, password, keytool, ca, access),
    };
    match found {
        // Read by the agent itself: it can read it.
        Ok(()) if access.reads_as_agent() => Holds::Yes,
        Ok(()) => match agent.cannot_read(path) {
            None => Holds::Yes,
            Some(why) => Holds::AgentCannotRead(why),
        },
        Err(h) => h,
    }
}

fn read_holds(e: ReadError) -> Holds {
    match e {
        ReadError::Missing => Holds::Missing,
        ReadError::NotAFile(kind) => Holds::NotAFile(kind),
        ReadError::Denied(why) => Holds::AgentCannotRead(why),
        e => Holds::Unreadable(e.to_string()),
    }
}

/// A PEM bundle, or a directory of them (read as one text: any file may hold the CA).
fn pem(path: &Path, want: Want, ca: &[u8], access: &Access) -> Result<(), Holds> {
    let text = access.read(path, want).map_err(read_holds)?;
    let certs = bundle::certs_of(&String::from_utf8_lossy(&text));
    if certs.is_empty() {
        Err(Holds::NotCertificates)
    } else if certs.iter().any(|c| c.as_ref() == ca) {
        Ok(())
    } else {
        Err(Holds::NoCa)
    }
}

fn key_store(
    path: &Path,
    password: &str,
    keytool: Option<&Path>,
    ca: &[u8],
    access: &Access,
) -> Result<(), Holds> {
    let bytes = access.read(path, Want::File).map_err(read_holds)?;
    let certs = match truststore::certs_in_store(&bytes, password) {
        Some(certs) => certs,
        None => match keytool {
            Some(tool) => {
                keytool_certs(tool, path, password, access).ok_or(Holds::NotCertificates)?
            }
            None => return Err(Holds::NotCertificates),
        },
    };
    if certs.contains(ca) {
        Ok(())
    } else if certs.is_empty() {
        Err(Holds::NotCertificates)
    } else {
        Err(Holds::NoCa)
    }
}

/// The certificates of a key store of any type the JDK reads, as `keytool -list -rfc`
/// prints them; the JDK's keytool is found through the agent's PATH, so it runs as the agent.
fn keytool_certs(
    keytool: &Path,
    store: &Path,
    password: &str,
    access: &Access,
) -> Option<std::collections::BTreeSet<Vec<u8>>> {
    let mut cmd = access.command(keytool);
    cmd.args(["-list", "-rfc", "-storepass", password, "-keystore"])
        .arg(store);
    let out = access
        .run(cmd, std::time::Duration::from_secs(30))
        .ok()
        .filter(|o| o.status.success())?;
    Some(truststore::certs_of_bundle(&String::from_utf8_lossy(
        &out.stdout,
    )))
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
        let o = Access::ours();
        let both = w("both.pem", &format!("{other}{ours}"), 0o644);
        assert_eq!(holds(&both, Format::Pem, &ca, &a, &o), Holds::Yes);
        let theirs = w("theirs.pem", &other, 0o644);
        assert_eq!(holds(&theirs, Format::Pem, &ca, &a, &o), Holds::NoCa);
        let junk = w("junk.pem", "hello", 0o644);
        assert_eq!(
            holds(&junk, Format::Pem, &ca, &a, &o),
            Holds::NotCertificates
        );
        let private = w("private.pem", &ours, 0o600);
        assert!(matches!(
            holds(&private, Format::Pem, &ca, &a, &o),
            Holds::AgentCannotRead(_)
        ));
        let gone = dir.path().join("gone.pem");
        assert_eq!(holds(&gone, Format::Pem, &ca, &a, &o), Holds::Missing);
        // A directory: any file may hold it (the unreadable one does not count for the agent).
        assert!(matches!(
            holds(dir.path(), Format::PemDir, &ca, &a, &o),
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
        assert_eq!(holds(&store, right, &ca, &a, &o), Holds::Yes);
        let wrong = Format::KeyStore {
            password: "nope",
            keytool: None,
        };
        assert_eq!(holds(&store, wrong, &ca, &a, &o), Holds::NotCertificates);
    }
}
