//! A rule's `mcp = { tools, deny_tools, methods, prompts, resources, pin }`: what an MCP
//! client may ask of the servers the rule allows (issue 37). Names are matched with
//! `globset` globs (`*` and `?` match any character, `/` included: tool names have no
//! segments and methods are matched whole), as `paths` are, by the same crate.
//!
//! Absent lists allow everything; `deny_tools` beats `tools`. `initialize`, `ping` and
//! `notifications/*` are protocol housekeeping, always allowed, so `methods` cannot make a
//! session impossible to open.

use std::ops::Range;
use std::sync::Arc;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};
use serde::Deserialize;
use toml::Spanned;

use super::error::PolicyError;
use super::model::List;
use super::Action;

/// `mcp = { … }` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct McpFile {
    tools: Option<List<String>>,
    deny_tools: Option<List<String>>,
    methods: Option<List<String>>,
    prompts: Option<List<String>>,
    resources: Option<List<String>>,
    #[serde(default)]
    pin: bool,
}

/// One list of name globs, with the patterns kept for `ctl policy show` and explanations.
#[derive(Debug, Clone)]
pub(crate) struct NameSet {
    set: GlobSet,
    pub patterns: Box<[Box<str>]>,
}

/// Two sets are equal when written alike (the compiled set follows from the patterns).
impl PartialEq for NameSet {
    fn eq(&self, other: &NameSet) -> bool {
        self.patterns == other.patterns
    }
}
impl Eq for NameSet {}

impl NameSet {
    pub(crate) fn matches(&self, name: &str) -> bool {
        self.set.is_match(name)
    }
}

/// A rule's MCP section, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpRule {
    /// The tools it allows (`None`: all).
    pub(crate) tools: Option<NameSet>,
    pub(crate) deny_tools: Option<NameSet>,
    /// The JSON-RPC methods it allows besides the housekeeping ones (`None`: all).
    pub(crate) methods: Option<NameSet>,
    /// Prompt names `prompts/list` is filtered to and `prompts/get` may ask for.
    pub(crate) prompts: Option<NameSet>,
    /// Resource URIs `resources/list` is filtered to and `resources/read` may ask for.
    pub(crate) resources: Option<NameSet>,
    /// Tool definitions are pinned per server on first sight.
    pub pin: bool,
}

/// Why a name is refused by an [`McpRule`], in words that name the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpRefusal {
    /// A method `methods` does not list.
    Method,
    /// A tool `deny_tools` lists.
    ToolDenied,
    /// A tool `tools` does not list.
    ToolNotListed,
    /// A prompt `prompts` does not list.
    Prompt,
    /// A resource `resources` does not list.
    Resource,
}

impl McpRefusal {
    /// The list at fault, as the rule writes it.
    pub fn key(self) -> &'static str {
        match self {
            McpRefusal::Method => "mcp.methods",
            McpRefusal::ToolDenied => "mcp.deny_tools",
            McpRefusal::ToolNotListed => "mcp.tools",
            McpRefusal::Prompt => "mcp.prompts",
            McpRefusal::Resource => "mcp.resources",
        }
    }
}

impl McpRule {
    /// Whether a JSON-RPC method may be sent.
    pub fn method(&self, method: &str) -> Result<(), McpRefusal> {
        let housekeeping =
            method == "initialize" || method == "ping" || method.starts_with("notifications/");
        match &self.methods {
            Some(m) if !housekeeping && !m.matches(method) => Err(McpRefusal::Method),
            _ => Ok(()),
        }
    }

    /// Whether a tool may be listed and called.
    pub fn tool(&self, name: &str) -> Result<(), McpRefusal> {
        if self.deny_tools.as_ref().is_some_and(|d| d.matches(name)) {
            return Err(McpRefusal::ToolDenied);
        }
        match &self.tools {
            Some(t) if !t.matches(name) => Err(McpRefusal::ToolNotListed),
            _ => Ok(()),
        }
    }

    pub fn prompt(&self, name: &str) -> Result<(), McpRefusal> {
        match &self.prompts {
            Some(p) if !p.matches(name) => Err(McpRefusal::Prompt),
            _ => Ok(()),
        }
    }

    pub fn resource(&self, uri: &str) -> Result<(), McpRefusal> {
        match &self.resources {
            Some(r) if !r.matches(uri) => Err(McpRefusal::Resource),
            _ => Ok(()),
        }
    }

    /// Whether a list of `kind` ("tools", "prompts", "resources") answers need filtering.
    pub fn filters(&self, kind: &str) -> bool {
        match kind {
            "tools" => self.tools.is_some() || self.deny_tools.is_some() || self.pin,
            "prompts" => self.prompts.is_some(),
            "resources" => self.resources.is_some(),
            _ => false,
        }
    }

    /// One line for `ctl policy show` and explanations.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        let mut list = |key: &str, s: &Option<NameSet>| {
            if let Some(s) = s {
                parts.push(format!("{key}={}", s.patterns.join(",")));
            }
        };
        list("tools", &self.tools);
        list("deny_tools", &self.deny_tools);
        list("methods", &self.methods);
        list("prompts", &self.prompts);
        list("resources", &self.resources);
        if self.pin {
            parts.push("pin".into());
        }
        format!("mcp[{}]", parts.join(" "))
    }
}

