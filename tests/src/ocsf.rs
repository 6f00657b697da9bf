//! A small validator of OCSF events against the class definitions vendored from the OCSF
//! schema repository (`tests/data/ocsf-1.3.0/`, Apache-2.0, see its README): the class's
//! and its objects' attributes resolved as the schema server does (`extends`, `$include`,
//! the dictionary's types and enums), then for each event: every required attribute there
//! (a profile's only when the event names the profile), no attribute the class or object
//! does not define, every value of its dictionary type, every enum value one the schema
//! lists, `at_least_one` constraints held, and `class_uid`, `category_uid` and `type_uid`
//! consistent with the class and the activity.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// One attribute as a class or object defines it.
#[derive(Debug, Clone, Default)]
struct Attr {
    required: bool,
    /// From a profile: required only if the event applies it.
    profile: Option<String>,
    enum_keys: Vec<String>,
}

pub struct Ocsf {
    root: PathBuf,
    dict: Map<String, Value>,
    types: Map<String, Value>,
    categories: Map<String, Value>,
}

fn load(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

impl Ocsf {
    /// The vendored schema of `version` (e.g. "1.3.0").
    pub fn vendored(version: &str) -> Ocsf {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("data")
            .join(format!("ocsf-{version}"));
        let v = load(&root.join("version.json"));
        assert_eq!(v["version"], version, "the vendored schema's version");
        let dict = load(&root.join("dictionary.json"));
        Ocsf {
            dict: dict["attributes"].as_object().cloned().unwrap_or_default(),
            types: dict["types"]["attributes"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
            categories: load(&root.join("categories.json"))["attributes"]
                .as_object()
                .cloned()
                .unwrap_or_default(),
            root,
        }
    }

    /// Attributes of a definition file, with what it extends and includes.
    fn attrs(&self, rel: &str) -> BTreeMap<String, Attr> {
        let d = load(&self.root.join(rel));
        let mut out = BTreeMap::new();
        if let Some(ext) = d["extends"].as_str() {
            let parent = if rel.starts_with("objects/") {
                format!("objects/{ext}.json")
            } else if ext == "base_event" {
                "events/base_event.json".to_string()
            } else {
                format!("events/{ext}/{ext}.json")
            };
            if self.root.join(&parent).exists() {
                for (k, a) in self.attrs(&parent) {
                    out.insert(k, a);
                }
            }
        }
        let Some(attrs) = d["attributes"].as_object() else {
            return out;
        };
        let includes: Vec<String> = match &attrs.get("$include") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => Vec::new(),
        };
        for inc in includes {
            let profile = inc
                .strip_prefix("profiles/")
                .map(|p| p.trim_end_matches(".json").to_string());
            let inc_def = load(&self.root.join(&inc));
            for (k, v) in inc_def["attributes"]
                .as_object()
                .cloned()
                .unwrap_or_default()
            {
                let mut a = self.attr(&k, &v, out.get(&k));
                a.profile = profile.clone();
                out.insert(k, a);
            }
        }
        for (k, v) in attrs {
            if k == "$include" {
                continue;
            }
            let mut a = self.attr(k, v, out.get(k));
            // The class's own definition settles the requirement (no longer a profile's).
            if out.get(k).is_some_and(|o| o.profile.is_some()) && v.get("requirement").is_some() {
                a.profile = None;
            }
            out.insert(k.clone(), a);
        }
        out
    }

    fn attr(&self, name: &str, v: &Value, before: Option<&Attr>) -> Attr {
        let mut a = before.cloned().unwrap_or_default();
        if let Some(r) = v["requirement"].as_str() {
            a.required = r == "required";
        }
        let mut keys: Vec<String> = self.dict[name]["enum"]
            .as_object()
            .map(|e| e.keys().cloned().collect())
            .unwrap_or_default();
        if let Some(e) = v["enum"].as_object() {
            keys.extend(e.keys().cloned());
        }
        keys.extend(a.enum_keys.iter().cloned());
        keys.sort();
        keys.dedup();
        a.enum_keys = keys;
        a
    }

    /// Checks `event` against its class; panics naming every violation found.
    pub fn validate(&self, event: &Value) {
        let mut errors = Vec::new();
        let class_uid = event["class_uid"].as_u64().unwrap_or(u64::MAX);
        let (file, category) = match class_uid {
            0 => ("events/base_event.json", None),
            4001 => ("events/network/network_activity.json", Some("network")),
            4002 => ("events/network/http.json", Some("network")),
            4003 => ("events/network/dns.json", Some("network")),
            other => panic!("class_uid {other} is not one this validator has vendored"),
        };
        let def = load(&self.root.join(file));
        let category_uid = category.map_or(0, |c| self.categories[c]["uid"].as_u64().unwrap_or(0));
        let uid = category_uid * 1000 + def["uid"].as_u64().unwrap_or(0);
        if uid != class_uid {
            errors.push(format!("class_uid {class_uid}, the class says {uid}"));
        }
        if event["category_uid"].as_u64() != Some(category_uid) {
            errors.push(format!(
                "category_uid {}, want {category_uid}",
                event["category_uid"]
            ));
        }
        let activity = event["activity_id"].as_u64().unwrap_or(u64::MAX);
        if event["type_uid"].as_u64() != Some(class_uid * 100 + activity) {
            errors.push(format!(
                "type_uid {} for activity {activity}",
                event["type_uid"]
            ));
        }
        let profiles: Vec<String> = event["metadata"]["profiles"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default();
        let attrs = self.attrs(file);
        self.check_object(event, &attrs, &profiles, file, &mut errors);
        assert!(
            errors.is_empty(),
            "OCSF {file}: {errors:#?}\nevent: {event:#}"
        );
    }

    fn check_object(
        &self,
        v: &Value,
        attrs: &BTreeMap<String, Attr>,
        profiles: &[String],
        at: &str,
        errors: &mut Vec<String>,
    ) {
        let Some(obj) = v.as_object() else {
            errors.push(format!("{at}: not an object"));
            return;
        };
        for (k, a) in attrs {
            let applies = a.profile.as_ref().is_none_or(|p| profiles.contains(p));
            if a.required && applies && !obj.contains_key(k) {
                errors.push(format!("{at}: required {k} missing"));
            }
        }
        for (k, val) in obj {
            let Some(mut a) = attrs.get(k).cloned() else {
                errors.push(format!("{at}: {k} is not an attribute here"));
                continue;
            };
            let path = format!("{at}.{k}");
            // The schema server fills these per class (the include lists only 0); their
            // consistency with the class is checked in `validate`.
            if matches!(k.as_str(), "class_uid" | "category_uid" | "type_uid") {
                a.enum_keys.clear();
            }
            let d = &self.dict[k.as_str()];
            if d.is_null() {
                errors.push(format!("{path}: not in the dictionary"));
                continue;
            }
            let items: Vec<&Value> = if d["is_array"] == true {
                match val.as_array() {
                    Some(a) => a.iter().collect(),
                    None => {
                        errors.push(format!("{path}: not an array"));
                        continue;
                    }
                }
            } else {
                vec![val]
            };
            for item in items {
                self.check_value(item, d, &a, profiles, &path, errors);
            }
        }
    }

    fn check_value(
        &self,
        v: &Value,
        d: &Value,
        a: &Attr,
        profiles: &[String],
        path: &str,
        errors: &mut Vec<String>,
    ) {
        let ty = d["type"].as_str().unwrap_or("");
        if ty == "object" || ty == "object_t" {
            if !v.is_object() {
                errors.push(format!("{path}: not an object"));
            }
            return;
        }
        if !ty.ends_with("_t") {
            let rel = format!("objects/{ty}.json");
            let attrs = self.attrs(&rel);
            self.check_object(v, &attrs, profiles, path, errors);
            let def = load(&self.root.join(&rel));
            self.check_constraints(v, &def, path, errors);
            return;
        }
        let base = self.base_type(ty);
        let ok = match base.as_str() {
            "integer_t" | "long_t" | "timestamp_t" => v.is_i64() || v.is_u64(),
            "float_t" => v.is_number(),
            "boolean_t" => v.is_boolean(),
            "string_t" => v.is_string(),
            "json_t" => true,
            other => {
                errors.push(format!("{path}: type {other} not known to the validator"));
                true
            }
        };
        if !ok {
            errors.push(format!("{path}: {v} is not a {ty}"));
        }
        if ty == "port_t" && v.as_u64().is_none_or(|p| p > 65535) {
            errors.push(format!("{path}: {v} is not a port"));
        }
        if ty == "ip_t"
            && v.as_str()
                .is_none_or(|s| s.parse::<std::net::IpAddr>().is_err())
        {
            errors.push(format!("{path}: {v} is not an IP address"));
        }
        if !a.enum_keys.is_empty() {
            let key = match v {
                Value::Number(n) => n.to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            if !a.enum_keys.contains(&key) {
                errors.push(format!("{path}: {key} is not one of {:?}", a.enum_keys));
            }
        }
    }

    fn check_constraints(&self, v: &Value, def: &Value, path: &str, errors: &mut Vec<String>) {
        if let Some(any) = def["constraints"]["at_least_one"].as_array() {
            let names: Vec<&str> = any.iter().filter_map(Value::as_str).collect();
            if !names.iter().any(|n| v.get(n).is_some()) {
                errors.push(format!("{path}: needs at least one of {names:?}"));
            }
        }
    }

    /// A dictionary type down to its primitive (`port_t` → `integer_t`).
    fn base_type(&self, ty: &str) -> String {
        let mut t = ty.to_string();
        for _ in 0..8 {
            match self.types.get(&t).and_then(|d| d["type"].as_str()) {
                Some(next) if next != t => t = next.to_string(),
                _ => break,
            }
        }
        t
    }
}
