//! `CREATE [OR REFRESH] STREAMING TABLE`: a new Delta table with its
//! protocol, declared columns and table properties.

use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DataFusionError, Result, TableReference};

use crate::fold::columns::{
    END_AT_COL, INTERNAL_PREFIX, KIND_COL, START_AT_COL, SYSTEM_END_AT_COL, SYSTEM_START_AT_COL,
};
use crate::spec::resolve::{storage_type, RESERVED_COLUMNS};
use crate::sql::CreateStreamingTable;
use crate::table::bucket::{bucket_field, DEFAULT_BUCKETS};
use crate::table::commit::{Edit, EditKind, MetadataChange};
use crate::table::meta::{parse_buckets, parse_compression, parse_tombstone_retention, TableDecl};
use crate::table::properties::{
    BUCKETS_PROPERTY, CHANGE_DATA_FEED_PROPERTY, COMPRESSION_PROPERTY, DELETION_VECTORS_PROPERTY,
    TABLE_KEY, TOMBSTONE_GC_PROPERTY,
};
use crate::table::rejects::{rejects_table_name, takes_rejects, REJECTS_COLUMNS, REJECTS_PROPERTY};
use crate::table::TableName;
use crate::table::{delta_err, ScdTable};

use super::CdcSession;

impl CdcSession {
    pub(crate) async fn create_table(&self, c: CreateStreamingTable) -> Result<()> {
        if self.warehouse.exists(&c.name).await? {
            return self.create_existing(&c).await;
        }
        // (one created since this session opened is not registered here)
        if self.warehouse.is_foreign(&c.name).await? {
            return Err(DataFusionError::Plan(format!(
                "CREATE STREAMING TABLE {}: its folder holds a Delta table another tool \
                 wrote, which is read here, never written; choose another name",
                c.name
            )));
        }
        let reference = TableReference::partial(c.name.schema.clone(), c.name.table.clone());
        if self.ctx.table_exist(reference).unwrap_or(false) {
            return Err(DataFusionError::Plan(format!(
                "a table named '{}' already exists in this session",
                c.name
            )));
        }
        let mut fields = self.declared_fields(&c).await?;
        fields.push(Field::new(KIND_COL, DataType::Int8, false));
        fields.push(bucket_field());
        let invalid =
            |e: String| DataFusionError::Plan(format!("streaming table '{}': {e}", c.name));
        let property = |name: &str| c.properties.iter().find(|(k, _)| k == name).map(|(_, v)| v);
        let buckets = match property(BUCKETS_PROPERTY) {
            Some(v) => parse_buckets(v).map_err(invalid)?,
            None => DEFAULT_BUCKETS,
        };
        if let Some(v) = property(COMPRESSION_PROPERTY) {
            parse_compression(v).map_err(invalid)?;
        }
        if let Some(v) = property(TOMBSTONE_GC_PROPERTY) {
            parse_tombstone_retention(v).map_err(invalid)?;
        }
        // (read by this spelling only: another would keep the default
        // retention without a word)
        if let Some((key, _)) = c.properties.iter().find(|(k, _)| {
            k.eq_ignore_ascii_case(TOMBSTONE_GC_PROPERTY) && k != TOMBSTONE_GC_PROPERTY
        }) {
            return Err(invalid(format!(
                "TBLPROPERTIES '{key}': the tombstone retention property is spelled \
                 '{TOMBSTONE_GC_PROPERTY}'"
            )));
        }
        if let Some(v) = property(REJECTS_PROPERTY) {
            if !(v.eq_ignore_ascii_case("true") || v.eq_ignore_ascii_case("false")) {
                return Err(invalid(format!(
                    "{REJECTS_PROPERTY}: expected 'true' or 'false', got '{v}'"
                )));
            }
        }
        // (our properties are read by these names only: another one, a
        // session setting or a name in other case, would be kept unread)
        const OURS: [&str; 5] = [
            BUCKETS_PROPERTY,
            COMPRESSION_PROPERTY,
            REJECTS_PROPERTY,
            crate::spec::sequence_groups::SEQUENCE_PER_COLUMN_PROPERTY,
            crate::spec::sequence_groups::SEQUENCE_GROUPS_PROPERTY,
        ];
        if let Some((key, _)) = c.properties.iter().find(|(k, _)| {
            k.get(..8)
                .is_some_and(|p| p.eq_ignore_ascii_case("autocdc."))
                && !OURS.contains(&k.as_str())
        }) {
            return Err(invalid(format!(
                "unknown table property '{key}' (a table takes {}; session settings are \
                 set with SET)",
                OURS.join(", ")
            )));
        }
        let deletion_vectors =
            crate::config::autocdc_options(self.ctx.state().config()).deletion_vectors;
        for (key, value) in &c.properties {
            delta_property_allowed(key, value, deletion_vectors).map_err(invalid)?;
        }
        // per-column sequencing: the properties are read now, the groups
        // checked against the columns when a flow plans
        let properties: std::collections::HashMap<String, String> =
            c.properties.iter().cloned().collect();
        crate::spec::sequence_groups::declared(&c.name.to_string(), &properties)?;
        let decl = TableDecl {
            declared_columns: !c.columns.is_empty(),
            expectations: c.expectations.clone(),
            comment: c.comment.clone(),
        };
        let mut config: Vec<(String, Option<String>)> = vec![(
            TABLE_KEY.to_string(),
            Some(serde_json::to_string(&decl).map_err(delta_err)?),
        )];
        config.extend(
            c.properties
                .iter()
                .filter(|(k, _)| k != BUCKETS_PROPERTY)
                .map(|(k, v)| (k.clone(), Some(v.clone()))),
        );
        config.push((BUCKETS_PROPERTY.to_string(), Some(buckets.to_string())));
        // every update writes its net change as Delta CDC files
        config.push((
            CHANGE_DATA_FEED_PROPERTY.to_string(),
            Some("true".to_string()),
        ));
        if deletion_vectors {
            config.push((
                DELETION_VECTORS_PROPERTY.to_string(),
                Some("true".to_string()),
            ));
        }
        if c.properties
            .iter()
            .any(|(k, v)| k == REJECTS_PROPERTY && v.eq_ignore_ascii_case("true"))
        {
            self.check_rejects_table_of(&c.name).await?;
        }
        let created = self
            .warehouse
            .create_state_store(
                &c.name,
                Schema::new(fields),
                config,
                deletion_vectors,
                c.comment.as_deref(),
            )
            .await;
        if let Err(e) = created {
            // another process created it meanwhile: as if it had been there
            return match self.warehouse.exists(&c.name).await? {
                true => self.create_existing(&c).await,
                false => Err(e),
            };
        }
        let rejects = c
            .properties
            .iter()
            .any(|(k, v)| k == REJECTS_PROPERTY && v.eq_ignore_ascii_case("true"));
        if rejects {
            self.create_rejects_table(&c).await?;
        }
        self.attach(c.name).await?;
        Ok(())
    }

