//! One result of `doctor`: what was checked, how it came out, and the fix when it failed.

use serde::Serialize;

/// How a check came out. Ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not checked here, and why (not root, no audit log, …).
    Skipped,
    /// Works, but something is off that the operator should know.
    Warn,
    /// Will not work: the agent's tools refuse our leaves, or nothing is intercepted.
    Fail,
}

impl Status {
    pub fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Skipped => "skip",
            Status::Warn => "WARN",
            Status::Fail => "FAIL",
        }
    }
}

/// The part of the installation a finding is about; the report's sections, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Area {
    Config,
    Firewall,
    Daemon,
    CaFiles,
    Environment,
    Runtime,
    RejectedCa,
}

impl Area {
    pub fn title(self) -> &'static str {
        match self {
            Area::Config => "configuration",
            Area::Firewall => "firewall",
            Area::Daemon => "daemon",
            Area::CaFiles => "CA files",
            Area::Environment => "the agent's environment",
            Area::Runtime => "runtimes: will each trust the AgenShield CA?",
            Area::RejectedCa => "clients that rejected the AgenShield CA",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub area: Area,
    /// What was checked: `wget`, `ca.pem`, `login shell (su -l)`, a host name.
    pub subject: String,
    pub status: Status,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    pub fn ok(area: Area, subject: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(area, subject, Status::Ok, detail, None)
    }

    pub fn skipped(area: Area, subject: impl Into<String>, why: impl Into<String>) -> Finding {
        Finding::new(area, subject, Status::Skipped, why, None)
    }

    pub fn warn(
        area: Area,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Finding {
        Finding::new(area, subject, Status::Warn, detail, fix)
    }

    pub fn fail(
        area: Area,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(area, subject, Status::Fail, detail, Some(fix.into()))
    }

    fn new(
        area: Area,
        subject: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
        fix: Option<String>,
    ) -> Finding {
        Finding {
            area,
            subject: subject.into(),
            status,
            detail: detail.into(),
            fix,
        }
    }
}

/// Every finding, and the verdict.
#[derive(Debug, Serialize)]
pub struct Report {
    /// No check failed (warnings and skips allowed).
    pub ok: bool,
    pub failed: usize,
    pub warnings: usize,
    pub skipped: usize,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(mut findings: Vec<Finding>) -> Report {
        // Stable: within a section, findings keep the order they were made in.
        findings.sort_by_key(|f| f.area);
        // A fix works as written: `agenshield` by its full path where the name finds nothing.
        for f in &mut findings {
            f.fix = f
                .fix
                .take()
                .map(|fix| crate::cmd::invocation::rewrite(&fix));
        }
        let count = |s: Status| findings.iter().filter(|f| f.status == s).count();
        let failed = count(Status::Fail);
        Report {
            ok: failed == 0,
            failed,
            warnings: count(Status::Warn),
            skipped: count(Status::Skipped),
            findings,
        }
    }

    /// The report for a person: a section per area, a line per finding, its fix under it.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let mut area = None;
        for f in &self.findings {
            if area != Some(f.area) {
                if area.is_some() {
                    out.push('\n');
                }
                out.push_str(f.area.title());
                out.push('\n');
                area = Some(f.area);
            }
            out.push_str(&format!(
                "  {:<4}  {}: {}\n",
                f.status.label(),
                f.subject,
                f.detail
            ));
            if let Some(fix) = &f.fix {
                out.push_str(&format!("        fix: {fix}\n"));
            }
        }
        out.push_str(&format!(
            "\n{}: {} failed, {} warnings, {} skipped\n",
            if self.ok { "ok" } else { "NOT OK" },
            self.failed,
            self.warnings,
            self.skipped
        ));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_groups_by_area_and_fails_only_on_failures() {
        let r = Report::new(vec![
            Finding::fail(Area::Runtime, "wget", "no CA", "add it"),
            Finding::ok(Area::Firewall, "nftables", "in place"),
            Finding::warn(Area::Runtime, "java", "odd", None),
        ]);
        assert!(!r.ok);
        assert_eq!((r.failed, r.warnings, r.skipped), (1, 1, 0));
        let text = r.text();
        let fw = text.find("firewall\n").expect("firewall section");
        let rt = text.find("runtimes").expect("runtime section");
        assert!(fw < rt, "{text}");
        assert!(
            text.contains("  FAIL  wget: no CA\n        fix: add it\n"),
            "{text}"
        );
        assert!(
            text.ends_with("NOT OK: 1 failed, 1 warnings, 0 skipped\n"),
            "{text}"
        );
        let json = serde_json::to_value(&r).expect("json");
        assert_eq!(json["findings"][0]["area"], "firewall");
        assert_eq!(json["findings"][1]["status"], "fail");
        assert!(json["findings"][0].get("fix").is_none());
        assert!(Report::new(vec![Finding::skipped(Area::Daemon, "d", "why")]).ok);
    }
}
