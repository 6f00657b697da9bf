//! Values the config takes in one particular form (an address, an address range, a duration,
//! a table of names), read with errors that show that form with an example: serde's own say
//! only "invalid socket address syntax" or "expected a duration".

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use ipnet::IpNet;
use serde::de::Error as _;
use serde::{Deserialize, Deserializer};
use toml::Value;

/// A value not in the form its key takes.
#[derive(Debug, thiserror::Error)]
pub enum FormError {
    #[error(
        "{text:?} is not IP:port; write the address, e.g. \"127.0.0.1:{port}\" \
         (\"[::1]:{port}\" for IPv6; a name such as localhost is not looked up)"
    )]
    NotAnAddress { text: String, port: u16 },
    #[error(
        "{0:?} is not an IP address or IP:port, e.g. \"10.0.0.53\" or \"10.0.0.53:5353\" (a \
         name is not looked up)"
    )]
    NotANameserver(String),
}

/// `"IP:port"`.
pub(super) fn socket_addr_text(text: &str) -> Result<SocketAddr, FormError> {
    text.parse().map_err(|_| FormError::NotAnAddress {
        text: text.to_string(),
        // The port as written, when there is one, makes the example.
        port: text
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .unwrap_or(15080),
    })
}

/// `IP` (port 53) or `IP:port`.
pub fn parse_nameserver(s: &str) -> Result<SocketAddr, FormError> {
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(sa);
    }
    s.parse::<IpAddr>()
        .map(|ip| SocketAddr::new(ip, 53))
        .map_err(|_| FormError::NotANameserver(s.to_string()))
}

fn string<E: serde::de::Error>(v: Value, form: &str) -> Result<String, E> {
    match v {
        Value::String(s) => Ok(s),
        other => Err(E::custom(format!(
            "{other} is not {form}; write it in quotes"
        ))),
    }
}

fn list<E: serde::de::Error>(v: Value, example: &str) -> Result<Vec<Value>, E> {
    match v {
        Value::Array(a) => Ok(a),
        other => Err(E::custom(format!(
            "expected a list in brackets, e.g. {example}, not {other}"
        ))),
    }
}

/// `"IP:port"`.
pub(super) fn socket_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    let text = string(Value::deserialize(d)?, "IP:port (e.g. \"127.0.0.1:15080\")")?;
    socket_addr_text(&text).map_err(D::Error::custom)
}

/// An optional `"IP:port"` (the key may be left out).
pub(super) fn opt_socket_addr<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<SocketAddr>, D::Error> {
    socket_addr(d).map(Some)
}

/// `["IP:port", …]`.
pub(super) fn socket_addrs<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<SocketAddr>>, D::Error> {
    let items = list(
        Value::deserialize(d)?,
        "[\"127.0.0.1:15001\", \"[::1]:15001\"]",
    )?;
    items
        .into_iter()
        .map(|v| {
            let text = string(v, "IP:port (e.g. \"127.0.0.1:15001\")")?;
            socket_addr_text(&text).map_err(D::Error::custom)
        })
        .collect::<Result<_, _>>()
        .map(Some)
}

/// `"IP:port"` or `["IP:port", …]`.
pub(super) fn one_or_many_addrs<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<Vec<SocketAddr>>, D::Error> {
    match Value::deserialize(d)? {
        Value::String(s) => socket_addr_text(&s)
            .map(|a| Some(vec![a]))
            .map_err(D::Error::custom),
        v => socket_addrs(v).map_err(|e| D::Error::custom(e.to_string())),
    }
}

/// `["IP/prefix", …]`.
pub(super) fn ip_nets<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let items = list(Value::deserialize(d)?, "[\"10.99.0.0/24\"]")?;
    items
        .into_iter()
        .map(|v| {
            let text = string(v, "an address range (e.g. \"10.99.0.0/24\")")?;
            text.parse::<IpNet>().map_err(|_| {
                let hint = match text.parse::<IpAddr>() {
                    Ok(ip) => format!(
                        "for that one address write \"{ip}/{}\"",
                        if ip.is_ipv4() { 32 } else { 128 }
                    ),
                    Err(_) => "the prefix is at most 32 for IPv4, 128 for IPv6".into(),
                };
                D::Error::custom(format!(
                    "{text:?} is not an address range; write IP/prefix, e.g. \
                     \"10.99.0.0/24\" ({hint})"
                ))
            })
        })
        .collect()
}