/// Longest name pattern: policy text, kept small.
const MAX_PATTERN_LEN: usize = 256;

/// Compiles a rule's `mcp` (only allow and ask rules may carry one).
pub(crate) fn compile_mcp(
    mcp: Option<&Spanned<McpFile>>,
    action: Action,
    err: &dyn Fn(Range<usize>, String) -> PolicyError,
) -> Result<Option<Arc<McpRule>>, PolicyError> {
    let Some(mcp) = mcp else { return Ok(None) };
    if action == Action::Deny {
        return Err(err(
            mcp.span(),
            "`mcp` applies only to \"allow\" and \"ask\" rules (a deny rule refuses the whole request)"
                .into(),
        ));
    }
    let f = mcp.get_ref();
    let names = |key: &str, l: &Option<List<String>>| -> Result<Option<NameSet>, PolicyError> {
        l.as_ref()
            .map(|l| name_set(key, l).map_err(|(span, m)| err(span, m)))
            .transpose()
    };
    Ok(Some(Arc::new(McpRule {
        tools: names("tools", &f.tools)?,
        deny_tools: names("deny_tools", &f.deny_tools)?,
        methods: names("methods", &f.methods)?,
        prompts: names("prompts", &f.prompts)?,
        resources: names("resources", &f.resources)?,
        pin: f.pin,
    })))
}

fn name_set(key: &str, list: &List<String>) -> Result<NameSet, (Range<usize>, String)> {
    if list.get_ref().is_empty() {
        return Err((
            list.span(),
            format!("`mcp.{key}` is empty; leave it out to allow every name"),
        ));
    }
    let mut set = GlobSetBuilder::new();
    let mut patterns = Vec::with_capacity(list.get_ref().len());
    for p in list.get_ref() {
        let pattern = p.get_ref();
        if pattern.is_empty()
            || pattern.len() > MAX_PATTERN_LEN
            || pattern.chars().any(char::is_control)
        {
            return Err((
                p.span(),
                format!("`mcp.{key}` entry {pattern:?} must be 1..={MAX_PATTERN_LEN} printable characters"),
            ));
        }
        let glob = GlobBuilder::new(pattern)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| {
                (
                    p.span(),
                    format!("invalid `mcp.{key}` glob {pattern:?}: {}", e.kind()),
                )
            })?;
        set.add(glob);
        patterns.push(pattern.as_str().into());
    }
    let set = set
        .build()
        .map_err(|e| (list.span(), format!("invalid `mcp.{key}` globs: {e}")))?;
    Ok(NameSet {
        set,
        patterns: patterns.into_boxed_slice(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::error::Location;

    fn compile(toml_text: &str, action: Action) -> Result<Option<Arc<McpRule>>, String> {
        #[derive(Deserialize)]
        struct W {
            mcp: Spanned<McpFile>,
        }
        let w: W = toml::from_str(toml_text).map_err(|e| e.message().to_string())?;
        let err = |_span: Range<usize>, message: String| PolicyError::Rule {
            at: Location::file("t.toml"),
            rule: "r".into(),
            message,
        };
        compile_mcp(Some(&w.mcp), action, &err).map_err(|e| e.to_string())
    }

    #[test]
    fn tools_globs_allow_and_deny_tools_beats_them() {
        let r = compile(
            r#"mcp = { tools = ["search", "read_*"], deny_tools = ["read_secret*"], pin = true }"#,
            Action::Allow,
        )
        .expect("compiles")
        .expect("some");
        assert_eq!(r.tool("search"), Ok(()));
        assert_eq!(r.tool("read_file"), Ok(()));
        assert_eq!(r.tool("read_secrets"), Err(McpRefusal::ToolDenied));
        assert_eq!(r.tool("delete_repo"), Err(McpRefusal::ToolNotListed));
        assert!(r.pin);
        assert!(r.filters("tools"));
        assert!(!r.filters("prompts"));
    }

    #[test]
    fn methods_limit_all_but_housekeeping() {
        let r = compile(r#"mcp = { methods = ["tools/*"] }"#, Action::Allow)
            .expect("compiles")
            .expect("some");
        assert_eq!(r.method("tools/call"), Ok(()));
        assert_eq!(r.method("initialize"), Ok(()));
        assert_eq!(r.method("notifications/initialized"), Ok(()));
        assert_eq!(r.method("resources/read"), Err(McpRefusal::Method));
        // Without `tools`, every tool is allowed.
        assert_eq!(r.tool("anything"), Ok(()));
    }

    #[test]
    fn bad_sections_are_errors() {
        let unknown = compile(r#"mcp = { tool = ["x"] }"#, Action::Allow).expect_err("refused");
        assert!(unknown.contains("unknown field"), "{unknown}");
        let empty = compile(r#"mcp = { tools = [] }"#, Action::Allow).expect_err("refused");
        assert!(empty.contains("`mcp.tools` is empty"), "{empty}");
        let glob = compile(r#"mcp = { tools = ["a[b"] }"#, Action::Allow).expect_err("refused");
        assert!(glob.contains("invalid `mcp.tools` glob"), "{glob}");
        let deny = compile(r#"mcp = { pin = true }"#, Action::Deny).expect_err("refused");
        assert!(deny.contains("only to \"allow\" and \"ask\""), "{deny}");
    }
}
