//! The proxy's own resolver: a static hosts table first, then DNS through hickory.
//!
//! Names are always looked up as fully qualified, so a name the agent supplies is never
//! expanded with the host's search domains.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use hickory_resolver::TokioResolver;

use crate::config::{parse_nameserver, ResolverConfig as Settings};

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("{host}: no such host")]
    NotFound { host: String },
    #[error("{host}: DNS lookup failed: {reason}")]
    Failed { host: String, reason: String },
    #[error("resolver set-up failed: {0}")]
    Setup(String),
}

pub struct Resolver {
    hosts: HashMap<String, Vec<IpAddr>>,
    dns: TokioResolver,
}

impl Resolver {
    pub fn new(settings: &Settings) -> Result<Resolver, ResolveError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if settings.nameservers.is_empty() {
            TokioResolver::builder(provider).map_err(|e| {
                ResolveError::Setup(format!(
                    "reading the system DNS configuration: {e} (set resolver.nameservers)"
                ))
            })?
        } else {
            let mut servers = Vec::new();
            for ns in &settings.nameservers {
                let sa = parse_nameserver(ns).map_err(|e| ResolveError::Setup(e.to_string()))?;
                let mut udp = ConnectionConfig::udp();
                udp.port = sa.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = sa.port();
                servers.push(NameServerConfig::new(sa.ip(), true, vec![udp, tcp]));
            }
            TokioResolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
        };
        let opts = builder.options_mut();
        opts.timeout = Duration::from_secs(3);
        opts.attempts = 2;
        let dns = builder
            .build()
            .map_err(|e| ResolveError::Setup(e.to_string()))?;
        let hosts = settings
            .hosts
            .iter()
            .map(|(name, addrs)| (normalize(name), addrs.clone()))
            .collect();
        Ok(Resolver { hosts, dns })
    }

    /// Addresses for `host` (a name or an IP literal, IPv6 with or without brackets).
    pub(crate) async fn resolve(&self, host: &str) -> Result<Vec<IpAddr>, ResolveError> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(vec![ip]);
        }
        let name = normalize(host);
        if let Some(addrs) = self.hosts.get(&name) {
            return Ok(addrs.clone());
        }
        let fqdn = format!("{name}.");
        match self.dns.lookup_ip(fqdn.as_str()).await {
            Ok(lookup) => {
                let addrs: Vec<IpAddr> = lookup.iter().collect();
                if addrs.is_empty() {
                    Err(ResolveError::NotFound { host: name })
                } else {
                    Ok(addrs)
                }
            }
            Err(e) if e.is_no_records_found() => Err(ResolveError::NotFound { host: name }),
            Err(e) => Err(ResolveError::Failed {
                host: name,
                reason: e.to_string(),
            }),
        }
    }
}

/// What our resolver says of one question (the DNS stub's view).
#[derive(Debug)]
pub(crate) enum Answer {
    /// The answer section: the records, CNAME chain included.
    Records(Vec<Record>),
    /// The name exists but has no record of the type.
    NoData,
    /// The name does not exist.
    NxDomain,
}

/// The TTL of answers from the static hosts table.
const STATIC_TTL: u32 = 60;

impl Resolver {
    /// The records of type `rtype` for `name` (normalized: lowercase, no trailing dot), from
    /// the static hosts table (which knows addresses only) or from DNS.
    pub(crate) async fn records(
        &self,
        name: &str,
        rtype: RecordType,
    ) -> Result<Answer, ResolveError> {
        let fqdn = Name::from_ascii(format!("{name}.")).map_err(|e| ResolveError::Failed {
            host: name.into(),
            reason: e.to_string(),
        })?;
        if let Some(addrs) = self.hosts.get(name) {
            let records: Vec<Record> = addrs
                .iter()
                .filter_map(|ip| match (ip, rtype) {
                    (IpAddr::V4(v4), RecordType::A) => Some(RData::A((*v4).into())),
                    (IpAddr::V6(v6), RecordType::AAAA) => Some(RData::AAAA((*v6).into())),
                    _ => None,
                })
                .map(|data| Record::from_rdata(fqdn.clone(), STATIC_TTL, data))
                .collect();
            return Ok(if records.is_empty() {
                Answer::NoData
            } else {
                Answer::Records(records)
            });
        }
        match self.dns.lookup(fqdn, rtype).await {
            Ok(lookup) if lookup.answers().is_empty() => Ok(Answer::NoData),
            Ok(lookup) => Ok(Answer::Records(lookup.answers().to_vec())),
            Err(e) if e.is_nx_domain() => Ok(Answer::NxDomain),
            Err(e) if e.is_no_records_found() => Ok(Answer::NoData),
            Err(e) => Err(ResolveError::Failed {
                host: name.into(),
                reason: e.to_string(),
            }),
        }
    }
}

fn normalize(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolver(hosts: &[(&str, &str)]) -> Resolver {
        let mut s = Settings {
            // Nothing listens on the discard port: a query that leaks past the table fails fast.
            nameservers: vec!["127.0.0.1:9".into()],
            ..Default::default()
        };
        for (n, a) in hosts {
            s.hosts
                .insert((*n).into(), vec![a.parse().expect("test addr")]);
        }
        Resolver::new(&s).expect("resolver")
    }

    #[tokio::test]
    async fn static_table_wins_and_is_case_and_dot_insensitive() {
        let r = resolver(&[("Upstream.Test", "127.0.0.9")]);
        let want: Vec<IpAddr> = vec!["127.0.0.9".parse().expect("ip")];
        assert_eq!(r.resolve("upstream.test").await.expect("found"), want);
        assert_eq!(r.resolve("UPSTREAM.TEST.").await.expect("found"), want);
    }

    #[tokio::test]
    async fn ip_literals_resolve_to_themselves() {
        let r = resolver(&[]);
        let v6: IpAddr = "::1".parse().expect("ip");
        assert_eq!(r.resolve("[::1]").await.expect("literal"), vec![v6]);
        assert_eq!(r.resolve("::1").await.expect("literal"), vec![v6]);
    }

    #[tokio::test]
    async fn unknown_name_fails_without_leaving_loopback() {
        let r = resolver(&[]);
        assert!(r.resolve("nowhere.test").await.is_err());
    }
}
