//! `DROP STREAMING TABLE`, and DataFusion DDL refused on streaming tables.

use datafusion::common::{DataFusionError, Result, TableReference};

use crate::sql::{plain_ddl_targets, PlainDdl};

use crate::table::rejects::{rejects_table_name, takes_rejects, REJECTS_SUFFIX};
use crate::table::TableName;

use super::CdcSession;

impl CdcSession {
    /// Refuse DataFusion DDL of `sql` that names a streaming table (see
    /// [`crate::sql::plain_ddl_targets`]): it would report success and only
    /// forget the table in this session.
    pub(super) async fn refuse_plain_ddl(
        &self,
        sql: &str,
        dialect: &str,
        normalize: bool,
    ) -> Result<()> {
        let mentions = |word: &[u8]| {
            sql.as_bytes()
                .windows(word.len())
                .any(|w| w.eq_ignore_ascii_case(word))
        };
        if !(mentions(b"DROP") || mentions(b"REPLACE")) {
            return Ok(());
        }
        for ddl in plain_ddl_targets(sql, dialect, normalize) {
            let (names, what) = match ddl {
                PlainDdl::Drop(names) => (
                    names,
                    "DROP TABLE and DROP VIEW only forget it in this session",
                ),
                PlainDdl::Replace(name) => (
                    vec![name],
                    "CREATE OR REPLACE would only hide it in this session",
                ),
                PlainDdl::DropSchema(schema) => {
                    let held: Vec<String> = self
                        .warehouse
                        .list_tables()
                        .await?
                        .into_iter()
                        .filter(|t| t.schema == schema)
                        .map(|t| t.to_string())
                        .collect();
                    if !held.is_empty() {
                        return Err(DataFusionError::Plan(format!(
                            "DROP SCHEMA {schema}: it holds streaming tables ({}), which DROP SCHEMA \
                             would only forget in this session; DROP STREAMING TABLE each first",
                            held.join(", ")
                        )));
                    }
                    continue;
                }
            };
            for name in names {
                if self.warehouse.exists(&name).await? {
                    return Err(DataFusionError::Plan(format!(
                        "'{name}' is a streaming table: {what}; DROP STREAMING TABLE {name} drops it"
                    )));
                }
            }
        }
        Ok(())
    }

    pub(super) async fn drop_table(&self, name: &TableName, if_exists: bool) -> Result<()> {
        if !self.warehouse.exists(name).await? {
            if if_exists {
                return Ok(());
            }
            return Err(DataFusionError::Plan(format!(
                "streaming table '{name}' does not exist"
            )));
        }
        // a target's rejects table goes with its target, not alone
        if let Some(target) = self.rejects_target_of(name).await? {
            return Err(DataFusionError::Plan(format!(
                "DROP STREAMING TABLE {name}: it holds the rejected events of '{target}' \
                 (autocdc.rejects = true); DROP STREAMING TABLE {target} drops both"
            )));
        }
        let rejects = rejects_table_name(name);
        let drops_rejects =
            self.takes_rejects(name).await && self.warehouse.exists(&rejects).await?;
        self.warehouse.delete_table(name).await?;
        self.forget(name)?;
        if drops_rejects {
            self.warehouse.delete_table(&rejects).await?;
            self.forget(&rejects)?;
        }
        Ok(())
    }

    /// The target whose rejects table `name` is: `t` for `t__rejects`,
    /// when `t` turns rejects on. Such a table is written by `t`'s updates
    /// alone: no flow, refresh, restore or DML of its own.
    pub(super) async fn rejects_target_of(&self, name: &TableName) -> Result<Option<TableName>> {
        let Some(target) = name.table.strip_suffix(REJECTS_SUFFIX) else {
            return Ok(None);
        };
        let target = TableName {
            schema: name.schema.clone(),
            table: target.to_string(),
        };
        Ok(
            match self.warehouse.exists(&target).await? && self.takes_rejects(&target).await {
                true => Some(target),
                false => None,
            },
        )
    }

    /// Refuse `statement` (the words naming it and `name`) when `name` is
    /// a target's rejects table.
    pub(super) async fn refuse_on_rejects_table(
        &self,
        statement: &str,
        name: &TableName,
    ) -> Result<()> {
        match self.rejects_target_of(name).await? {
            Some(target) => Err(DataFusionError::Plan(format!(
                "{statement}: '{name}' is the rejects table of '{target}', appended to by \
                 its updates only; nothing was changed"
            ))),
            None => Ok(()),
        }
    }

    /// Whether table `name` turns rejects on (false when it cannot be
    /// read: a table being dropped may be damaged).
    async fn takes_rejects(&self, name: &TableName) -> bool {
        self.table(name)
            .await
            .is_ok_and(|table| takes_rejects(&table.meta().properties))
    }

    /// `name` no longer a table of this session.
    fn forget(&self, name: &TableName) -> Result<()> {
        self.ctx.deregister_table(TableReference::partial(
            name.schema.clone(),
            name.table.clone(),
        ))?;
        if let Ok(mut tables) = self.tables.lock() {
            tables.remove(name);
        }
        Ok(())
    }
}
