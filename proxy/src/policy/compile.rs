//! Validation and compilation: parsed files → rules in evaluation order plus a host index, so
//! every mistake is reported at load time (with file:line:col) and `decide` does no parsing.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use toml::Spanned;

use super::error::{Conflict, Location, PolicyError};
use super::eval::{CompiledRule, HostIndex};
use super::host::{parse_host_pattern, HostPattern};
use super::model::{self, DefaultAction, PolicyFile, RuleFile};
use super::{Action, Mode, PolicySource};

/// Everything `Policy` needs besides its hash.
pub(crate) struct Compiled {
    pub rules: Vec<CompiledRule>,
    pub index: HostIndex,
    pub default: Action,
    pub mode: Mode,
}

const MAX_ID_LEN: usize = 64;

/// A policy-wide key (`default`, `mode`) and the file that set it first.
struct Setting<T> {
    value: T,
    at: Location,
}

pub(crate) fn compile(sources: &[PolicySource]) -> Result<Compiled, PolicyError> {
    let mut default: Option<Setting<Action>> = None;
    let mut mode: Option<Setting<Mode>> = None;
    // Rule id → (file index, span); positions are computed only for an error (O(file) each).
    let mut ids: HashMap<String, (usize, Range<usize>)> = HashMap::new();
    // (sort key, rule, host patterns); key = priority desc, deny first, file order, rule order.
    let mut pending = Vec::new();
    // Identical `paths` lists share one compiled glob set (compiling globs dominates load time).
    let mut globs: HashMap<String, GlobSet> = HashMap::new();

    for (file_idx, src) in sources.iter().enumerate() {
        let at = |span: Range<usize>| Location::at(&src.name, &src.text, span);
        let file: PolicyFile = model::parse(&src.text).map_err(|e| PolicyError::Parse {
            at: e.span().map_or_else(|| Location::file(&src.name), &at),
            message: e.message().trim_end().replace('\n', ", "),
        })?;
        match &file.version {
            None => {
                return Err(PolicyError::Invalid {
                    at: Location::file(&src.name),
                    message: format!(
                        "missing `version` (expected `version = {}`)",
                        model::VERSION
                    ),
                })
            }
            Some(v) if *v.get_ref() != model::VERSION => {
                return Err(PolicyError::Invalid {
                    at: at(v.span()),
                    message: format!(
                        "unsupported version {} (expected {})",
                        v.get_ref(),
                        model::VERSION
                    ),
                })
            }
            Some(_) => {}
        }
        if let Some(d) = &file.default {
            let value = match d.get_ref() {
                DefaultAction::Allow => Action::Allow,
                DefaultAction::Deny => Action::Deny,
            };
            merge_setting(&mut default, "default", value, at(d.span()), Action::as_str)?;
        }
        if let Some(m) = &file.mode {
            merge_setting(&mut mode, "mode", *m.get_ref(), at(m.span()), Mode::as_str)?;
        }
        for (rule_idx, rule) in file.rules.iter().enumerate() {
            if let Some((first_file, first_span)) = ids.get(rule.id.get_ref()) {
                let first = &sources[*first_file];
                return Err(PolicyError::DuplicateId {
                    at: at(rule.id.span()),
                    first: Location::at(&first.name, &first.text, first_span.clone()),
                    id: rule.id.get_ref().clone(),
                });
            }
            let (compiled, hosts) = compile_rule(rule, &at, &mut globs)?;
            ids.insert(rule.id.get_ref().clone(), (file_idx, rule.id.span()));
            let key = (
                -i64::from(compiled.priority),
                compiled.action == Action::Allow,
                file_idx,
                rule_idx,
            );
            pending.push((key, compiled, hosts));
        }
    }

    pending.sort_by_key(|(key, _, _)| *key);
    let mut index = HostIndex::default();
    let mut rules = Vec::with_capacity(pending.len());
    for (pos, (_, rule, hosts)) in pending.into_iter().enumerate() {
        for h in hosts {
            index.insert(h, pos);
        }
        rules.push(rule);
    }
    Ok(Compiled {
        rules,
        index,
        default: default.map_or(Action::Deny, |s| s.value),
        mode: mode.map_or(Mode::Enforce, |s| s.value),
    })
}

fn merge_setting<T: Copy + PartialEq>(
    slot: &mut Option<Setting<T>>,
    key: &'static str,
    value: T,
    at: Location,
    name: fn(T) -> &'static str,
) -> Result<(), PolicyError> {
    match slot {
        None => *slot = Some(Setting { value, at }),
        Some(first) if first.value != value => {
            return Err(PolicyError::Conflict(Box::new(Conflict {
                key,
                first: first.at.clone(),
                first_value: name(first.value),
                second: at,
                second_value: name(value),
            })))
        }
        Some(_) => {}
    }
    Ok(())
}