    /// `CREATE STREAMING TABLE` of a table that exists: refused, but with
    /// `IF NOT EXISTS` or `OR REFRESH` (declared again).
    async fn create_existing(&self, c: &CreateStreamingTable) -> Result<()> {
        if !(c.or_refresh || c.if_not_exists) {
            return Err(DataFusionError::Plan(format!(
                "streaming table '{}' already exists",
                c.name
            )));
        }
        self.declare_existing(c, c.or_refresh).await.map(|_| ())
    }

    /// `c` of a table that exists: declared again (when `redeclare`, see
    /// [`Self::redeclare`]), and its rejects table created if missing.
    /// Whether anything changed.
    pub(super) async fn declare_existing(
        &self,
        c: &CreateStreamingTable,
        redeclare: bool,
    ) -> Result<bool> {
        let table = self.table(&c.name).await?;
        let changed = redeclare && self.redeclare(&table, c).await?;
        if takes_rejects(&table.meta().properties) {
            self.create_rejects_table(c).await?;
        }
        Ok(changed)
    }

    /// The columns `c` declares, as stored (none when it declares none).
    async fn declared_fields(&self, c: &CreateStreamingTable) -> Result<Vec<Field>> {
        if c.columns.is_empty() {
            return Ok(Vec::new());
        }
        let state = self.dialect_state(&c.dialect);
        let select = c
            .columns
            .iter()
            .enumerate()
            .map(|(i, (_, ty))| format!("CAST(NULL AS {ty}) AS c{i}"))
            .collect::<Vec<_>>()
            .join(", ");
        let plan = match state.create_logical_plan(&format!("SELECT {select}")).await {
            Ok(plan) => plan,
            Err(e) => {
                // (the column whose type it is, found one by one)
                for (name, ty) in &c.columns {
                    let sql = format!("SELECT CAST(NULL AS {ty})");
                    if let Err(e) = state.create_logical_plan(&sql).await {
                        let why = e.message().lines().next().unwrap_or_default().to_string();
                        return Err(DataFusionError::Plan(format!(
                            "streaming table '{}': column '{name}' has type {ty}, which is \
                             no type here: {why}",
                            c.name
                        )));
                    }
                }
                return Err(e);
            }
        };
        let mut fields = Vec::with_capacity(c.columns.len() + 2);
        for ((name, _), field) in c.columns.iter().zip(plan.schema().fields()) {
            if name.starts_with(INTERNAL_PREFIX) {
                return Err(DataFusionError::Plan(format!(
                    "streaming table '{}': column '{name}' uses the reserved prefix {INTERNAL_PREFIX}",
                    c.name
                )));
            }
            if !crate::spec::resolve::delta_can_store(field.data_type()) {
                return Err(DataFusionError::Plan(format!(
                    "streaming table '{}': column '{name}' has type {}, which a Delta table \
                     cannot store: declare another type (a TIMESTAMP, a DECIMAL(38, s), a BIGINT or a \
                     STRING, say)",
                    c.name,
                    field.data_type()
                )));
            }
            // (an SCD time column is one however it is spelled: `__START_AT`
            // quoted is `__start_at`)
            let name = match RESERVED_COLUMNS
                .iter()
                .find(|reserved| reserved.eq_ignore_ascii_case(name))
            {
                Some(reserved) => reserved.to_string(),
                None => name.clone(),
            };
            fields.push(Field::new(name, storage_type(field.data_type()), true));
        }
        time_columns_paired(&c.name.to_string(), &fields)?;
        Ok(fields)
    }

