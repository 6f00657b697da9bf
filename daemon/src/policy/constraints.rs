//! AgenShield `networkConstraints` as generated rules (ids `agenshield:<stem>:<key>`):
//! - `deniedHosts` → deny at [`CONSTRAINT_PRIORITY`], except hosts in `allowedHosts`
//!   (AgenShield exempts them);
//! - `allowedPorts` → deny of every other port, any host, at [`CONSTRAINT_PRIORITY`];
//! - `allowedHosts` → allow (on `allowedPorts` if given) at [`ALLOWED_HOSTS_PRIORITY`],
//!   below every ordinary rule, as AgenShield consults it only when no rule matched.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::json::Finder;
use super::model::{List, MatchDef, RuleDef};

/// Priority of the generated `deniedHosts` / `allowedPorts` denies: above ordinary rules.
pub const CONSTRAINT_PRIORITY: i32 = 1_000_000;
/// Priority of the generated `allowedHosts` allow: below ordinary rules.
pub const ALLOWED_HOSTS_PRIORITY: i32 = -1_000_000;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct NetworkConstraints {
    allowed_hosts: Option<Vec<String>>,
    denied_hosts: Option<Vec<String>>,
    allowed_ports: Option<Vec<u16>>,
}

/// The rules generated from `networkConstraints` (see the module docs).
pub(crate) fn rules(
    nc: NetworkConstraints,
    stem: &str,
    find: &Finder<'_>,
    rules: &mut Vec<RuleDef>,
) {
    let hosts_list = |key: &str, hosts: &[String]| -> List<String> {
        let key_span = find.key(key);
        let items = hosts
            .iter()
            .map(|h| Spanned::new(find.string(h, key_span.start), h.clone()))
            .collect();
        Spanned::new(key_span, items)
    };
    let allowed = nc.allowed_hosts.unwrap_or_default();
    let denied = nc.denied_hosts.unwrap_or_default();
    let ports = nc.allowed_ports.unwrap_or_default();
    let ports_span = find.key("allowedPorts");
    let port_list = Spanned::new(
        ports_span.clone(),
        ports
            .iter()
            .map(|&p| Spanned::new(ports_span.clone(), i64::from(p)))
            .collect(),
    );
    let mut rule = |name: &str, action: &str, priority, span: Range<usize>, m: MatchDef| {
        rules.push(RuleDef {
            secrets: None,
            swap: None,
            inject: None,
            sigv4: None,
            agents: None,
            tls: None,
            dlp: Default::default(),
            mcp: None,
            id: Spanned::new(span.clone(), format!("agenshield:{stem}:{name}")),
            action: Spanned::new(span, action.to_owned()),
            priority,
            rate: None,
            max_concurrent: None,
            budget: None,
            matchers: vec![m],
        });
    };
    if !denied.is_empty() {
        let list = hosts_list("deniedHosts", &denied);
        let except_hosts = hosts_list("allowedHosts", &allowed).into_inner();
        let m = MatchDef {
            except_hosts,
            ..MatchDef::hosts(list)
        };
        rule(
            "deniedHosts",
            "deny",
            CONSTRAINT_PRIORITY,
            find.key("deniedHosts"),
            m,
        );
    }
    if !ports.is_empty() {
        let any = Spanned::new(
            ports_span.clone(),
            vec![Spanned::new(ports_span.clone(), "*".to_owned())],
        );
        let m = MatchDef {
            ports: Some(port_list.clone()),
            ports_excluded: true,
            ..MatchDef::hosts(any)
        };
        rule("allowedPorts", "deny", CONSTRAINT_PRIORITY, ports_span, m);
    }
    if !allowed.is_empty() {
        let m = MatchDef {
            ports: (!ports.is_empty()).then_some(port_list),
            ..MatchDef::hosts(hosts_list("allowedHosts", &allowed))
        };
        rule(
            "allowedHosts",
            "allow",
            ALLOWED_HOSTS_PRIORITY,
            find.key("allowedHosts"),
            m,
        );
    }
}
