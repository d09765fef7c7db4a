//! One spelling for SQL texts that mean the same, so that a flow written
//! again in another case or layout is the flow it was (`autocdc run`
//! compares a definitions file's flows with the warehouse's).
//!
//! | written                                  | compared as                    |
//! |------------------------------------------|--------------------------------|
//! | keywords in any case, any whitespace     | sqlparser's rendering          |
//! | an unquoted identifier (normalising on)  | in lower case                  |
//! | a quoted identifier                      | as written, quoted             |
//! | `STREAM t`                               | `stream(t)`                    |
//! | an expression in outer parentheses       | without them                   |
//! | text that does not parse                 | as written                     |
//!
//! The rendering keeps the parse tree's structure (inner parentheses
//! included), so two texts compare equal only when their trees do.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, FunctionArg, FunctionArgExpr, Ident, ObjectName, ObjectNamePart, Select, SelectItem,
    TableFactor, TableFunctionArgs, VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::{dialect_from_str, Dialect, GenericDialect};
use datafusion::sql::sqlparser::parser::Parser;

use crate::spec::FlowSpec;

/// A flow definition as JSON, its SQL texts in one spelling
/// ([`equivalent_sql`]): definitions that differ only in case
/// or layout compare equal.
pub fn spelled_flow(spec: &FlowSpec, normalize: bool) -> serde_json::Value {
    fn walk(value: &mut serde_json::Value, key: Option<&str>, dialect: &str, normalize: bool) {
        match value {
            // (names and paths are not SQL)
            serde_json::Value::String(text)
                if !matches!(key, Some("name" | "target" | "dialect" | "path")) =>
            {
                *text = equivalent_sql(text, dialect, normalize);
            }
            serde_json::Value::Array(items) => {
                for item in items {
                    walk(item, key, dialect, normalize);
                }
            }
            serde_json::Value::Object(fields) => {
                for (k, v) in fields.iter_mut() {
                    walk(v, Some(k.as_str()), dialect, normalize);
                }
            }
            _ => {}
        }
    }
    let mut value = serde_json::to_value(spec).unwrap_or(serde_json::Value::Null);
    walk(&mut value, None, &spec.dialect, normalize);
    value
}

/// The parts of flow definition `new` that differ from `stored` (both
/// [`spelled_flow`]), each named by its clause and shown as written in SQL:
/// `COLUMNS: (id, v) here, * stored`.
pub fn flow_differences(stored: &serde_json::Value, new: &serde_json::Value) -> String {
    let (serde_json::Value::Object(old), serde_json::Value::Object(new)) = (stored, new) else {
        return "its clauses".to_string();
    };
    let parts: Vec<String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| {
            let was = old.get(k).unwrap_or(&serde_json::Value::Null);
            format!("{}: {} here, {} stored", clause(k), as_sql(v), as_sql(was))
        })
        .collect();
    match parts.is_empty() {
        true => "its clauses".to_string(),
        false => parts.join("; "),
    }
}

/// The clause a field of a flow definition holds.
fn clause(field: &str) -> String {
    match field {
        "source" => "FROM",
        "keys" => "KEYS",
        "sequence_by" => "SEQUENCE BY",
        "apply_as_deletes" => "APPLY AS DELETE WHEN",
        "apply_as_truncates" => "APPLY AS TRUNCATE WHEN",
        "columns" => "COLUMNS",
        "stored_as_scd_type" => "STORED AS",
        "once" => "ONCE",
        "ignore_null_updates" => "IGNORE NULL UPDATES",
        "track_history" => "TRACK HISTORY ON",
        "system_sequence_by" => "SYSTEM SEQUENCE BY",
        "columns_to_update" => "COLUMNS TO UPDATE",
        "previous_keys" => "PREVIOUS KEYS",
        other => return other.to_string(),
    }
    .to_string()
}

/// A field's value as SQL writes it: a column list `(a, b)`, all columns
/// `*`, `* EXCEPT (a)`, an expression as its text, none as `none`.
fn as_sql(value: &serde_json::Value) -> String {
    use serde_json::Value;
    let list = |items: &Vec<Value>| {
        let items: Vec<String> = items.iter().map(as_sql).collect();
        format!("({})", items.join(", "))
    };
    let is = |text: &str, name: &str| text.eq_ignore_ascii_case(name);
    match value {
        Value::Null => "none".to_string(),
        Value::String(text) if is(text, "all") => "*".to_string(),
        Value::String(text) if is(text, "type1") => "SCD TYPE 1".to_string(),
        Value::String(text) if is(text, "type2") => "SCD TYPE 2".to_string(),
        Value::String(text) if is(text, "bitemporal") => "BITEMPORAL".to_string(),
        Value::String(text) => text.clone(),
        Value::Array(items) => list(items),
        Value::Object(fields) if fields.len() == 1 => match fields.iter().next() {
            Some((kind, Value::Array(items))) if is(kind, "except") => {
                format!("* EXCEPT {}", list(items))
            }
            Some((kind, Value::Array(items))) if is(kind, "struct") => {
                format!("STRUCT{}", list(items))
            }
            Some((kind, Value::String(query))) if is(kind, "query") => format!("({query})"),
            Some((kind, Value::Object(path))) if is(kind, "debezium") => match path.get("path") {
                Some(Value::String(path)) => format!("debezium('{path}')"),
                _ => value.to_string(),
            },
            // a column list, a column, an expression, a table
            Some((_, Value::Array(items))) => list(items),
            Some((_, Value::String(text))) => text.clone(),
            _ => value.to_string(),
        },
        other => other.to_string(),
    }
}