    /// `CREATE OR REFRESH` of an existing table: the definition's
    /// expectations become the table's (a commit of its declaration, read
    /// by the next update); the columns and properties it states must be
    /// the table's own, which it keeps (stored rows are laid out by them).
    /// Whether it committed (new expectations).
    async fn redeclare(&self, table: &ScdTable, c: &CreateStreamingTable) -> Result<bool> {
        let meta = table.meta();
        let refuse = |what: String| {
            DataFusionError::Plan(format!(
                "CREATE OR REFRESH STREAMING TABLE {}: {what}; nothing was changed",
                c.name
            ))
        };
        let declared = self.declared_fields(c).await?;
        // (its user columns in order, and the time columns of its SCD type,
        // which the table keeps apart from them)
        let mut stored: Vec<Field> = meta
            .user_schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        let time_columns = [
            (START_AT_COL, &meta.start_at_type),
            (END_AT_COL, &meta.start_at_type),
            (SYSTEM_START_AT_COL, &meta.system_start_at_type),
            (SYSTEM_END_AT_COL, &meta.system_start_at_type),
        ];
        for (name, data_type) in time_columns {
            if let Some(data_type) = data_type {
                stored.push(Field::new(name, data_type.clone(), true));
            }
        }
        let same_columns = same_columns(&declared, &stored);
        let keeps_columns = declared.is_empty() || same_columns;
        if !keeps_columns {
            return Err(refuse(format!(
                "it declares the columns ({}), and the table has ({}); a table keeps its \
                 columns: DROP it and create it again to change them",
                describe(declared.iter()),
                describe(stored.iter())
            )));
        }
        for (name, value) in &c.properties {
            let same = if name == BUCKETS_PROPERTY {
                parse_buckets(value).is_ok_and(|b| b == meta.buckets)
            } else {
                meta.properties.get(name) == Some(value)
            };
            if !same {
                return Err(refuse(format!(
                    "it sets {name} = '{value}', and the table has {}; a table keeps its \
                     properties",
                    match meta.properties.get(name) {
                        Some(stored) => format!("'{stored}'"),
                        None => "none".to_string(),
                    }
                )));
            }
        }
        if let Some(comment) = c
            .comment
            .as_ref()
            .filter(|c| meta.decl.comment.as_ref() != Some(*c))
        {
            return Err(refuse(format!(
                "it says COMMENT '{comment}', and the table has {}; a table keeps its comment",
                match &meta.decl.comment {
                    Some(stored) => format!("'{stored}'"),
                    None => "none".to_string(),
                }
            )));
        }
        if c.expectations == meta.decl.expectations {
            return Ok(false);
        }
        // (a condition that cannot be judged row by row is told now, not by
        // every later update; one naming a column the table lacks waits for
        // the flow that brings it)
        if !stored.is_empty() {
            let state = self.dialect_state(&c.dialect);
            let columns =
                datafusion::common::DFSchema::try_from(meta.user_schema.as_ref().clone())?;
            for e in &c.expectations {
                match crate::pipeline::expectation_condition(&state, e, &columns) {
                    Ok(_) | Err(DataFusionError::SchemaError(..)) => {}
                    Err(err) => {
                        return Err(refuse(format!(
                            "expectation '{}' ({}): {}",
                            e.name,
                            e.describe(),
                            crate::pipeline::plan_message(err)
                        )))
                    }
                }
            }
        }
        if let Some(flow) = meta.flows.values().find(|f| f.source.is_snapshot()) {
            if !c.expectations.is_empty() {
                return Err(refuse(format!(
                    "its expectations would apply to snapshot flow '{}', and a snapshot flow \
                     takes none",
                    flow.name
                )));
            }
        }
        let decl = TableDecl {
            declared_columns: meta.decl.declared_columns,
            expectations: c.expectations.clone(),
            comment: meta.decl.comment.clone(),
        };
        Edit::new(EditKind::SetProperties)
            .metadata(MetadataChange::Set(
                TABLE_KEY.to_string(),
                serde_json::to_string(&decl).map_err(delta_err)?,
            ))
            .commit(table)
            .await?;
        table.refresh().await?;
        Ok(true)
    }

