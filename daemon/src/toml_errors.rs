//! serde's "invalid type" messages, as the config and policy files report them, finished with
//! the form that was wanted and an example of it: `hosts = "x"` is answered with
//! `write a list in brackets, e.g. ["x"]`, not only "expected a sequence".

/// `message` with what to write instead, when it is one of serde's type mismatches.
pub(crate) fn explain(message: &str) -> String {
    let Some(rest) = message.strip_prefix("invalid type: ") else {
        return message.to_string();
    };
    let Some((got, wanted)) = rest.split_once(", expected ") else {
        return message.to_string();
    };
    let text = got
        .strip_prefix("string ")
        .map(|s| s.trim_matches('"').to_string());
    let number = got
        .strip_prefix("integer `")
        .and_then(|s| s.strip_suffix('`'))
        .map(str::to_string);
    let hint = match (wanted, &text, &number) {
        ("a sequence", Some(t), _) => format!("write a list in brackets, e.g. [\"{t}\"]"),
        ("a sequence", None, Some(n)) => format!("write a list in brackets, e.g. [{n}]"),
        ("a sequence", _, _) => "write a list in brackets, e.g. [\"a\", \"b\"]".into(),
        ("a duration", _, Some(n)) => {
            format!("write a number with a unit in quotes, e.g. \"{n}s\" or \"{n}ms\"")
        }
        ("a string", _, Some(n)) => format!("write it in quotes, e.g. \"{n}\""),
        ("a map", _, _) => "write a table, e.g. { name = [\"10.0.0.5\"] } or a [section]".into(),
        ("a boolean", Some(t), _) => format!("write true or false without quotes (not \"{t}\")"),
        (w, Some(t), _) if is_integer(w) && t.trim().parse::<i64>().is_ok() => {
            format!("write the number without quotes, e.g. {}", t.trim())
        }
        (w, _, _) if is_integer(w) => "write a whole number without quotes, e.g. 443".into(),
        _ => return message.to_string(),
    };
    format!("{message}: {hint}")
}

fn is_integer(wanted: &str) -> bool {
    matches!(
        wanted,
        "i8" | "i16" | "i32" | "i64" | "u8" | "u16" | "u32" | "u64" | "usize" | "isize"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_mismatch_says_the_right_form_with_an_example() {
        for (serde, hint) in [
            (
                "invalid type: string \"x\", expected a sequence",
                "write a list in brackets, e.g. [\"x\"]",
            ),
            (
                "invalid type: string \"443\", expected i64",
                "write the number without quotes, e.g. 443",
            ),
            (
                "invalid type: integer `90`, expected a duration",
                "e.g. \"90s\"",
            ),
            (
                "invalid type: integer `5201`, expected a string",
                "write it in quotes, e.g. \"5201\"",
            ),
            (
                "invalid type: string \"x\", expected a map",
                "write a table",
            ),
        ] {
            let said = explain(serde);
            assert!(said.starts_with(serde), "{said}");
            assert!(said.contains(hint), "{said}");
        }
        assert_eq!(explain("unknown field `x`"), "unknown field `x`");
    }
}
