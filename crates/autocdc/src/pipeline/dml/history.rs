//! DML on SCD 2 and BITEMPORAL targets (SPEC §4.2): a statement edits
//! versions, and the edited versions of each key it touched become that
//! key's whole history, written through the fold as DML-written events.
//!
//! ```text
//!  visible versions ─► DELETE / UPDATE / INSERT / MERGE ─► edited versions of
//!  the touched keys (+ __dml_drop: deleted)
//!      ─► checked per key: __start_at set, __end_at > __start_at, no overlap
//!      ─► events: UPSERT at each __start_at, DELETE at an __end_at no version
//!         starts at, one DELETE for a key left without versions
//!      ─► an update whose events have Origin::Dml: the fold replaces the keys'
//!         histories, marks erased sequences, writes the change feed ─► one commit
//! ```
//!
//! Adjacent versions whose tracked values are equal fold into one, as they
//! would from events. BITEMPORAL targets take `DELETE` of whole keys only
//! (their rows are beliefs over system time, not editable versions).

use std::ops::Not;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::execution::session_state::{SessionState, SessionStateBuilder};
use datafusion::functions::core::expr_fn::get_field;
use datafusion::functions_aggregate::expr_fn::{bool_and, count, max};
use datafusion::functions_window::expr_fn::lead;
use datafusion::logical_expr::{
    cast, lit, Expr, ExprFunctionExt, JoinType, LogicalPlan, LogicalPlanBuilder,
};
use datafusion::physical_plan::{collect, ExecutionPlan};

use super::{column, unqualified};
use crate::fold::columns::{END_AT_COL, START_AT_COL, SYSTEM_START_AT_COL};
use crate::pipeline::{plan_update, Planning, UpdateSource};
use crate::spec::{ColumnSelection, FlowSpec, ScdType, SequenceBy};
use crate::table::event::Operation;
use crate::table::ScdTable;

/// Edited-version column: the version is deleted by the statement.
pub(super) const DROP_COL: &str = "__dml_drop";
const SEQ: &str = "__dml_seq";
const OP: &str = "__dml_op";
const SYSTEM: &str = "__dml_system_seq";
const NEXT_START: &str = "__dml_next_start";
const NEXT_END: &str = "__dml_next_end";

/// A DML statement on the versions of an SCD 2 or BITEMPORAL target.
pub(super) struct History {
    table: Arc<ScdTable>,
    flow: FlowSpec,
    /// Key column names, in table order.
    pub(super) keys: Vec<String>,
    /// User columns of the table.
    pub(super) user: SchemaRef,
    /// What the statement is, for messages (`DELETE FROM main.t`).
    pub(super) statement: String,
}

impl History {
    /// For `statement` (`DELETE`, `UPDATE`, ...) on `table`.
    pub(super) fn new(table: Arc<ScdTable>, statement: &str) -> Result<Self> {
        let flow = super::keyed_flow(&table, statement)?;
        let statement = format!("{statement} on streaming table '{}'", table.name());
        if flow.ignore_null_updates.is_some() || flow.columns_to_update.is_some() {
            return Err(DataFusionError::NotImplemented(format!(
                "{statement}: DML on SCD 2 targets of flows with IGNORE NULL UPDATES or \
                 COLUMNS TO UPDATE is not supported (flow '{}'); nothing was changed",
                flow.name
            )));
        }
        let user = table.meta().user_schema;
        let keys = super::key_positions(&table, &flow)?
            .into_iter()
            .map(|i| user.field(i).name().clone())
            .collect();
        Ok(Self {
            table,
            flow,
            keys,
            user,
            statement,
        })
    }

    /// Whether the target is BITEMPORAL.
    pub(super) fn bitemporal(&self) -> bool {
        self.table.meta().stored_as == Some(ScdType::Bitemporal)
    }

    /// An error of the statement, with "nothing was changed".
    pub(super) fn refuse(&self, why: impl std::fmt::Display) -> DataFusionError {
        DataFusionError::Execution(format!("{}: {why}; nothing was changed", self.statement))
    }

    /// The visible versions (the table as users see it).
    pub(super) fn versions(&self) -> Result<LogicalPlanBuilder> {
        LogicalPlanBuilder::scan(
            self.table.name().table.clone(),
            provider_as_source(Arc::clone(&self.table) as _),
            None,
        )
    }

    /// User columns and the business interval (and, BITEMPORAL, the system
    /// start): the columns of an edited version.
    pub(super) fn version_columns(&self) -> Vec<String> {
        let system = self.bitemporal().then(|| SYSTEM_START_AT_COL.to_string());
        self.user
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .chain([START_AT_COL.to_string(), END_AT_COL.to_string()])
            .chain(system)
            .collect()
    }

    /// Names the key columns take in a plan of keys (`__dml_k0`, ...).
    fn key_aliases(&self) -> Vec<String> {
        (0..self.keys.len())
            .map(|n| format!("__dml_k{n}"))
            .collect()
    }

