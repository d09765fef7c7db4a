//! The SQL front end: our statements, recognised before DataFusion sees them.
//!
//! ```text
//! CREATE [OR REFRESH] STREAMING TABLE [IF NOT EXISTS] name
//!     [(col type, ..., CONSTRAINT c EXPECT (cond) [ON VIOLATION ...], ...)]
//!     [COMMENT '...'] [TBLPROPERTIES ('key' = 'value', ...)]
//!     [AS query | FLOW AUTO CDC [ONCE] FROM ...]
//! CREATE FLOW flow AS INSERT INTO [ONCE] target BY NAME query
//! CREATE FLOW flow AS AUTO CDC [ONCE] INTO target FROM {t | stream(t) | (query)}
//!     KEYS (k, ...) [IGNORE NULL UPDATES [ON ...]] [APPLY AS DELETE WHEN cond]
//!     [APPLY AS TRUNCATE WHEN cond] SEQUENCE BY {col | STRUCT(c, ...)}
//!     [SYSTEM SEQUENCE BY col] [COLUMNS {(c, ...) | * EXCEPT (c, ...)}]
//!     [STORED AS {SCD TYPE 1 | SCD TYPE 2 | BITEMPORAL}] [TRACK HISTORY ON ...]
//!     [COLUMNS TO UPDATE col]
//! APPLY CHANGES INTO target FROM ...          -- synonym, flow named after target
//! REFRESH STREAMING TABLE name [FULL]
//! REFRESH PIPELINE [schema] [FULL [(name, ...)]]
//! RESTORE [STREAMING] TABLE name [TO] {VERSION AS OF n | TIMESTAMP AS OF 'ts'}
//! DROP STREAMING TABLE [IF EXISTS] name
//! DROP FLOW [IF EXISTS] flow
//! EXPLAIN [ANALYZE] [VERBOSE] [FORMAT f] REFRESH STREAMING TABLE name
//! SELECT … FROM AUTO CDC (query) KEYS (k, ...) [the clauses of a flow] [AS alias] …
//! SELECT … FROM SNAPSHOTS (query) VERSION BY v KEYS (k, ...) [COLUMNS …] [STORED AS …] [AS alias] …
//! ```
//! Every other statement goes to DataFusion unchanged, but DataFusion DDL
//! that would only forget a streaming table in the session ([`plain_ddl`]),
//! `UPDATE` targets folded ([`update_targets`]), `TRUNCATE` as `DELETE`
//! ([`truncate`]), tables read `VERSION AS OF` / `TIMESTAMP AS OF` as
//! `table_as_of` ([`time_travel`]) and, under the `databricks`
//! dialect, `VALUES` columns named as Databricks names them
//! ([`crate::values_columns`]).

mod equivalent;
mod looked_up;
mod outer_ctes;
mod parser;
mod plain_ddl;
mod time_travel;
mod truncate;
mod update_targets;

pub use crate::values_columns::with_databricks_values_columns;
pub use equivalent::{equivalent_sql, flow_differences, spelled_flow};
pub use looked_up::{looked_up_tables, may_name_tables_in_functions};
pub use outer_ctes::{outer_ctes, reads_only_planned, with_outer_ctes};
pub use parser::{
    parse_cdc_statement, replace_auto_cdc_relations, AutoCdcRelation, CdcStatement,
    CreateStreamingTable, FullRefresh, MergeAction, MergeClause, MergeStatement, RestoreTo,
};
pub use plain_ddl::{created_schema, is_lone_query, plain_ddl_targets, PlainDdl};
pub use time_travel::TimeTravelPlanner;
pub use truncate::truncate_as_delete;
pub use update_targets::fold_update_targets;
