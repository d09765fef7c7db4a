//! Per-column sequencing of a target (SPEC §2.6): the table properties
//! `autocdc.sequencePerColumn` and `autocdc.sequenceGroups`, checked when
//! the table is created and resolved against the target's columns when a
//! flow plans an update.
//!
//! `'autocdc.sequenceGroups' = 'addr: street, city; pay: iban'` names groups
//! of non-key columns that share one sequence; every other non-key column is
//! a group of its own (named after it).

use std::collections::HashMap;

use datafusion::common::{DataFusionError, Result};

use crate::fold::columns::SequenceGroup;

/// Table property turning per-column sequencing on (`'true'`).
pub const SEQUENCE_PER_COLUMN_PROPERTY: &str = "autocdc.sequencePerColumn";
/// Table property naming the groups of columns sequenced together.
pub const SEQUENCE_GROUPS_PROPERTY: &str = "autocdc.sequenceGroups";

/// Named groups as declared: `(name, columns)`.
pub type DeclaredGroups = Vec<(String, Vec<String>)>;

/// The named groups of a table's properties, or `None` when per-column
/// sequencing is off; errors name the table and property.
pub fn declared(
    table: &str,
    properties: &HashMap<String, String>,
) -> Result<Option<DeclaredGroups>> {
    let error = |property: &str, m: String| {
        DataFusionError::Plan(format!("streaming table '{table}': {property}: {m}"))
    };
    let on = match properties.get(SEQUENCE_PER_COLUMN_PROPERTY) {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(v) => {
            return Err(error(
                SEQUENCE_PER_COLUMN_PROPERTY,
                format!("expected 'true' or 'false', got '{v}'"),
            ))
        }
    };
    let Some(text) = properties.get(SEQUENCE_GROUPS_PROPERTY) else {
        return Ok(on.then(Vec::new));
    };
    if !on {
        return Err(error(
            SEQUENCE_GROUPS_PROPERTY,
            format!("groups need '{SEQUENCE_PER_COLUMN_PROPERTY}' = 'true'"),
        ));
    }
    let mut groups: DeclaredGroups = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = |m: &str| error(SEQUENCE_GROUPS_PROPERTY, format!("{m} in '{part}'"));
        let (name, columns) = part
            .split_once(':')
            .ok_or_else(|| bad("expected '<group>: <column>, ...'"))?;
        let name = name.trim();
        let valid = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(bad("a group name is letters, digits and '_'"));
        }
        if groups.iter().any(|(n, _)| n.eq_ignore_ascii_case(name)) {
            return Err(bad(&format!("group '{name}' is named twice")));
        }
        let columns: Vec<String> = columns
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(str::to_string)
            .collect();
        if columns.is_empty() {
            return Err(bad(&format!("group '{name}' has no column")));
        }
        groups.push((name.to_string(), columns));
    }
    Ok(Some(groups))
}

