//! History queries (SPEC §4.9): a history target as it stood at a point of
//! business time, and — for BITEMPORAL — as the table recorded it at a
//! point of system time.
//!
//! | call                            | rows of `t` kept                                             |
//! |---------------------------------|--------------------------------------------------------------|
//! | `scd2_as_of('t', b)`            | `__start_at ≤ b < __end_at` (`__end_at` NULL: open)          |
//! | `bitemporal_as_of('t', b)`      | the business interval holds `b`, `__system_end_at` NULL      |
//! | `bitemporal_as_of('t', b, s)`   | the business interval holds `b`, the system interval holds `s` |
//!
//! Intervals are half-open, so at most one version per key holds a point: the
//! result is one row per key, in the table's user columns (the interval
//! columns are left out). A point is cast to the type of the interval
//! columns; for a STRUCT sequence it is compared with the first field.
//!
//! The function returns a view over the streaming table: the interval
//! predicate, and whatever filters and projections the query adds, are
//! planned into the table's own scan, where the interval columns' min/max
//! statistics prune files.

use std::sync::Arc;

use arrow::datatypes::DataType;
use datafusion::catalog::view::ViewTable;
use datafusion::catalog::{TableFunctionImpl, TableProvider};
use datafusion::common::{plan_err, Column, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::functions::core::expr_fn::get_field;
use datafusion::logical_expr::{lit, Expr, LogicalPlanBuilder};

use super::TableRegistry;
use crate::fold::columns::{END_AT_COL, START_AT_COL, SYSTEM_END_AT_COL, SYSTEM_START_AT_COL};
use crate::fold::ScdType;
use crate::table::ScdTable;

/// The `scd2_as_of('target', business_time)` table function.
#[derive(Debug)]
pub struct Scd2AsOfFunction {
    tables: TableRegistry,
}

impl Scd2AsOfFunction {
    /// A function over the session's streaming tables.
    pub fn new(tables: TableRegistry) -> Self {
        Self { tables }
    }
}

impl TableFunctionImpl for Scd2AsOfFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const USAGE: &str = "scd2_as_of('target', business_time)";
        let [name, business] = args else {
            return plan_err!("{USAGE} takes a table name and a point of business time");
        };
        let target = Target::find(&self.tables, "scd2_as_of", name, ScdType::Type2)?;
        let at = target.point(START_AT_COL, business, "business time")?;
        let holds = within(START_AT_COL, END_AT_COL, &at);
        target.view(holds, &[START_AT_COL, END_AT_COL])
    }
}

/// The `bitemporal_as_of('target', business_time [, system_time])` table
/// function.
#[derive(Debug)]
pub struct BitemporalAsOfFunction {
    tables: TableRegistry,
}

impl BitemporalAsOfFunction {
    /// A function over the session's streaming tables.
    pub fn new(tables: TableRegistry) -> Self {
        Self { tables }
    }
}

impl TableFunctionImpl for BitemporalAsOfFunction {
    fn call(&self, args: &[Expr]) -> Result<Arc<dyn TableProvider>> {
        const USAGE: &str = "bitemporal_as_of('target', business_time [, system_time])";
        let (name, business, system) = match args {
            [name, business] => (name, business, None),
            [name, business, system] => (name, business, Some(system)),
            _ => {
                return plan_err!(
                    "{USAGE} takes a table name, a point of business time and, optionally, \
                     a point of system time"
                )
            }
        };
        let target = Target::find(&self.tables, "bitemporal_as_of", name, ScdType::Bitemporal)?;
        let at = target.point(START_AT_COL, business, "business time")?;
        let believed = match system {
            Some(system) => {
                let seen = target.point(SYSTEM_START_AT_COL, system, "system time")?;
                within(SYSTEM_START_AT_COL, SYSTEM_END_AT_COL, &seen)
            }
            None => column(SYSTEM_END_AT_COL).is_null(),
        };
        let holds = within(START_AT_COL, END_AT_COL, &at).and(believed);
        target.view(
            holds,
            &[
                START_AT_COL,
                END_AT_COL,
                SYSTEM_START_AT_COL,
                SYSTEM_END_AT_COL,
            ],
        )
    }
}

/// The history target a call names.
struct Target {
    function: &'static str,
    table: Arc<ScdTable>,
}

