//! Whether a JSON text names a key twice in one object, at any depth.
//!
//! A body allowed whole is forwarded as the agent wrote it, and the proxy decides on what
//! serde_json reads, which keeps the last of two equal keys. A server whose parser keeps the
//! first (or refuses) would read another tool, prompt or method than the one decided:
//! `{"name":"allowed","name":"refused"}`. JSON-RPC never needs a key twice (RFC 8259: names
//! SHOULD be unique), so such a body is refused rather than read one way. Keys are compared
//! as decoded (`"na\u006de"` is `"name"`), as any parser would see them.

use std::collections::HashSet;
use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// `Err` with serde_json's message (naming the key and where) if some object in `bytes`
/// names a key twice, or if `bytes` is not JSON.
pub(crate) fn check(bytes: &[u8]) -> Result<(), serde_json::Error> {
    serde_json::from_slice::<Unique>(bytes).map(|_| ())
}

/// Any JSON value, read only to find a repeated key.
struct Unique;

impl<'de> Deserialize<'de> for Unique {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Unique, D::Error> {
        d.deserialize_any(UniqueVisitor)
    }
}

struct UniqueVisitor;

impl<'de> Visitor<'de> for UniqueVisitor {
    type Value = Unique;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
        Ok(Unique)
    }
    fn visit_unit<E>(self) -> Result<Unique, E> {
        Ok(Unique)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
        while seq.next_element::<Unique>()?.is_some() {}
        Ok(Unique)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            if !seen.insert(key.clone()) {
                let shown: String = key.chars().take(64).collect();
                return Err(de::Error::custom(format_args!(
                    "the key `{}` appears twice in one object",
                    shown.escape_debug()
                )));
            }
            map.next_value::<Unique>()?;
        }
        Ok(Unique)
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn a_key_named_twice_in_one_object_is_found_at_any_depth_and_as_decoded() {
        let twice: [&[u8]; 5] = [
            br#"{"a":1,"a":2}"#,
            br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ok","name":"no"}}"#,
            br#"[{"jsonrpc":"2.0","method":"x"},{"jsonrpc":"2.0","method":"x","method":"y"}]"#,
            br#"{"params":{"name":"ok","na\u006de":"no"}}"#,
            br#"{"a":{"b":[{"c":1,"c":1}]}}"#,
        ];
        for t in twice {
            let e = check(t).expect_err(std::str::from_utf8(t).unwrap_or("?"));
            assert!(e.to_string().contains("appears twice"), "{e}");
        }
    }

    #[test]
    fn the_same_key_in_different_objects_and_any_json_is_fine() {
        let fine: [&[u8]; 5] = [
            br#"{"a":{"a":1},"b":{"a":2}}"#,
            br#"[{"name":"x"},{"name":"x"}]"#,
            br#"{"jsonrpc":"2.0","id":"7","method":"tools/call","params":{"name":"search","arguments":{"q":"a","n":1.5,"t":true,"z":null}}}"#,
            b"[]",
            br#""just a string""#,
        ];
        for t in fine {
            check(t).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(t)));
        }
        assert!(check(b"{\"a\":").is_err(), "not JSON");
    }
}