    /// The distinct keys of `rows`.
    pub(super) fn keys_of(&self, rows: LogicalPlanBuilder) -> Result<LogicalPlan> {
        rows.project(
            self.keys
                .iter()
                .zip(self.key_aliases())
                .map(|(k, a)| column(k).alias(a)),
        )?
        .distinct()?
        .build()
    }

    /// The versions of the keys in `keys` (a plan from [`Self::keys_of`]).
    pub(super) fn versions_of(&self, keys: LogicalPlan) -> Result<LogicalPlanBuilder> {
        self.versions()?.join(
            keys,
            JoinType::LeftSemi,
            (unqualified(&self.keys), unqualified(&self.key_aliases())),
            None,
        )
    }

    /// The plan replacing the history of every key in `edited` (the version
    /// columns and [`DROP_COL`]) by its versions not dropped: an update
    /// (`CdcCommit(CdcWrite(AutoCdc))`) committed as `operation`. The
    /// versions are checked now.
    pub(super) async fn replace(
        &self,
        state: &SessionState,
        edited: LogicalPlan,
        operation: Operation,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let keys: Vec<Expr> = self.keys.iter().map(|k| column(k)).collect();
        let bitemporal = self.bitemporal();
        let after = LogicalPlanBuilder::from(edited.clone()).filter(column(DROP_COL).not())?;
        let next = |c: &str, alias: &str| -> Result<Expr> {
            Ok(lead(column(c), Some(1), None)
                .partition_by(keys.clone())
                .order_by(vec![column(START_AT_COL).sort(true, false)])
                .build()?
                .alias(alias))
        };
        let windowed = after
            .window(vec![
                next(START_AT_COL, NEXT_START)?,
                next(END_AT_COL, NEXT_END)?,
            ])?
            .build()?;
        if !bitemporal {
            self.check(state, windowed.clone()).await?;
        }

        let user: Vec<String> = self
            .user
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect();
        let seq_type = self
            .table
            .raw_provider()
            .schema()
            .field_with_name(START_AT_COL)?
            .data_type()
            .clone();
        let event = |values: &dyn Fn(&str) -> Expr, seq: Expr, op: &str| -> Vec<Expr> {
            user.iter()
                .map(|c| values(c).alias(c))
                .chain([cast(seq, seq_type.clone()).alias(SEQ), lit(op).alias(OP)])
                .collect()
        };
        let own = |c: &str| column(c);
        // one DELETE per key left without versions: the fold erases it
        let null_of = |c: &str| -> Result<Expr> {
            let field = self.user.field_with_name(c)?;
            Ok(cast(lit(ScalarValue::Null), field.data_type().clone()))
        };
        let mut erase_values: Vec<Expr> = Vec::new();
        for c in &user {
            erase_values.push(if self.keys.contains(c) {
                column(c).alias(c)
            } else {
                null_of(c)?.alias(c)
            });
        }
        erase_values.push(cast(column("__dml_greatest"), seq_type.clone()).alias(SEQ));
        erase_values.push(lit("D").alias(OP));
        if bitemporal {
            erase_values.push(column("__dml_system").alias(SYSTEM));
        }
        let mut aggregates = vec![
            bool_and(column(DROP_COL)).alias("__dml_all"),
            max(column(START_AT_COL)).alias("__dml_greatest"),
        ];
        if bitemporal {
            aggregates.push(max(column(SYSTEM_START_AT_COL)).alias("__dml_system"));
        }
        let erased = LogicalPlanBuilder::from(edited)
            .aggregate(keys.clone(), aggregates)?
            .filter(column("__dml_all"))?
            .project(erase_values)?
            .build()?;
        let events = if bitemporal {
            erased
        } else {
            let upserts = event(&own, column(START_AT_COL), "U");
            let closes = event(&own, column(END_AT_COL), "D");
            LogicalPlanBuilder::from(windowed.clone())
                .project(upserts)?
                .union(
                    LogicalPlanBuilder::from(windowed)
                        .filter(
                            column(END_AT_COL).is_not_null().and(
                                column(NEXT_START)
                                    .is_null()
                                    .or(column(NEXT_START).not_eq(column(END_AT_COL))),
                            ),
                        )?
                        .project(closes)?
                        .build()?,
                )?
                .union(erased)?
                .build()?
        };

        let mut spec = FlowSpec::new(
            self.statement.clone(),
            self.flow.target.clone(),
            crate::spec::FlowSource::Query(String::new()),
        );
        spec.keys = self.flow.keys.clone();
        spec.sequence_by = Some(SequenceBy::Column(SEQ.into()));
        spec.apply_as_deletes = Some(format!("{OP} = 'D'"));
        spec.columns = ColumnSelection::Only(user);
        spec.stored_as_scd_type = self.flow.stored_as_scd_type;
        spec.track_history = self.flow.track_history.clone();
        if bitemporal {
            spec.system_sequence_by = Some(SYSTEM.into());
        }
        let plan = plan_update(
            state,
            Arc::clone(&self.table),
            &spec,
            operation,
            crate::clock::now(state.config()),
            UpdateSource::Dml(Box::new(events)),
            Planning::Run,
        )
        .await?;
        if operation == Operation::Merge {
            // (MERGE runs the plan as planned here)
            return state.create_physical_plan(&plan).await;
        }
        // DataFusion optimizes the plan its DELETE, UPDATE and INSERT get
        // back, with the statement's: planned here unoptimized, it is
        // optimized once (a second pass would swap the inputs of joins
        // whose dynamic filters the first pass built, an internal error)
        SessionStateBuilder::new_from_existing(state.clone())
            .with_physical_optimizer_rules(vec![])
            .build()
            .create_physical_plan(&plan)
            .await
    }