impl Target {
    /// The streaming table `name` names, stored as `kind`.
    fn find(
        tables: &TableRegistry,
        function: &'static str,
        name: &Expr,
        kind: ScdType,
    ) -> Result<Self> {
        let name = match name {
            Expr::Literal(ScalarValue::Utf8(Some(n)) | ScalarValue::Utf8View(Some(n)), _) => n,
            _ => {
                return plan_err!(
                    "{function}(): the first argument is a streaming table name as a string"
                )
            }
        };
        let table = super::lookup_table(tables, function, name)?;
        let stored_as = table.meta().stored_as;
        if stored_as != Some(kind) {
            let wanted = match kind {
                ScdType::Type2 => "SCD TYPE 2",
                _ => "BITEMPORAL",
            };
            let is = match stored_as {
                Some(ScdType::Type1) => "SCD TYPE 1",
                Some(ScdType::Type2) => "SCD TYPE 2 (use scd2_as_of)",
                Some(ScdType::Bitemporal) => "BITEMPORAL (use bitemporal_as_of)",
                None => "not written by an AUTO CDC flow yet",
            };
            return plan_err!(
                "{function}('{name}'): a target STORED AS {wanted} is needed; '{name}' is {is}"
            );
        }
        Ok(Self { function, table })
    }

    /// The point `value` of the time that interval column `start` measures,
    /// typed like it.
    fn point(&self, start: &str, value: &Expr, what: &str) -> Result<Point> {
        let function = self.function;
        let name = self.table.name();
        let Expr::Literal(value, _) = value else {
            return plan_err!(
                "{function}('{name}', …): the {what} must be a constant, got {value}"
            );
        };
        if value.is_null() {
            return plan_err!("{function}('{name}', …): the {what} must not be NULL");
        }
        let schema = self.table.schema();
        let interval = schema.field_with_name(start)?.data_type();
        let (field, data_type) = match interval {
            DataType::Struct(fields) => match fields.first() {
                Some(first) => (Some(first.name().clone()), first.data_type()),
                None => return plan_err!("{function}('{name}'): an empty STRUCT sequence"),
            },
            other => (None, other),
        };
        if matches!(
            value.data_type(),
            DataType::Struct(_) | DataType::List(_) | DataType::Map(..)
        ) {
            return plan_err!(
                "{function}('{name}', …): the {what} {value} is not a single value; \
                 a STRUCT sequence is compared by its first field ({data_type})"
            );
        }
        // (a fraction against whole numbers: its floor holds exactly the
        // versions it holds — a cast rounds a negative one up, past a start)
        let floor = match value {
            _ if !data_type.is_integer() => value.clone(),
            ScalarValue::Float64(Some(f)) => ScalarValue::Float64(Some(f.floor())),
            ScalarValue::Float32(Some(f)) => ScalarValue::Float32(Some(f.floor())),
            ScalarValue::Decimal128(Some(v), p, s) if *s > 0 => {
                let unit = 10i128.pow(*s as u32);
                ScalarValue::Decimal128(Some(v.div_euclid(unit) * unit), *p, *s)
            }
            other => other.clone(),
        };
        // (a date or timestamp against numbers: its cast counts days,
        // seconds, … or nanoseconds after 1970 by its own unit, a number no
        // sequence means)
        let temporal = |t: &DataType| t.is_temporal() || matches!(t, DataType::Interval(_));
        let converts = !(temporal(&value.data_type()) && data_type.is_numeric());
        match floor.cast_to(data_type) {
            Ok(cast) if converts && !cast.is_null() => Ok(Point { field, value: cast }),
            _ => plan_err!(
                "{function}('{name}', …): the {what} '{value}' ({}) does not convert to the \
                 table's {what} type {data_type}",
                value.data_type()
            ),
        }
    }

    /// A view of the table's rows for which `holds`, without `hidden`.
    fn view(&self, holds: Expr, hidden: &[&str]) -> Result<Arc<dyn TableProvider>> {
        let schema = self.table.schema();
        let shown: Vec<Expr> = schema
            .fields()
            .iter()
            .filter(|f| !hidden.contains(&f.name().as_str()))
            .map(|f| column(f.name()))
            .collect();
        let source = provider_as_source(Arc::clone(&self.table) as Arc<dyn TableProvider>);
        let plan = LogicalPlanBuilder::scan(self.table.name().table.as_str(), source, None)?
            .filter(holds)?
            .project(shown)?
            .build()?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}

/// A point of time in the type of an interval column.
struct Point {
    /// The STRUCT field compared, for a STRUCT sequence.
    field: Option<String>,
    value: ScalarValue,
}

/// `start ≤ at AND (end IS NULL OR at < end)`.
fn within(start: &str, end: &str, at: &Point) -> Expr {
    let bound = |name: &str| match &at.field {
        Some(field) => get_field(column(name), field.as_str()),
        None => column(name),
    };
    let value = || lit(at.value.clone());
    bound(start)
        .lt_eq(value())
        .and(column(end).is_null().or(value().lt(bound(end))))
}

/// An unqualified column, its name taken as written.
fn column(name: &str) -> Expr {
    Expr::Column(Column::new_unqualified(name))
}
