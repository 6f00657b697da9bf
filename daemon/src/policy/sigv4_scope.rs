//! What a `sigv4` binding may sign: the services and regions it names, the actions of query
//! and JSON APIs (`Action=`, `X-Amz-Target`) it lists, and the sources S3 may copy from
//! (`x-amz-copy-source`). The agent writes the credential scope and the action; without these
//! the proxy would sign whatever it asked for with the real keys (a confused deputy): read
//! another bucket through `copy-object`, or mint fresh keys through STS that no redaction
//! knows. Actions that issue credentials are signed only where the list names them exactly.

use globset::{GlobBuilder, GlobMatcher};
use toml::Spanned;

/// Actions that hand out credentials (AWS keys, tokens, passwords): never covered by a
/// pattern, only by their exact name.
pub const ISSUES_CREDENTIALS: [&str; 16] = [
    "AssumeRole",
    "AssumeRoleWithSAML",
    "AssumeRoleWithWebIdentity",
    "AssumeRoot",
    "GetSessionToken",
    "GetFederationToken",
    "CreateAccessKey",
    "CreateLoginProfile",
    "UpdateLoginProfile",
    "CreateServiceSpecificCredential",
    "ResetServiceSpecificCredential",
    "GetRoleCredentials",
    "GetCredentialsForIdentity",
    "GetOpenIdTokenForDeveloperIdentity",
    "GetAuthorizationToken",
    "GetClusterCredentials",
];

/// Why a `sigv4` scope as written is refused (policy text, never a secret).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("`sigv4` must say which {what} it signs for: {what} = [{example}] (\"*\" for any)")]
    Missing {
        what: &'static str,
        example: &'static str,
    },
    #[error("`sigv4` {0} must not be empty")]
    EmptyTokens(&'static str),
    #[error("invalid `sigv4` {what} entry {entry:?}")]
    InvalidToken { what: &'static str, entry: String },
    #[error("a `sigv4` list must not be empty")]
    EmptyList,
    #[error("invalid name or pattern {0:?}")]
    InvalidName(String),
    #[error("invalid pattern {text:?}: {kind}")]
    InvalidPattern {
        text: String,
        kind: globset::ErrorKind,
    },
}

/// Names matched by exact name or by `*`/`?` patterns (case-sensitive, as AWS writes them).
#[derive(Debug, Clone)]
pub struct NameGlobs {
    written: Box<[String]>,
    matchers: Box<[GlobMatcher]>,
}

impl PartialEq for NameGlobs {
    fn eq(&self, other: &Self) -> bool {
        self.written == other.written
    }
}

impl Eq for NameGlobs {}

impl NameGlobs {
    fn compile(
        list: &[Spanned<String>],
    ) -> Result<NameGlobs, (std::ops::Range<usize>, ScopeError)> {
        let mut written = Vec::new();
        let mut matchers = Vec::new();
        for p in list {
            let text = p.get_ref();
            if text.is_empty() || text.bytes().any(|b| b.is_ascii_control() || b == b' ') {
                return Err((p.span(), ScopeError::InvalidName(text.clone())));
            }
            let glob = GlobBuilder::new(text)
                .literal_separator(false)
                .build()
                .map_err(|e| {
                    let e = ScopeError::InvalidPattern {
                        text: text.clone(),
                        kind: e.kind().clone(),
                    };
                    (p.span(), e)
                })?;
            written.push(text.clone());
            matchers.push(glob.compile_matcher());
        }
        Ok(NameGlobs {
            written: written.into_boxed_slice(),
            matchers: matchers.into_boxed_slice(),
        })
    }

    /// From patterns given in code (tests, built-in scopes).
    pub fn from_patterns(patterns: &[&str]) -> Result<NameGlobs, ScopeError> {
        let spanned: Vec<Spanned<String>> = patterns
            .iter()
            .map(|p| Spanned::new(0..0, p.to_string()))
            .collect();
        NameGlobs::compile(&spanned).map_err(|(_, e)| e)
    }

    /// Named exactly (not only matched by a pattern).
    pub fn names(&self, name: &str) -> bool {
        self.written.iter().any(|w| w == name)
    }

    pub fn matches(&self, name: &str) -> bool {
        self.matchers.iter().any(|m| m.is_match(name))
    }

    pub fn written(&self) -> &[String] {
        &self.written
    }
}

/// A `sigv4` binding's scope, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sigv4Scope {
    /// Signing names (`s3`, `sts`, `dynamodb`), lower case; `*` any.
    pub services: Box<[String]>,
    /// Regions (`eu-west-1`, `us-east-1`), lower case; `*` any.
    pub regions: Box<[String]>,
    /// Actions of query and JSON APIs; `None`: a request naming one is refused.
    pub actions: Option<NameGlobs>,
    /// `bucket/key` patterns S3 may copy from; `None`: a copy is refused.
    pub copy_sources: Option<NameGlobs>,
}

