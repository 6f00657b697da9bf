//! Signed checkpoints: every `audit.checkpoint_every` records or `audit.checkpoint_interval`
//! (whichever comes first, and at a clean stop) the writer signs the chain head with the
//! daemon's ed25519 key and writes the signature into the log as a record of its own (kind
//! `checkpoint`), so it ships with the rest. The hash chain alone shows an edit only until
//! someone recomputes the hashes after it; a signed head cannot be recomputed without the
//! key, which only the worker can read. `ctl audit verify --checkpoints` checks them
//! (`checkpoint_verify.rs`) on the local log or on a shipped copy.
//!
//! What is signed is not the JSON (whose bytes a parser may not give back) but a canonical,
//! domain-separated, length-prefixed encoding of the checkpoint's fields ([`signed_message`],
//! documented in docs/audit.md), so a verifier in any language rebuilds it exactly.

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The first item of every signed message: a signature made for anything else (another
/// program, another version of this encoding) never verifies as a checkpoint.
pub const DOMAIN: &[u8] = b"agenshield audit checkpoint v1";

/// The fields of a `checkpoint` line besides the envelope (`v`, `seq`, `time`, `prev`, `hash`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CheckpointEntry {
    /// The first record this checkpoint is the first to sign: the one after the previous
    /// checkpoint (or the first the daemon wrote, when none is found at its start).
    pub first_seq: u64,
    /// The last record signed: the line just before this one (`seq - 1`).
    pub last_seq: u64,
    /// That record's hash: the chain head signed (equal to this line's `prev`).
    pub head: String,
    /// Which key signed: [`PublicKey::id`].
    pub key_id: String,
    /// The ed25519 signature of [`signed_message`], base64 (standard, padded).
    pub signature: String,
}

/// What a checkpoint at `seq`, written at `time`, signs: each item as a 4-byte big-endian
/// length then its bytes, in this order: [`DOMAIN`], `seq`, `time`, `first_seq`, `last_seq`
/// (numbers as 8-byte big-endian), `head` (64 lowercase hex characters), `key_id` (ASCII).
pub fn signed_message(
    seq: u64,
    time: &str,
    first_seq: u64,
    last_seq: u64,
    head: &str,
    key_id: &str,
) -> Vec<u8> {
    let mut m =
        Vec::with_capacity(DOMAIN.len() + time.len() + head.len() + key_id.len() + 3 * 8 + 7 * 4);
    let mut item = |bytes: &[u8]| {
        // Every item is far below 4 GiB (a time, a hash, an id): the cast cannot truncate.
        m.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        m.extend_from_slice(bytes);
    };
    item(DOMAIN);
    item(&seq.to_be_bytes());
    item(time.as_bytes());
    item(&first_seq.to_be_bytes());
    item(&last_seq.to_be_bytes());
    item(head.as_bytes());
    item(key_id.as_bytes());
    m
}

/// An ed25519 public key: what `ctl audit key` exports and `verify --checkpoints` takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    raw: [u8; 32],
}

/// The DER of an ed25519 SubjectPublicKeyInfo (RFC 8410) before its 32 key bytes.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];
const PUBLIC_LABEL: &str = "PUBLIC KEY";

/// Why a text is not a public key this verifier takes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PublicKeyError {
    #[error("no PEM block \"-----BEGIN PUBLIC KEY-----\" in it")]
    NoPem,
    #[error("its PEM body is not base64")]
    NotBase64,
    #[error("not an ed25519 public key (RFC 8410 SubjectPublicKeyInfo)")]
    NotEd25519,
}

impl PublicKey {
    pub fn from_raw(raw: [u8; 32]) -> PublicKey {
        PublicKey { raw }
    }

    /// The first 8 bytes of the SHA-256 of the 32 key bytes, hex: short, and the same
    /// whatever encoding the key travelled in.
    pub fn id(&self) -> String {
        hex(&Sha256::digest(self.raw)[..8])
    }

    /// PEM, `-----BEGIN PUBLIC KEY-----` (SubjectPublicKeyInfo, as `openssl pkey -pubout`
    /// writes an ed25519 key).
    pub fn to_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(&self.raw);
        pem(PUBLIC_LABEL, &der)
    }

    /// The first `PUBLIC KEY` block of `text` (text around it, such as a comment, is ignored).
    pub fn from_pem(text: &str) -> Result<PublicKey, PublicKeyError> {
        let der = pem_body(text, PUBLIC_LABEL)?;
        let raw = der
            .strip_prefix(&SPKI_PREFIX[..])
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or(PublicKeyError::NotEd25519)?;
        Ok(PublicKey { raw })
    }

    /// Whether `signature` (base64) is this key's signature of `message`.
    pub fn verifies(&self, message: &[u8], signature: &str) -> bool {
        let Ok(sig) = base64::engine::general_purpose::STANDARD.decode(signature) else {
            return false;
        };
        ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, &self.raw)
            .verify(message, &sig)
            .is_ok()
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        out.push(char::from(b"0123456789abcdef"[usize::from(b & 15)]));
    }
    out
}

/// `der` as a PEM block under `label`, 64 characters a line.
pub(crate) fn pem(label: &str, der: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str(&format!("-----END {label}-----\n"));
    out
}

/// The bytes of the first `label` block of `text`.
pub(crate) fn pem_body(text: &str, label: &str) -> Result<Vec<u8>, PublicKeyError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin).ok_or(PublicKeyError::NoPem)? + begin.len();
    let len = text[start..].find(&end).ok_or(PublicKeyError::NoPem)?;
    let body: String = text[start..start + len]
        .chars()
        .filter(|c| !c.is_ascii_whitespace())
        .collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|_| PublicKeyError::NotBase64)
}