/// `text` (an expression, or statements) in the one spelling of the module
/// docs; unchanged when it does not parse in `dialect`.
pub fn equivalent_sql(text: &str, dialect: &str, normalize: bool) -> String {
    let dialect: Box<dyn Dialect> =
        dialect_from_str(dialect).unwrap_or(Box::new(GenericDialect {}));
    let mut spelling = Spelling { normalize };
    // an expression, whole
    let mut parser = match Parser::new(dialect.as_ref()).try_with_sql(text) {
        Ok(parser) => parser,
        Err(_) => return text.to_string(),
    };
    if let Ok(mut expr) = parser.parse_expr() {
        if parser.peek_token().token == datafusion::sql::sqlparser::tokenizer::Token::EOF {
            while let Expr::Nested(inner) = expr {
                expr = *inner;
            }
            let _ = expr.visit(&mut spelling);
            return expr.to_string();
        }
    }
    match Parser::parse_sql(dialect.as_ref(), text) {
        Ok(mut statements) => {
            let _ = statements.visit(&mut spelling);
            statements
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join("; ")
        }
        Err(_) => text.to_string(),
    }
}

/// Rewrites identifiers and streams as the module docs say.
struct Spelling {
    normalize: bool,
}

impl Spelling {
    fn ident(&self, ident: &mut Ident) {
        if ident.quote_style.is_none() && self.normalize {
            ident.value = ident.value.to_lowercase();
        }
    }

    fn name(&self, name: &mut ObjectName) {
        for part in &mut name.0 {
            if let ObjectNamePart::Identifier(ident) = part {
                self.ident(ident);
            }
        }
    }
}

impl VisitorMut for Spelling {
    type Break = ();

    fn pre_visit_relation(&mut self, relation: &mut ObjectName) -> ControlFlow<()> {
        self.name(relation);
        ControlFlow::Continue(())
    }

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        if let TableFactor::Table {
            name, args, alias, ..
        } = factor
        {
            // `STREAM t` (the table `STREAM` aliased `t`) is `stream(t)`
            let stream = name.0.len() == 1 && name.to_string().eq_ignore_ascii_case("stream");
            if stream && args.is_none() {
                if let Some(table) = alias.take() {
                    *args = Some(TableFunctionArgs {
                        args: vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(
                            Expr::Identifier(table.name),
                        ))],
                        settings: None,
                    });
                }
            }
            if let Some(alias) = alias {
                self.ident(&mut alias.name);
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_select(&mut self, select: &mut Select) -> ControlFlow<()> {
        for item in &mut select.projection {
            if let SelectItem::ExprWithAlias { alias, .. } = item {
                self.ident(alias);
            }
        }
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match expr {
            Expr::Identifier(ident) => self.ident(ident),
            Expr::CompoundIdentifier(parts) => parts.iter_mut().for_each(|i| self.ident(i)),
            Expr::Function(function) => self.name(&mut function.name),
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(a: &str, b: &str) -> bool {
        equivalent_sql(a, "generic", true) == equivalent_sql(b, "generic", true)
    }

    #[test]
    fn spellings_of_one_text_compare_equal() {
        assert!(same("op = 'D'", "OP  =  'D'"));
        assert!(same("(op = 'D')", "op = 'D'"));
        assert!(same("COALESCE(a, 1) > 0", "coalesce(A, 1) > 0"));
        assert!(same(
            "SELECT id, v FROM STREAM(bronze) WITH (skipChangeCommits = true)",
            "select ID, V from stream bronze with (skipchangecommits = TRUE)"
        ));
        assert!(same(
            "SELECT 1 AS Tag FROM events",
            "SELECT 1 AS tag FROM EVENTS"
        ));
        // what differs stays apart
        assert!(!same("op = 'D'", "op = 'd'"));
        assert!(!same("\"Op\" = 'D'", "op = 'D'"));
        assert!(!same("a * (b + c)", "a * b + c"));
        assert!(!same("SELECT * FROM a", "SELECT * FROM b"));
        assert_eq!(equivalent_sql("not ( sql", "generic", true), "not ( sql");
    }

    #[test]
    fn differences_read_as_sql() {
        use crate::spec::{ColumnSelection, FlowSource, FlowSpec, SequenceBy};
        let stored = FlowSpec::new("f", "t", FlowSource::Table("events".into()));
        let mut new = stored.clone();
        new.keys = vec!["id".into(), "v".into()];
        new.columns = ColumnSelection::Only(vec!["id".into(), "v".into()]);
        new.track_history = Some(ColumnSelection::Except(vec!["v".into()]));
        new.sequence_by = Some(SequenceBy::Struct(vec!["a".into(), "b".into()]));
        new.stored_as_scd_type = crate::fold::ScdType::Type2;
        new.source = FlowSource::Query("SELECT * FROM e".into());
        let mut stored = stored;
        stored.keys = vec!["id".into()];
        stored.sequence_by = Some(SequenceBy::Column("seq".into()));
        let text = flow_differences(&spelled_flow(&stored, true), &spelled_flow(&new, true));
        for part in [
            "FROM: (SELECT * FROM e) here, events stored",
            "KEYS: (id, v) here, (id) stored",
            "SEQUENCE BY: STRUCT(a, b) here, seq stored",
            "COLUMNS: (id, v) here, * stored",
            "STORED AS: SCD TYPE 2 here, SCD TYPE 1 stored",
            "TRACK HISTORY ON: * EXCEPT (v) here, none stored",
        ] {
            assert!(text.contains(part), "{part} in {text}");
        }
    }
}