/// Why a request falls outside the scope (completes "this request …").
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutOfScope {
    Service(String),
    Region(String),
    /// Named an action the binding does not list.
    Action(String),
    /// An action that issues credentials, matched only by a pattern.
    IssuesCredentials(String),
    CopySource(String),
}

impl OutOfScope {
    pub fn describe(&self, scope: &Sigv4Scope) -> String {
        let list = |v: &[String]| v.join(", ");
        match self {
            OutOfScope::Service(s) => format!(
                "is signed for service {s:?}; the rule signs for {}",
                list(&scope.services)
            ),
            OutOfScope::Region(r) => format!(
                "is signed for region {r:?}; the rule signs for {}",
                list(&scope.regions)
            ),
            OutOfScope::Action(a) => match &scope.actions {
                Some(n) => format!(
                    "calls action {a:?}; the rule's `actions` are {}",
                    list(n.written())
                ),
                None => format!("calls action {a:?}; the rule lists no `actions`"),
            },
            OutOfScope::IssuesCredentials(a) => format!(
                "calls {a:?}, which issues credentials: signed only where `actions` names it exactly"
            ),
            OutOfScope::CopySource(s) => match &scope.copy_sources {
                Some(n) => format!(
                    "copies from {s:?}; the rule's `copy_sources` are {}",
                    list(n.written())
                ),
                None => format!("copies from {s:?}; the rule lists no `copy_sources`"),
            },
        }
    }
}

impl Sigv4Scope {
    pub(crate) fn compile(
        services: Option<&Spanned<Vec<Spanned<String>>>>,
        regions: Option<&Spanned<Vec<Spanned<String>>>>,
        actions: Option<&Spanned<Vec<Spanned<String>>>>,
        copy_sources: Option<&Spanned<Vec<Spanned<String>>>>,
        whole: std::ops::Range<usize>,
    ) -> Result<Sigv4Scope, (std::ops::Range<usize>, ScopeError)> {
        let token_list = |l: Option<&Spanned<Vec<Spanned<String>>>>,
                          what: &'static str,
                          example: &'static str| {
            let Some(l) = l else {
                return Err((whole.clone(), ScopeError::Missing { what, example }));
            };
            if l.get_ref().is_empty() {
                return Err((l.span(), ScopeError::EmptyTokens(what)));
            }
            let mut out = Vec::new();
            for s in l.get_ref() {
                let v = s.get_ref().to_ascii_lowercase();
                let ok = v == "*"
                    || (!v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
                if !ok {
                    let entry = s.get_ref().clone();
                    return Err((s.span(), ScopeError::InvalidToken { what, entry }));
                }
                out.push(v);
            }
            Ok(out.into_boxed_slice())
        };
        let globs = |l: Option<&Spanned<Vec<Spanned<String>>>>| match l {
            None => Ok(None),
            Some(l) if l.get_ref().is_empty() => Err((l.span(), ScopeError::EmptyList)),
            Some(l) => NameGlobs::compile(l.get_ref()).map(Some),
        };
        Ok(Sigv4Scope {
            services: token_list(services, "services", "\"s3\"")?,
            regions: token_list(regions, "regions", "\"eu-west-1\"")?,
            actions: globs(actions)?,
            copy_sources: globs(copy_sources)?,
        })
    }

