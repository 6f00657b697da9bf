//! `manifest.toml`, the one file of a bundle that is not policy: the revision (a number that
//! only grows; a lower one is a rollback and refused), when the bundle was made, and what
//! the local policy directory may do under it.

use serde::{Deserialize, Serialize};

use crate::policy::LocalMode;

/// The manifest's name inside a bundle.
pub const MANIFEST: &str = "manifest.toml";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub revision: u64,
    /// RFC 3339.
    pub created_at: String,
    pub local: LocalMode,
}

/// Why a manifest is refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest.toml: {0}")]
    Toml(String),
    #[error("manifest.toml: created_at {0:?} is not an RFC 3339 time")]
    CreatedAt(String),
    #[error("manifest.toml: revision must be at least 1")]
    RevisionZero,
    #[error("manifest.toml: revision {0} is above {max} (TOML integers are 64-bit signed)", max = i64::MAX)]
    RevisionTooLarge(u64),
}

impl Manifest {
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let m: Manifest =
            toml::from_str(text).map_err(|e| ManifestError::Toml(e.message().to_string()))?;
        if m.revision == 0 {
            return Err(ManifestError::RevisionZero);
        }
        time::OffsetDateTime::parse(
            &m.created_at,
            &time::format_description::well_known::Rfc3339,
        )
        .map_err(|_| ManifestError::CreatedAt(m.created_at.clone()))?;
        Ok(m)
    }

    pub fn render(&self) -> String {
        toml::to_string(self).unwrap_or_else(|_| unreachable!("a manifest always serialises"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_checks_fields() {
        let m = Manifest {
            revision: 7,
            created_at: "2026-12-07T01:02:03Z".into(),
            local: LocalMode::DenyOnly,
        };
        let text = m.render();
        assert!(text.contains("local = \"deny-only\""), "{text}");
        assert_eq!(Manifest::parse(&text).expect("parses"), m);
        assert!(matches!(
            Manifest::parse(
                "revision = 0\ncreated_at = \"2026-12-07T01:02:03Z\"\nlocal = \"merge\""
            ),
            Err(ManifestError::RevisionZero)
        ));
        assert!(matches!(
            Manifest::parse("revision = 1\ncreated_at = \"yesterday\"\nlocal = \"merge\""),
            Err(ManifestError::CreatedAt(_))
        ));
        assert!(Manifest::parse(
            "revision = 1\ncreated_at = \"2026-12-07T01:02:03Z\"\nlocal = \"all\""
        )
        .is_err());
        assert!(Manifest::parse(
            "revision = 1\ncreated_at = \"2026-12-07T01:02:03Z\"\nlocal = \"merge\"\nx = 1"
        )
        .is_err());
        assert!(Manifest::parse(
            "revision = -1\ncreated_at = \"2026-12-07T01:02:03Z\"\nlocal = \"merge\""
        )
        .is_err());
    }
}
