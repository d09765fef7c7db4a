//! Data-quality expectations of a streaming table (SPEC §4.6):
//! `CONSTRAINT name EXPECT (condition) [ON VIOLATION {DROP ROW | FAIL UPDATE}]`
//! in its definition, applied to the rows every flow of the table brings,
//! after the flow's projection and before the fold.
//!
//! | condition on a row | no `ON VIOLATION` | `DROP ROW`       | `FAIL UPDATE`                 |
//! |--------------------|-------------------|------------------|-------------------------------|
//! | TRUE               | kept, passed      | kept, passed     | kept, passed                  |
//! | FALSE or NULL      | kept, failed      | dropped, failed  | the update fails, no commit   |
//!
//! Truncate events carry no row and are not checked. The counts of one
//! update ([`ExpectationCounts`]) go into its event-log entry.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

/// What a row failing an expectation does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnViolation {
    /// Kept and counted (no `ON VIOLATION` clause).
    #[default]
    Keep,
    /// `ON VIOLATION DROP ROW`.
    DropRow,
    /// `ON VIOLATION FAIL UPDATE`.
    FailUpdate,
}

impl OnViolation {
    /// The clause as written (empty for [`Self::Keep`]).
    pub fn clause(self) -> &'static str {
        match self {
            Self::Keep => "",
            Self::DropRow => " ON VIOLATION DROP ROW",
            Self::FailUpdate => " ON VIOLATION FAIL UPDATE",
        }
    }
}

/// One `CONSTRAINT name EXPECT (condition) …` of a table definition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    /// The constraint's name.
    pub name: String,
    /// The condition, as SQL text in the table definition's dialect.
    pub condition: String,
    /// What a failing row does.
    #[serde(default)]
    pub on_violation: OnViolation,
    /// The SQL dialect of `condition` (DataFusion dialect name).
    #[serde(default = "generic")]
    pub dialect: String,
}

fn generic() -> String {
    "generic".to_string()
}

impl Expectation {
    /// The constraint as written.
    pub fn describe(&self) -> String {
        format!(
            "CONSTRAINT {} EXPECT ({}){}",
            self.name,
            self.condition,
            self.on_violation.clause()
        )
    }
}

/// Rows passed and failed per expectation during one update, shared by the
/// operator that checks them and the commit that records them.
#[derive(Debug)]
pub struct ExpectationCounts {
    expectations: Vec<Expectation>,
    passed: Vec<AtomicU64>,
    failed: Vec<AtomicU64>,
}

impl ExpectationCounts {
    /// Zero counts of `expectations`.
    pub fn new(expectations: Vec<Expectation>) -> Self {
        let zeros = || expectations.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            passed: zeros(),
            failed: zeros(),
            expectations,
        }
    }

    /// The expectations counted, in definition order.
    pub fn expectations(&self) -> &[Expectation] {
        &self.expectations
    }

    /// Add the rows of one batch that passed and failed expectation `i`.
    pub fn add(&self, i: usize, passed: u64, failed: u64) {
        if let (Some(p), Some(f)) = (self.passed.get(i), self.failed.get(i)) {
            p.fetch_add(passed, Ordering::Relaxed);
            f.fetch_add(failed, Ordering::Relaxed);
        }
    }

    /// `(passed, failed, dropped)` of expectation `i`.
    pub fn get(&self, i: usize) -> (u64, u64, u64) {
        let load = |v: &[AtomicU64]| v.get(i).map_or(0, |c| c.load(Ordering::Relaxed));
        let failed = load(&self.failed);
        let dropped = match self.expectations.get(i).map(|e| e.on_violation) {
            Some(OnViolation::DropRow) => failed,
            _ => 0,
        };
        (load(&self.passed), failed, dropped)
    }

    /// The counts as the event log keeps them: a JSON array of
    /// `{"name", "passed", "failed", "dropped"}` in definition order.
    pub fn to_json(&self) -> String {
        let entries: Vec<serde_json::Value> = self
            .expectations
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let (passed, failed, dropped) = self.get(i);
                serde_json::json!({
                    "name": e.name,
                    "passed": passed,
                    "failed": failed,
                    "dropped": dropped,
                })
            })
            .collect();
        serde_json::Value::Array(entries).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_render_in_definition_order_with_drops_for_drop_rules() {
        let e = |name: &str, on_violation| Expectation {
            name: name.into(),
            condition: "x > 0".into(),
            on_violation,
            dialect: generic(),
        };
        let counts = ExpectationCounts::new(vec![
            e("kept", OnViolation::Keep),
            e("dropped", OnViolation::DropRow),
        ]);
        counts.add(0, 3, 1);
        counts.add(1, 2, 2);
        counts.add(1, 1, 0);
        counts.add(7, 1, 1); // no such expectation: ignored
        assert_eq!(counts.get(0), (3, 1, 0));
        assert_eq!(counts.get(1), (3, 2, 2));
        assert_eq!(
            counts.to_json(),
            r#"[{"dropped":0,"failed":1,"name":"kept","passed":3},{"dropped":2,"failed":2,"name":"dropped","passed":3}]"#
        );
        assert_eq!(
            e("c", OnViolation::FailUpdate).describe(),
            "CONSTRAINT c EXPECT (x > 0) ON VIOLATION FAIL UPDATE"
        );
    }
}