/// A duration with its unit: `"90s"`, `"500ms"`, `"5m"`, `"1h"`.
pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = match Value::deserialize(d)? {
        Value::String(s) => s,
        Value::Integer(n) => {
            return Err(D::Error::custom(format!(
                "{n} is not a duration; write a number with a unit, in quotes, e.g. \"{n}s\" \
                 or \"{n}ms\""
            )))
        }
        other => {
            return Err(D::Error::custom(format!(
                "{other} is not a duration; write a number with a unit, in quotes, e.g. \"90s\""
            )))
        }
    };
    humantime::parse_duration(&text).map_err(|e| {
        let example = if text.trim().parse::<u64>().is_ok() {
            format!("\"{}s\"", text.trim())
        } else {
            "\"90s\"".to_string()
        };
        D::Error::custom(format!(
            "{text:?} is not a duration ({e}); write a number with a unit, e.g. {example}, \
             \"500ms\", \"5m\", \"1h\""
        ))
    })
}

/// `[resolver.hosts]`: `"name" = ["address", …]`.
pub(super) fn hosts<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, Vec<IpAddr>>, D::Error> {
    let example = "[resolver.hosts] then \"api.example.com\" = [\"10.0.0.5\"]";
    let table = match Value::deserialize(d)? {
        Value::Table(t) => t,
        other => {
            return Err(D::Error::custom(format!(
                "expected a table of names and their addresses, e.g. {example}, not {other}"
            )))
        }
    };
    table
        .into_iter()
        .map(|(name, v)| {
            let addrs = match v {
                Value::Array(a) => a,
                other => {
                    return Err(D::Error::custom(format!(
                        "{name:?}: expected a list of addresses, e.g. \"{name}\" = \
                         [\"10.0.0.5\"], not {other}"
                    )))
                }
            };
            let addrs = addrs
                .into_iter()
                .map(|a| match a.as_str().map(str::parse::<IpAddr>) {
                    Some(Ok(ip)) => Ok(ip),
                    _ => Err(D::Error::custom(format!(
                        "{name:?}: {a} is not an IP address, e.g. \"10.0.0.5\" or \"fd00::5\""
                    ))),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((name, addrs))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)] // read through Debug in failures only
    struct T {
        #[serde(default, deserialize_with = "opt_socket_addr")]
        addr: Option<SocketAddr>,
        #[serde(default, deserialize_with = "ip_nets")]
        nets: Vec<IpNet>,
        #[serde(default, deserialize_with = "opt_duration")]
        wait: Option<Duration>,
        #[serde(default, deserialize_with = "hosts")]
        hosts: BTreeMap<String, Vec<IpAddr>>,
    }

    fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        duration(d).map(Some)
    }

    fn err(text: &str) -> String {
        toml::from_str::<T>(text).expect_err(text).to_string()
    }

    #[test]
    fn each_form_is_read_and_each_mistake_answered_with_an_example() {
        let ok: T = toml::from_str(
            "addr = \"127.0.0.1:1\"\nnets = [\"10.0.0.0/8\"]\nwait = \"90s\"\n[hosts]\n\"a.test\" = [\"10.0.0.5\"]\n",
        )
        .expect("valid");
        assert_eq!(ok.wait, Some(Duration::from_secs(90)));
        assert_eq!(ok.hosts["a.test"].len(), 1);
        for (text, said) in [
            (
                "addr = \"localhost:27080\"",
                "write the address, e.g. \"127.0.0.1:27080\"",
            ),
            (
                "nets = [\"10.0.0.0/33\"]",
                "e.g. \"10.99.0.0/24\" (the prefix is at most 32",
            ),
            (
                "nets = [\"10.0.0.1\"]",
                "for that one address write \"10.0.0.1/32\"",
            ),
            ("wait = \"90\"", "e.g. \"90s\""),
            (
                "wait = 90",
                "90 is not a duration; write a number with a unit, in quotes, e.g. \"90s\"",
            ),
            (
                "hosts = \"x\"",
                "expected a table of names and their addresses, e.g. [resolver.hosts]",
            ),
            (
                "[hosts]\n\"a\" = \"10.0.0.5\"",
                "expected a list of addresses",
            ),
            (
                "[hosts]\n\"a\" = [\"nope\"]",
                "is not an IP address, e.g. \"10.0.0.5\"",
            ),
        ] {
            let e = err(text);
            assert!(e.contains(said), "{text}: {e}");
        }
    }
}