    /// `<t>__rejects` of a target with rejects on, unless it exists.
    async fn create_rejects_table(&self, target: &CreateStreamingTable) -> Result<()> {
        self.create_rejects_table_of(&target.name, &target.dialect)
            .await
    }

    /// `<target>__rejects`, unless it exists (statements in `dialect`).
    pub(super) async fn create_rejects_table_of(
        &self,
        target: &TableName,
        dialect: &str,
    ) -> Result<()> {
        let rejects = CreateStreamingTable {
            name: rejects_table_name(target),
            or_refresh: false,
            if_not_exists: true,
            columns: REJECTS_COLUMNS
                .iter()
                .map(|(name, ty)| (name.to_string(), ty.to_string()))
                .collect(),
            properties: vec![],
            dialect: dialect.to_string(),
            query: None,
            flow: None,
            expectations: vec![],
            comment: Some(format!("the rejected events of '{target}'")),
        };
        Box::pin(self.create_table(rejects)).await?;
        self.check_rejects_table_of(target).await
    }

    /// Refuse rejects for `target` when a streaming table of its rejects
    /// table's name exists and is no rejects table (it has flows, or other
    /// columns): the rejected events would never reach it.
    async fn check_rejects_table_of(&self, target: &TableName) -> Result<()> {
        let name = rejects_table_name(target);
        if !self.warehouse.exists(&name).await? {
            return Ok(());
        }
        let meta = self.table(&name).await?.meta();
        let columns: Vec<&str> = meta
            .user_schema
            .fields()
            .iter()
            .map(|f| f.name().as_str())
            .collect();
        let expected: Vec<&str> = REJECTS_COLUMNS.iter().map(|(name, _)| *name).collect();
        let why = match (meta.flows.is_empty(), columns == expected) {
            (true, true) => return Ok(()),
            (false, _) => "it has flows of its own",
            (true, false) => "its columns are not a rejects table's",
        };
        Err(DataFusionError::Plan(format!(
            "streaming table '{target}': {REJECTS_PROPERTY} = true keeps its rejected events \
             in '{name}', a streaming table that exists and is no rejects table ({why}); drop \
             or rename it, or leave rejects off"
        )))
    }
}