fn compile_rule(
    rule: &RuleFile,
    at: &dyn Fn(Range<usize>) -> Location,
    globs: &mut HashMap<String, GlobSet>,
) -> Result<(CompiledRule, Vec<HostPattern>), PolicyError> {
    let id = rule.id.get_ref();
    let err = |span: Range<usize>, message: String| PolicyError::Rule {
        at: at(span),
        rule: id.clone(),
        message,
    };
    if id.is_empty()
        || id.len() > MAX_ID_LEN
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-_:".contains(&b))
    {
        return Err(err(
            rule.id.span(),
            format!("invalid id (use 1..={MAX_ID_LEN} of A-Z a-z 0-9 . _ : -)"),
        ));
    }
    if let Some(rate) = &rule.rate {
        return Err(err(rate.span(), "rate limits are not supported yet".into()));
    }
    if let Some(inject) = &rule.inject {
        return Err(err(inject.span(), "`inject` is not supported yet".into()));
    }
    let action = match rule.action.get_ref().as_str() {
        "allow" => Action::Allow,
        "deny" => Action::Deny,
        "ask" => {
            return Err(err(
                rule.action.span(),
                "action \"ask\" is not supported yet".into(),
            ))
        }
        other => {
            return Err(err(
                rule.action.span(),
                format!("unknown action {other:?}, expected \"allow\" or \"deny\""),
            ))
        }
    };

    let hosts = non_empty(&rule.hosts, "hosts", &err)?
        .iter()
        .map(|h| parse_host_pattern(h.get_ref()).map_err(|m| err(h.span(), m)))
        .collect::<Result<Vec<_>, _>>()?;

    let ports = match &rule.ports {
        None => None,
        Some(list) => {
            let mut ports = non_empty(list, "ports", &err)?
                .iter()
                .map(|p| {
                    u16::try_from(*p.get_ref())
                        .ok()
                        .filter(|&n| n != 0)
                        .ok_or_else(|| {
                            err(
                                p.span(),
                                format!("port {} out of range 1..=65535", p.get_ref()),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            ports.sort_unstable();
            ports.dedup();
            Some(ports.into_boxed_slice())
        }
    };

    let methods = match &rule.methods {
        None => None,
        Some(list) => {
            let mut methods = Vec::new();
            for m in non_empty(list, "methods", &err)? {
                let s = m.get_ref();
                if s.is_empty() || !s.bytes().all(is_tchar) {
                    return Err(err(m.span(), format!("invalid HTTP method {s:?}")));
                }
                methods.push(Box::<str>::from(s.to_ascii_uppercase()));
            }
            methods.sort_unstable();
            methods.dedup();
            Some(methods.into_boxed_slice())
        }
    };

    let paths = match &rule.paths {
        None => None,
        Some(list) => {
            // Unambiguous key: patterns cannot contain control characters.
            let key = non_empty(list, "paths", &err)?
                .iter()
                .map(|p| p.get_ref().as_str())
                .collect::<Vec<_>>()
                .join("\n");
            if let Some(set) = globs.get(&key) {
                Some(set.clone())
            } else {
                let set = build_globs(list, &err)?;
                globs.insert(key, set.clone());
                Some(set)
            }
        }
    };

    let compiled = CompiledRule {
        id: Arc::from(id.as_str()),
        action,
        priority: rule.priority.unwrap_or(0),
        ports,
        methods,
        paths,
    };
    Ok((compiled, hosts))
}

/// One rule's `paths` as a glob set: `*` within a segment, `**` across segments.
fn build_globs(
    list: &Spanned<Vec<Spanned<String>>>,
    err: &dyn Fn(Range<usize>, String) -> PolicyError,
) -> Result<GlobSet, PolicyError> {
    let mut set = GlobSetBuilder::new();
    for p in list.get_ref() {
        let pattern = p.get_ref();
        check_path_pattern(pattern).map_err(|m| err(p.span(), m))?;
        let glob = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| {
                err(
                    p.span(),
                    format!("invalid path glob {pattern:?}: {}", e.kind()),
                )
            })?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| err(list.span(), format!("invalid path globs: {e}")))
}

fn non_empty<'a, T>(
    list: &'a Spanned<Vec<T>>,
    key: &str,
    err: &dyn Fn(Range<usize>, String) -> PolicyError,
) -> Result<&'a [T], PolicyError> {
    if list.get_ref().is_empty() {
        let hint = if key == "hosts" {
            ""
        } else {
            " (omit the key to match any)"
        };
        return Err(err(list.span(), format!("`{key}` must not be empty{hint}")));
    }
    Ok(list.get_ref())
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Rejects path patterns that could never match a normalized (`matching`) path, which would
/// silently make a deny rule useless.
fn check_path_pattern(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!("path pattern {p:?} must start with \"/\""));
    }
    if p.bytes().any(|b| b.is_ascii_control()) {
        return Err(format!("path pattern {p:?} contains a control character"));
    }
    if p.contains("//") {
        return Err(format!(
            "path pattern {p:?} contains \"//\"; request paths have runs of \"/\" collapsed"
        ));
    }
    if p.split('/').any(|seg| seg == "." || seg == "..") {
        return Err(format!("path pattern {p:?} contains a \".\" or \"..\" segment; request paths have them resolved"));
    }
    let b = p.as_bytes();
    for (i, _) in p.match_indices('%') {
        let hex = b
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        let octet = hex.and_then(|h| u8::from_str_radix(h, 16).ok());
        match octet {
            Some(o) if o.is_ascii_graphic() && o != b'%' => {
                return Err(format!(
                    "path pattern {p:?} contains %{}; request paths are matched decoded, write {:?} instead",
                    hex.unwrap_or_default(),
                    char::from(o)
                ))
            }
            Some(_) if hex.is_some_and(|h| h.bytes().any(|c| c.is_ascii_lowercase())) => {
                return Err(format!("path pattern {p:?}: write percent-escapes with uppercase hex"))
            }
            Some(_) => {}
            None => return Err(format!("path pattern {p:?} has an invalid percent-escape")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{Policy, PolicySource};
    use super::*;

    fn src(name: &str, text: &str) -> PolicySource {
        PolicySource {
            name: name.into(),
            text: text.into(),
        }
    }

    fn err(sources: &[PolicySource]) -> String {
        match Policy::from_sources(sources) {
            Ok(_) => panic!("expected an error"),
            Err(e) => e.to_string(),
        }
    }

    fn err1(text: &str) -> String {
        err(&[src("/p/a.toml", text)])
    }

    const RULE: &str = "[[rule]]\nid = \"r\"\nhosts = [\"a.example\"]\naction = \"allow\"\n";

    #[test]
    fn syntax_and_schema_errors_have_positions() {
        let e = err1("version = 1\n\n[[rule]]\nid = \"r\"\nhosts = [\"a\"\naction = \"allow\"\n");
        assert!(e.starts_with("/p/a.toml:6:1: "), "{e}");
        assert!(!e.contains('\n'), "{e}");
        let e = err1("version = 1\n[[rule]]\nid = \"r\"\nhots = [\"a\"]\naction = \"allow\"\n");
        assert!(
            e.starts_with("/p/a.toml:4:1: unknown field `hots`, expected one of"),
            "{e}"
        );
        let e = err1("version = 1\nfoo = 2\n");
        assert!(e.starts_with("/p/a.toml:2:1: unknown field `foo`"), "{e}");
        let e = err1("version = 1\n[[rule]]\nid = \"r\"\naction = \"allow\"\n");
        assert!(e.contains("/p/a.toml:2:1: missing field `hosts`"), "{e}");
        let e = err1("version = 1\nmode = \"loud\"\n");
        assert!(
            e.starts_with("/p/a.toml:2:8: unknown variant `loud`"),
            "{e}"
        );
        let e = err1(&format!("version = 1\n{RULE}priority = 3000000000\n"));
        assert!(e.starts_with("/p/a.toml:6:12: "), "{e}");
    }

    #[test]
    fn version() {
        assert_eq!(
            err1(RULE),
            "/p/a.toml: missing `version` (expected `version = 1`)"
        );
        assert_eq!(
            err1("version = 2\n"),
            "/p/a.toml:1:11: unsupported version 2 (expected 1)"
        );
    }

    #[test]
    fn rule_errors() {
        let cases = [
            ("hosts = [\"a*.b\"]", "6:10: rule `x`: invalid host pattern \"a*.b\": wildcards are only allowed"),
            ("hosts = [\"a.*.c\"]", "6:10: rule `x`: invalid host pattern \"a.*.c\""),
            ("hosts = []", "6:9: rule `x`: `hosts` must not be empty"),
            ("hosts = [\"a b\"]", "6:10: rule `x`: invalid host \"a b\": invalid character ' ' in host"),
            ("action = \"ask\"", "6:10: rule `x`: action \"ask\" is not supported yet"),
            ("action = \"Allow\"", "6:10: rule `x`: unknown action \"Allow\", expected \"allow\" or \"deny\""),
            ("rate = { per_minute = 10 }", "6:8: rule `x`: rate limits are not supported yet"),
            ("inject = { header = \"x\" }", "6:10: rule `x`: `inject` is not supported yet"),
            ("ports = [0]", "6:10: rule `x`: port 0 out of range 1..=65535"),
            ("ports = [443, 70000]", "6:15: rule `x`: port 70000 out of range"),
            ("ports = []", "6:9: rule `x`: `ports` must not be empty (omit the key to match any)"),
            ("methods = [\"GE T\"]", "6:12: rule `x`: invalid HTTP method \"GE T\""),
            ("paths = [\"admin/**\"]", "6:10: rule `x`: path pattern \"admin/**\" must start with \"/\""),
            ("paths = [\"/a/[b\"]", "6:10: rule `x`: invalid path glob \"/a/[b\": unclosed character class"),
            ("paths = [\"/a//b\"]", "6:10: rule `x`: path pattern \"/a//b\" contains \"//\""),
            ("paths = [\"/a/../b\"]", "6:10: rule `x`: path pattern \"/a/../b\" contains a \".\" or \"..\" segment"),
            ("paths = [\"/%61\"]", "6:10: rule `x`: path pattern \"/%61\" contains %61; request paths are matched decoded, write 'a' instead"),
            ("paths = [\"/%c3%a9\"]", "6:10: rule `x`: path pattern \"/%c3%a9\": write percent-escapes with uppercase hex"),
            ("paths = [\"/%zz\"]", "6:10: rule `x`: path pattern \"/%zz\" has an invalid percent-escape"),
        ];
        for (line, want) in cases {
            let key = line.split(' ').next().unwrap_or_default();
            // Replace the same key if the base rule has it, else append.
            let base = [
                "id = \"x\"",
                "hosts = [\"a.example\"]",
                "action = \"allow\"",
            ];
            let mut lines = vec!["version = 1", "", "[[rule]]"];
            lines.extend(base.iter().filter(|l| !l.starts_with(&format!("{key} "))));
            lines.insert(5, line);
            let text = lines.join("\n") + "\n";
            let e = err1(&text);
            assert!(
                e.starts_with(&format!("/p/a.toml:{want}")),
                "{line}\n got: {e}\n{text}"
            );
        }
        let e = err1("version = 1\n[[rule]]\nid = \"a/b\"\nhosts = [\"*\"]\naction = \"allow\"\n");
        assert!(
            e.starts_with("/p/a.toml:3:6: rule `a/b`: invalid id"),
            "{e}"
        );
        let long = "x".repeat(65);
        let e = err1(&format!(
            "version = 1\n[[rule]]\nid = \"{long}\"\nhosts = [\"*\"]\naction = \"allow\"\n"
        ));
        assert!(e.contains("invalid id"), "{e}");
    }

    #[test]
    fn cross_file_errors() {
        let a = src(
            "/p/a.toml",
            &format!("version = 1\ndefault = \"deny\"\n{RULE}"),
        );
        let b = src("/p/b.toml", &format!("version = 1\n\n{RULE}"));
        assert_eq!(
            err(&[a.clone(), b]),
            "/p/b.toml:4:6: duplicate rule id `r` (first defined at /p/a.toml:4:6)"
        );
        let c = src("/p/c.toml", "version = 1\ndefault = \"allow\"\n");
        assert_eq!(
            err(&[a.clone(), c]),
            "conflicting `default`: /p/a.toml:2:11 sets \"deny\" but /p/c.toml:2:11 sets \"allow\""
        );
        let d = src("/p/d.toml", "version = 1\nmode = \"enforce\"\n");
        let e = src("/p/e.toml", "version = 1\nmode = \"report\"\n");
        let msg = err(&[d, a.clone(), e]);
        assert!(
            msg.starts_with("conflicting `mode`: /p/d.toml:2:8"),
            "{msg}"
        );
        // Agreeing or omitted settings merge fine.
        let f = src("/p/f.toml", "version = 1\ndefault = \"deny\"\n");
        let p = Policy::from_sources(&[a, f]).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (p.default_action(), p.mode()),
            (Action::Deny, Mode::Enforce)
        );
        assert_eq!(err(&[]), "no policy files in (no sources given)");
    }
}
