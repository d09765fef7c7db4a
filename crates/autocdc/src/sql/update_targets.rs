//! `UPDATE t SET c = ...` with folded column names.
//!
//! DataFusion 55 folds unquoted identifiers to lower case in an `UPDATE`'s
//! values and `WHERE`, but resolves its `SET` targets as written, so the
//! documented `UPDATE t SET __END_AT = ...` on a table whose column is
//! `__end_at` fails. [`fold_update_targets`] folds the unquoted targets
//! when the session folds identifiers; every other statement passes as is.

use std::borrow::Cow;

use datafusion::sql::sqlparser::ast::{AssignmentTarget, ObjectNamePart, Statement};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

/// `sql` with the unquoted `SET` targets of a single `UPDATE` in lower case
/// (when `normalize`); unchanged otherwise, and when it does not parse (the
/// planner reports that). Only text starting with `UPDATE` is parsed.
pub fn fold_update_targets<'a>(sql: &'a str, dialect: &str, normalize: bool) -> Cow<'a, str> {
    // every other statement passes without a second parse
    let is_update = sql
        .trim_start()
        .get(..6)
        .is_some_and(|w| w.eq_ignore_ascii_case("update"));
    if !normalize || !is_update {
        return Cow::Borrowed(sql);
    }
    let Some(dialect) = dialect_from_str(dialect) else {
        return Cow::Borrowed(sql);
    };
    let Ok(mut statements) = Parser::parse_sql(dialect.as_ref(), sql) else {
        return Cow::Borrowed(sql);
    };
    let [Statement::Update(update)] = statements.as_mut_slice() else {
        return Cow::Borrowed(sql);
    };
    let mut folded = false;
    for assignment in &mut update.assignments {
        let names = match &mut assignment.target {
            AssignmentTarget::ColumnName(name) => std::slice::from_mut(name),
            AssignmentTarget::Tuple(names) => names.as_mut_slice(),
        };
        for part in names.iter_mut().flat_map(|n| n.0.iter_mut()) {
            if let ObjectNamePart::Identifier(ident) = part {
                let lower = ident.value.to_lowercase();
                if ident.quote_style.is_none() && ident.value != lower {
                    ident.value = lower;
                    folded = true;
                }
            }
        }
    }
    if folded {
        Cow::Owned(statements[0].to_string())
    } else {
        Cow::Borrowed(sql)
    }
}

#[cfg(test)]
mod tests {
    use super::fold_update_targets;

    #[test]
    fn unquoted_targets_fold_quoted_ones_do_not() {
        assert_eq!(
            fold_update_targets(
                "UPDATE t SET __END_AT = 9, \"Name\" = 'x' WHERE id = 1",
                "generic",
                true
            ),
            "UPDATE t SET __end_at = 9, \"Name\" = 'x' WHERE id = 1"
        );
        let same = "UPDATE t SET __END_AT = 9";
        assert_eq!(fold_update_targets(same, "generic", false), same);
        let other = "SELECT A FROM t";
        assert_eq!(fold_update_targets(other, "generic", true), other);
    }
}