/// `name type, …` of `fields`.
/// The SCD time columns of a declaration come in pairs of one type:
/// `__START_AT` with `__END_AT` (SCD 2), and for BITEMPORAL also
/// `__SYSTEM_START_AT` with `__SYSTEM_END_AT`; a column declared twice is
/// refused too.
fn time_columns_paired(table: &str, fields: &[Field]) -> Result<()> {
    let find = |name: &str| {
        fields
            .iter()
            .filter(|f| f.name() == name)
            .collect::<Vec<_>>()
    };
    for name in RESERVED_COLUMNS {
        if find(name).len() > 1 {
            return Err(DataFusionError::Plan(format!(
                "streaming table '{table}': column '{name}' is declared twice"
            )));
        }
    }
    let pairs = [
        (START_AT_COL, END_AT_COL),
        (SYSTEM_START_AT_COL, SYSTEM_END_AT_COL),
    ];
    for (start, end) in pairs {
        match (find(start).first(), find(end).first()) {
            (Some(s), Some(e)) if s.data_type() != e.data_type() => {
                return Err(DataFusionError::Plan(format!(
                    "streaming table '{table}': {} and {} have one type (the sequence's), \
                     declared {} and {}",
                    start.to_uppercase(),
                    end.to_uppercase(),
                    s.data_type(),
                    e.data_type()
                )))
            }
            (Some(_), None) | (None, Some(_)) => {
                return Err(DataFusionError::Plan(format!(
                    "streaming table '{table}': {} and {} are declared together",
                    start.to_uppercase(),
                    end.to_uppercase()
                )))
            }
            _ => {}
        }
    }
    if !find(SYSTEM_START_AT_COL).is_empty() && find(START_AT_COL).is_empty() {
        return Err(DataFusionError::Plan(format!(
            "streaming table '{table}': a BITEMPORAL table declares __START_AT and __END_AT \
             with __SYSTEM_START_AT and __SYSTEM_END_AT"
        )));
    }
    Ok(())
}

/// Whether `declared` are the columns `stored`: the user columns in order,
/// the SCD time columns (`__START_AT`, …) wherever they are written.
fn same_columns(declared: &[Field], stored: &[Field]) -> bool {
    fn apart(fields: &[Field]) -> [Vec<&Field>; 2] {
        let (mut time, user): (Vec<&Field>, Vec<&Field>) = fields
            .iter()
            .partition(|f| RESERVED_COLUMNS.contains(&f.name().as_str()));
        time.sort_by(|a, b| a.name().cmp(b.name()));
        [user, time]
    }
    let same = |a: &[&Field], b: &[&Field]| {
        a.len() == b.len()
            && a.iter()
                .zip(b)
                .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type())
    };
    let [declared_user, declared_time] = apart(declared);
    let [stored_user, stored_time] = apart(stored);
    same(&declared_user, &stored_user) && same(&declared_time, &stored_time)
}

