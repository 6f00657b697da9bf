//! The audit log as a reviewer reads it: its lines, checked against the published schema
//! (`docs/audit.schema.json`), so the documented format and the written one cannot drift.

use std::path::Path;

use serde_json::Value;

/// Every line of the audit log at `path`, parsed (a line that is not JSON fails the test).
pub fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Fails with every violation if a line of format 2 does not match the schema.
pub fn assert_matches_schema(lines: &[Value]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/audit.schema.json");
    let text = std::fs::read_to_string(&path).expect("docs/audit.schema.json");
    let schema: Value = serde_json::from_str(&text).expect("the schema is JSON");
    let validator = jsonschema::draft202012::new(&schema).expect("a valid JSON Schema");
    let mut problems = Vec::new();
    for line in lines.iter().filter(|l| l["v"] == 2) {
        for e in validator.iter_errors(line) {
            problems.push(format!("{e} at {} in {line}", e.instance_path()));
        }
    }
    assert!(
        problems.is_empty(),
        "audit lines off the schema:\n{}",
        problems.join("\n")
    );
    assert!(
        lines.iter().any(|l| l["v"] == 2),
        "no line of format 2 to check"
    );
}