    /// Fail naming the first version that has no start, ends where it
    /// starts or before, or overlaps the next version of its key.
    async fn check(&self, state: &SessionState, windowed: LogicalPlan) -> Result<()> {
        let (start, end) = (column(START_AT_COL), column(END_AT_COL));
        // a STRUCT sequence orders nothing with a NULL field in it
        let seq_fields: Vec<String> = match self
            .table
            .raw_provider()
            .schema()
            .field_with_name(START_AT_COL)?
            .data_type()
        {
            DataType::Struct(fields) => fields.iter().map(|f| f.name().clone()).collect(),
            _ => Vec::new(),
        };
        let null_field = |c: &Expr| {
            seq_fields
                .iter()
                .map(|f| {
                    c.clone()
                        .is_not_null()
                        .and(get_field(c.clone(), f.as_str()).is_null())
                })
                .reduce(Expr::or)
                .unwrap_or(lit(false))
        };
        let bad = start
            .clone()
            .is_null()
            .or(null_field(&start))
            .or(null_field(&end))
            .or(end
                .clone()
                .is_not_null()
                .and(end.clone().lt_eq(start.clone())))
            .or(column(NEXT_START)
                .is_not_null()
                .and(end.clone().is_null().or(end.clone().gt(column(NEXT_START)))));
        let plan = LogicalPlanBuilder::from(windowed)
            .filter(bad)?
            .limit(0, Some(1))?
            .build()?;
        let rows = collect(state.create_physical_plan(&plan).await?, state.task_ctx()).await?;
        let Some(batch) = rows.iter().find(|b| b.num_rows() > 0) else {
            return Ok(());
        };
        let value = |c: &str| -> Result<ScalarValue> {
            ScalarValue::try_from_array(batch.column(batch.schema().index_of(c)?), 0)
        };
        let key = self.describe_key(batch)?;
        let interval = |s: ScalarValue, e: ScalarValue| format!("[{s}, {e})");
        let (s, e) = (value(START_AT_COL)?, value(END_AT_COL)?);
        let has_null_field = |v: &ScalarValue| match v {
            ScalarValue::Struct(fields) => {
                !v.is_null() && fields.columns().iter().any(|c| c.is_null(0))
            }
            _ => false,
        };
        let why = if s.is_null() {
            format!("a version of key ({key}) has a NULL {START_AT_COL}")
        } else if let Some((c, v)) = [(START_AT_COL, s.clone()), (END_AT_COL, e.clone())]
            .into_iter()
            .find(|(_, v)| has_null_field(v))
        {
            format!(
                "a version of key ({key}) has a NULL field in {c} ({v}): a sequence orders \
                 nothing with a NULL in it"
            )
        } else if !e.is_null() && e <= s {
            format!(
                "version {} of key ({key}) ends where it starts or before ({END_AT_COL} must be after {START_AT_COL})",
                interval(s, e)
            )
        } else {
            format!(
                "versions {} and {} of key ({key}) overlap",
                interval(s, e),
                interval(value(NEXT_START)?, value(NEXT_END)?)
            )
        };
        Err(self.refuse(why))
    }

    /// `k = v, ...` of the first row of `batch`.
    pub(super) fn describe_key(&self, batch: &RecordBatch) -> Result<String> {
        Ok(self
            .keys
            .iter()
            .map(|k| {
                let v = ScalarValue::try_from_array(batch.column(batch.schema().index_of(k)?), 0)?;
                Ok(format!("{k} = {v}"))
            })
            .collect::<Result<Vec<_>>>()?
            .join(", "))
    }
}

/// The number of rows of `plan`.
pub(super) async fn count_rows(state: &SessionState, plan: LogicalPlanBuilder) -> Result<u64> {
    let counted = plan
        .aggregate(Vec::<Expr>::new(), vec![count(lit(1)).alias("__n")])?
        .build()?;
    let batches = collect(
        state.create_physical_plan(&counted).await?,
        state.task_ctx(),
    )
    .await?;
    let n = batches
        .first()
        .filter(|b| b.num_rows() > 0)
        .map(|b| ScalarValue::try_from_array(b.column(0), 0))
        .transpose()?
        .unwrap_or(ScalarValue::Int64(Some(0)));
    match n {
        ScalarValue::Int64(Some(n)) => Ok(n.max(0) as u64),
        other => Err(DataFusionError::Internal(format!("count is {other}"))),
    }
}