fn describe<'a>(fields: impl Iterator<Item = &'a Field>) -> String {
    fields
        .map(|f| format!("{} {}", f.name(), f.data_type()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whether `value` is a value Delta readers take for the allowed property
/// `key`: written to both logs as given, a value they cannot parse (an
/// interval `garbage`, a checkpoint interval `-5`) would fail other tools.
fn delta_value_valid(key: &str, value: &str) -> std::result::Result<(), String> {
    // (as Delta's parsers read them: exactly, no spaces, lower case)
    let (ok, what) = match key {
        "delta.logRetentionDuration" | "delta.deletedFileRetentionDuration" => {
            const NANOS: [(&str, u64); 8] = [
                ("nanosecond", 1),
                ("microsecond", 1_000),
                ("millisecond", 1_000_000),
                ("second", 1_000_000_000),
                ("minute", 60_000_000_000),
                ("hour", 3_600_000_000_000),
                ("day", 86_400_000_000_000),
                ("week", 604_800_000_000_000),
            ];
            let parts: Vec<&str> = value.split(' ').collect();
            let ok = match parts.as_slice() {
                ["interval", n, unit] => {
                    let unit = unit.strip_suffix('s').unwrap_or(unit);
                    let nanos = NANOS.iter().find(|(name, _)| *name == unit);
                    // (a span past what a Delta reader's arithmetic holds
                    // made it panic, or wrap: at most ~292 years)
                    match (n.parse::<u64>(), nanos) {
                        (Ok(n), Some((_, per))) => {
                            n.checked_mul(*per).is_some_and(|t| t <= i64::MAX as u64)
                        }
                        _ => false,
                    }
                }
                _ => false,
            };
            (
                ok,
                "an interval, 'interval <n> <unit>' in lower case (unit: second, minute, \
                 hour, day, week, …; at most ~292 years)",
            )
        }
        "delta.checkpointInterval" => (
            value
                .parse::<u64>()
                .is_ok_and(|n| n > 0 && n <= i64::MAX as u64),
            "a whole number of commits, at least 1",
        ),
        "delta.dataSkippingNumIndexedCols" => (
            value.parse::<i64>().is_ok_and(|n| n >= -1),
            "a whole number of columns, at least -1 (all)",
        ),
        _ => (
            value == "true" || value == "false",
            "true or false, in lower case",
        ),
    };
    match ok {
        true => Ok(()),
        false => Err(format!(
            "TBLPROPERTIES '{key}' = '{value}': Delta readers take {what}"
        )),
    }
}

/// Delta table properties (`delta.*`) a streaming table may be created
/// with: those that change no table feature nor how files are written (log
/// and file retention, checkpoints). Its state store and published table
/// manage the rest — the change data feed is always on, deletion vectors
/// follow `autocdc.deletion_vectors` — and others (column mapping, row
/// tracking, append-only, …) would make its commits fail or be misread.
fn delta_property_allowed(
    key: &str,
    value: &str,
    deletion_vectors: bool,
) -> std::result::Result<(), String> {
    const ALLOWED: [&str; 7] = [
        "delta.logRetentionDuration",
        "delta.deletedFileRetentionDuration",
        "delta.checkpointInterval",
        "delta.checkpoint.writeStatsAsJson",
        "delta.checkpoint.writeStatsAsStruct",
        "delta.enableExpiredLogCleanup",
        "delta.dataSkippingNumIndexedCols",
    ];
    // (Delta's keys are case-insensitive to some readers and not to
    // others: `DELTA.appendOnly` is a delta.* property, and one spelled
    // otherwise than Delta spells it would be read by some readers only)
    if !key
        .get(..6)
        .is_some_and(|p| p.eq_ignore_ascii_case("delta."))
    {
        return Ok(());
    }
    if ALLOWED.contains(&key) {
        return delta_value_valid(key, value);
    }
    if let Some(spelled) = ALLOWED.iter().find(|a| a.eq_ignore_ascii_case(key)) {
        return Err(format!(
            "TBLPROPERTIES '{key}': write it as Delta spells it, '{spelled}' (readers that \
             match keys exactly would not see it)"
        ));
    }
    // (stating what the table has anyway)
    let says = |on: bool| value.eq_ignore_ascii_case(if on { "true" } else { "false" });
    if key.eq_ignore_ascii_case(CHANGE_DATA_FEED_PROPERTY) && says(true)
        || key.eq_ignore_ascii_case(DELETION_VECTORS_PROPERTY) && says(deletion_vectors)
    {
        return Ok(());
    }
    let why = if key.eq_ignore_ascii_case(CHANGE_DATA_FEED_PROPERTY) {
        "the change data feed of a streaming table is always on".to_string()
    } else if key.eq_ignore_ascii_case(DELETION_VECTORS_PROPERTY) {
        format!(
            "deletion vectors follow the session setting autocdc.deletion_vectors \
             (now {deletion_vectors})"
        )
    } else {
        format!(
            "the table's Delta features are its own; the delta.* properties it takes are {}",
            ALLOWED.join(", ")
        )
    };
    Err(format!(
        "TBLPROPERTIES '{key}' = '{value}' is not supported: {why}"
    ))
}
