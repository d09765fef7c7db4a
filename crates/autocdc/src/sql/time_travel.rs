//! `t VERSION AS OF n` and `t TIMESTAMP AS OF ts`: a streaming table as it
//! was, as `table_as_of` reads it.
//!
//! The dialects that parse a table version (`databricks`, `bigquery`,
//! `mssql`, `snowflake`) hand it to DataFusion 55, whose planner drops it:
//! the query would read the current rows without a word. A relation
//! planner plans each versioned table instead:
//!
//! | written                                     | planned as                                   |
//! |---------------------------------------------|----------------------------------------------|
//! | `t VERSION AS OF n`                         | `table_as_of('t', n) AS t`                   |
//! | `t TIMESTAMP AS OF e`, `t FOR SYSTEM_TIME AS OF e` | `table_as_of('t', CAST(e AS TIMESTAMP)) AS t` |
//! | `t AT(…)`, `t BEFORE(…)`, `t CHANGES(…)`     | an error naming the clause                   |
//!
//! An alias written stays the relation's name. A table that is not a
//! streaming table gets `table_as_of`'s error: it has no versions here.

use datafusion::common::{plan_err, DataFusionError, Result};
use datafusion::logical_expr::planner::{
    PlannedRelation, RelationPlanner, RelationPlannerContext, RelationPlanning,
};
use datafusion::sql::sqlparser::ast::{TableAlias, TableFactor, TableVersion};
use datafusion::sql::sqlparser::dialect::dialect_from_str;
use datafusion::sql::sqlparser::parser::Parser;

/// Plans versioned tables as `table_as_of` (see the module docs).
#[derive(Debug, Default)]
pub struct TimeTravelPlanner;

impl RelationPlanner for TimeTravelPlanner {
    fn plan_relation(
        &self,
        relation: TableFactor,
        context: &mut dyn RelationPlannerContext,
    ) -> Result<RelationPlanning> {
        let TableFactor::Table {
            name,
            alias,
            version: Some(version),
            args: None,
            ..
        } = &relation
        else {
            return Ok(RelationPlanning::Original(Box::new(relation)));
        };
        let at = match version {
            TableVersion::VersionAsOf(n) => n.to_string(),
            TableVersion::TimestampAsOf(at) | TableVersion::ForSystemTimeAsOf(at) => {
                format!("CAST({at} AS TIMESTAMP)")
            }
            other => {
                return plan_err!(
                    "{name} {other}: a table is read as it was with VERSION AS OF n or \
                     TIMESTAMP AS OF t (or table_as_of('{name}', n))"
                )
            }
        };
        let dialect_name = &context.context_provider().options().sql_parser.dialect;
        let dialect = dialect_from_str(dialect_name).ok_or_else(|| {
            DataFusionError::Plan(format!("unsupported SQL dialect '{dialect_name}'"))
        })?;
        // (the name as the session reads it, each part quoted unless plain:
        // `s.[T]` of mssql, `"Mixed"`, `Mixed` unfolded)
        let reference = context.object_name_to_table_reference(name.clone())?;
        let plain = |part: &str| {
            part.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !part.starts_with(|c: char| c.is_ascii_digit())
        };
        let written: Vec<String> = reference
            .to_vec()
            .iter()
            .map(|part| match plain(part) {
                true => part.clone(),
                false => format!("\"{}\"", part.replace('"', "\"\"")),
            })
            .collect();
        let sql = format!(
            "table_as_of('{}', {at})",
            written.join(".").replace('\'', "''")
        );
        let mut factor = Parser::new(dialect.as_ref())
            .try_with_sql(&sql)
            .and_then(|mut parser| parser.parse_table_factor())
            .map_err(|e| DataFusionError::SQL(Box::new(e), None))?;
        // (the relation keeps its name: `t.col` still names its columns)
        let alias = alias.clone().or_else(|| {
            name.0
                .last()
                .and_then(|part| part.as_ident())
                .map(|table| TableAlias {
                    explicit: true,
                    name: table.clone(),
                    columns: vec![],
                    at: None,
                })
        });
        if let TableFactor::Table { alias: slot, .. } = &mut factor {
            *slot = alias;
        }
        let plan = context.plan(factor)?;
        Ok(RelationPlanning::Planned(Box::new(PlannedRelation::new(
            plan, None,
        ))))
    }
}