/// The sequence groups of every non-key target column: the declared ones,
/// then each other column alone, in column order. Errors name the flow,
/// the property and the column.
pub fn resolve(
    flow: &str,
    declared: &[(String, Vec<String>)],
    target_columns: &[String],
    key_indices: &[usize],
) -> Result<Vec<SequenceGroup>> {
    let error = |m: String| {
        DataFusionError::Plan(format!("flow '{flow}': {SEQUENCE_GROUPS_PROPERTY}: {m}"))
    };
    let position = |name: &str| {
        target_columns.iter().position(|c| c == name).or_else(|| {
            target_columns
                .iter()
                .position(|c| c.eq_ignore_ascii_case(name))
        })
    };
    let mut grouped: HashMap<usize, &str> = HashMap::new();
    let mut groups = Vec::with_capacity(target_columns.len());
    for (name, columns) in declared {
        let mut members = Vec::with_capacity(columns.len());
        for column in columns {
            let c = position(column).ok_or_else(|| {
                error(format!(
                    "group '{name}': '{column}' is not a target column (columns: {})",
                    target_columns.join(", ")
                ))
            })?;
            if key_indices.contains(&c) {
                return Err(error(format!(
                    "group '{name}': '{column}' is a key column (keys are never merged)"
                )));
            }
            if let Some(first) = grouped.insert(c, name) {
                return Err(error(if first == name {
                    format!("group '{name}': '{column}' is named twice")
                } else {
                    format!("'{column}' is in more than one group (groups '{first}' and '{name}')")
                }));
            }
            members.push(c);
        }
        groups.push(SequenceGroup {
            name: name.clone(),
            members,
        });
    }
    for (c, column) in target_columns.iter().enumerate() {
        if key_indices.contains(&c) || grouped.contains_key(&c) {
            continue;
        }
        if let Some(group) = groups.iter().find(|g| g.name.eq_ignore_ascii_case(column)) {
            return Err(error(format!(
                "group '{}' has the name of the column '{column}', which is not in it",
                group.name
            )));
        }
        groups.push(SequenceGroup {
            name: column.clone(),
            members: vec![c],
        });
    }
    Ok(groups)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn names(columns: &[&str]) -> Vec<String> {
        columns.iter().map(|c| c.to_string()).collect()
    }

    #[test]
    fn groups_are_read_and_resolved() -> Result<()> {
        let p = props(&[
            (SEQUENCE_PER_COLUMN_PROPERTY, "TRUE"),
            (SEQUENCE_GROUPS_PROPERTY, " addr: street, City ; pay: iban;"),
        ]);
        let groups = declared("t", &p)?.expect("on");
        let columns = names(&["id", "street", "city", "zip", "iban"]);
        let groups = resolve("f", &groups, &columns, &[0])?;
        let got: Vec<(&str, &[usize])> = groups
            .iter()
            .map(|g| (g.name.as_str(), g.members.as_slice()))
            .collect();
        assert_eq!(
            got,
            [("addr", &[1, 2][..]), ("pay", &[4][..]), ("zip", &[3][..])]
        );
        assert_eq!(groups[0].state_column(), "__cdc_seq_addr");
        assert_eq!(declared("t", &props(&[]))?, None);
        Ok(())
    }

    #[test]
    fn bad_declarations_name_what_is_wrong() {
        let err = |pairs: &[(&str, &str)]| declared("t", &props(pairs)).unwrap_err().to_string();
        assert!(err(&[(SEQUENCE_PER_COLUMN_PROPERTY, "yes")]).contains("got 'yes'"));
        assert!(err(&[(SEQUENCE_GROUPS_PROPERTY, "g: a")]).contains("need"));
        let on = (SEQUENCE_PER_COLUMN_PROPERTY, "true");
        assert!(err(&[on, (SEQUENCE_GROUPS_PROPERTY, "a, b")]).contains("expected '<group>"));
        assert!(err(&[on, (SEQUENCE_GROUPS_PROPERTY, "g: ")]).contains("no column"));
        assert!(err(&[on, (SEQUENCE_GROUPS_PROPERTY, "g: a; G: b")]).contains("twice"));
        assert!(err(&[on, (SEQUENCE_GROUPS_PROPERTY, "g h: a")]).contains("group name"));
        let columns = names(&["id", "a", "b"]);
        let resolve_err = |groups: &[(&str, &[&str])]| {
            let declared: Vec<(String, Vec<String>)> = groups
                .iter()
                .map(|(n, c)| (n.to_string(), names(c)))
                .collect();
            resolve("f", &declared, &columns, &[0])
                .unwrap_err()
                .to_string()
        };
        assert!(resolve_err(&[("g", &["x"])]).contains("'x' is not a target column"));
        assert!(resolve_err(&[("g", &["id"])]).contains("key column"));
        assert!(resolve_err(&[("g", &["a"]), ("h", &["a"])])
            .contains("'a' is in more than one group (groups 'g' and 'h')"));
        assert!(resolve_err(&[("g", &["a", "b", "a"])]).contains("group 'g': 'a' is named twice"));
        assert!(resolve_err(&[("b", &["a"])]).contains("name of the column 'b'"));
    }
}