    pub fn check_scope(&self, service: &str, region: &str) -> Result<(), OutOfScope> {
        let has =
            |list: &[String], v: &str| list.iter().any(|x| x == "*" || x.eq_ignore_ascii_case(v));
        if !has(&self.services, service) {
            return Err(OutOfScope::Service(service.to_string()));
        }
        if !has(&self.regions, region) {
            return Err(OutOfScope::Region(region.to_string()));
        }
        Ok(())
    }

    /// `action` as a query or JSON API names it (`GetSessionToken`; for `X-Amz-Target`, the
    /// part after the last `.`).
    pub fn check_action(&self, action: &str) -> Result<(), OutOfScope> {
        let Some(actions) = &self.actions else {
            return Err(OutOfScope::Action(action.to_string()));
        };
        if ISSUES_CREDENTIALS
            .iter()
            .any(|c| c.eq_ignore_ascii_case(action))
        {
            return if actions.names(action) {
                Ok(())
            } else {
                Err(OutOfScope::IssuesCredentials(action.to_string()))
            };
        }
        if actions.matches(action) {
            Ok(())
        } else {
            Err(OutOfScope::Action(action.to_string()))
        }
    }

    /// `source` as `bucket/key` (decoded, no leading `/`, no `?versionId`).
    pub fn check_copy_source(&self, source: &str) -> Result<(), OutOfScope> {
        match &self.copy_sources {
            Some(c) if c.matches(source) => Ok(()),
            _ => Err(OutOfScope::CopySource(source.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spanned(v: &[&str]) -> Spanned<Vec<Spanned<String>>> {
        let text = format!(
            "v = [{}]",
            v.iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        #[derive(serde::Deserialize)]
        struct W {
            v: Spanned<Vec<Spanned<String>>>,
        }
        toml::from_str::<W>(&text).expect("toml").v
    }

    #[test]
    fn the_scope_says_what_may_be_signed() {
        let scope = Sigv4Scope::compile(
            Some(&spanned(&["s3", "STS"])),
            Some(&spanned(&["eu-west-1"])),
            Some(&spanned(&["Get*", "AssumeRole", "List*"])),
            Some(&spanned(&["my-bucket/*"])),
            0..1,
        )
        .expect("compiles");
        assert_eq!(scope.check_scope("s3", "eu-west-1"), Ok(()));
        assert_eq!(scope.check_scope("sts", "EU-WEST-1"), Ok(()));
        assert_eq!(
            scope.check_scope("iam", "eu-west-1"),
            Err(OutOfScope::Service("iam".into()))
        );
        assert_eq!(
            scope.check_scope("s3", "us-east-1"),
            Err(OutOfScope::Region("us-east-1".into()))
        );
        assert_eq!(scope.check_action("GetItem"), Ok(()));
        assert_eq!(scope.check_action("AssumeRole"), Ok(()), "named exactly");
        assert_eq!(
            scope.check_action("GetSessionToken"),
            Err(OutOfScope::IssuesCredentials("GetSessionToken".into())),
            "Get* does not cover an action that issues credentials"
        );
        assert_eq!(
            scope.check_action("PutItem"),
            Err(OutOfScope::Action("PutItem".into()))
        );
        assert_eq!(scope.check_copy_source("my-bucket/a/b.txt"), Ok(()));
        assert_eq!(
            scope.check_copy_source("other-bucket/secret.txt"),
            Err(OutOfScope::CopySource("other-bucket/secret.txt".into()))
        );
        let bare = Sigv4Scope::compile(
            Some(&spanned(&["*"])),
            Some(&spanned(&["*"])),
            None,
            None,
            0..1,
        )
        .expect("compiles");
        assert_eq!(bare.check_scope("anything", "anywhere"), Ok(()));
        assert!(bare.check_action("ListBuckets").is_err());
        assert!(bare.check_copy_source("my-bucket/x").is_err());
        let e = Sigv4Scope::compile(None, Some(&spanned(&["*"])), None, None, 3..9)
            .expect_err("services are required");
        assert!(e.1.to_string().contains("services = ["), "{e:?}");
    }
}
