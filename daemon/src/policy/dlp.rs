//! A rule's credential-exfiltration settings (`docs/dlp.md`): `dlp = "block" | "report" |
//! "off"` (default `"block"`) and `dlp_allow = [...]`, values known to be harmless (test
//! keys) that may go anywhere. Validated here; the detector and the decision are `dlp/`'s,
//! the wiring `pipeline/dlp.rs`'s. Error messages never quote a `dlp_allow` value.

use std::sync::Arc;

use super::error::PolicyError;
use super::model::List;
use super::Action;
use toml::Spanned;

/// At most this many `dlp_allow` values per rule…
pub(super) const MAX_DLP_ALLOW: usize = 1024;
/// …each at most this long (a private key block fits).
pub(super) const MAX_DLP_ALLOW_LEN: usize = 16 * 1024;

/// What a rule does with a credential that is not going home.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum DlpMode {
    /// Refused as `credential_exfiltration` (the default).
    #[default]
    Block,
    /// Let through, and recorded.
    Report,
    /// Not scanned.
    Off,
}

impl DlpMode {
    pub fn as_str(self) -> &'static str {
        match self {
            DlpMode::Block => "block",
            DlpMode::Report => "report",
            DlpMode::Off => "off",
        }
    }
}

/// A rule's DLP settings, compiled. The allowed values are kept as the operator wrote them
/// (the pipeline turns them into keyed fingerprints when a finding needs them); `Debug`
/// shows how many there are, never what they are.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DlpRule {
    pub mode: DlpMode,
    pub allow: Arc<[Box<str>]>,
}

impl std::fmt::Debug for DlpRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DlpRule")
            .field("mode", &self.mode)
            .field("allow", &self.allow.len())
            .finish()
    }
}

/// `dlp` and `dlp_allow` as written (TOML only; other formats leave both unset).
#[derive(Debug, Default)]
pub(crate) struct DlpDef {
    pub mode: Option<Spanned<String>>,
    pub allow: Option<List<String>>,
}

/// Validates a rule's `dlp` and `dlp_allow`. `None`: both unset (the default, `block`).
pub(crate) fn compile_dlp(
    def: &DlpDef,
    action: Action,
    err: &dyn Fn(std::ops::Range<usize>, String) -> PolicyError,
) -> Result<Option<Arc<DlpRule>>, PolicyError> {
    if def.mode.is_none() && def.allow.is_none() {
        return Ok(None);
    }
    let mode = match &def.mode {
        None => DlpMode::Block,
        Some(m) => match m.get_ref().as_str() {
            "block" => DlpMode::Block,
            "report" => DlpMode::Report,
            "off" => DlpMode::Off,
            other => {
                return Err(err(
                    m.span(),
                    format!(
                        "unknown dlp {:?}, expected \"block\", \"report\" or \"off\"",
                        other.chars().take(32).collect::<String>()
                    ),
                ))
            }
        },
    };
    if action == Action::Deny {
        let span = match (&def.mode, &def.allow) {
            (Some(m), _) => m.span(),
            (None, Some(a)) => a.span(),
            (None, None) => 0..0,
        };
        return Err(err(
            span,
            "`dlp` and `dlp_allow` apply only to \"allow\" and \"ask\" rules".into(),
        ));
    }
    let mut allow = Vec::new();
    if let Some(list) = &def.allow {
        if mode == DlpMode::Off {
            return Err(err(
                list.span(),
                "`dlp_allow` has no effect under dlp = \"off\" (nothing is scanned)".into(),
            ));
        }
        if list.get_ref().len() > MAX_DLP_ALLOW {
            return Err(err(
                list.span(),
                format!("`dlp_allow` lists more than {MAX_DLP_ALLOW} values"),
            ));
        }
        for (i, v) in list.get_ref().iter().enumerate() {
            // The value is never quoted: it may be a real credential.
            let s = v.get_ref();
            let bad = if s.is_empty() {
                Some("is empty")
            } else if s.len() > MAX_DLP_ALLOW_LEN {
                Some("is longer than 16 KiB")
            } else if s != s.trim() {
                Some("starts or ends with white space")
            } else {
                None
            };
            if let Some(why) = bad {
                return Err(err(v.span(), format!("`dlp_allow` value {} {why}", i + 1)));
            }
            allow.push(Box::from(s.as_str()));
        }
    }
    Ok(Some(Arc::new(DlpRule {
        mode,
        allow: allow.into(),
    })))
}
