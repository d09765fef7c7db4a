//! # datafusion-autocdc
//!
//! AUTO CDC flows for Apache DataFusion: a change feed (upserts, deletes,
//! truncates, in any order) is sequenced per key and applied to a durable
//! streaming table stored as Delta Lake.
//!
//! ```no_run
//! # async fn demo() -> datafusion::error::Result<()> {
//! use datafusion_autocdc::{AutoCdcConfig, CdcSession};
//! let session = CdcSession::open(AutoCdcConfig::new("./warehouse")).await?;
//! session.sql("CREATE TABLE cdc (id INT, v TEXT, op TEXT, seq INT)").await?;
//! session.sql("CREATE STREAMING TABLE target").await?;
//! session
//!     .sql("CREATE FLOW f AS AUTO CDC INTO target FROM cdc KEYS (id) \
//!           APPLY AS DELETE WHEN op = 'DELETE' SEQUENCE BY seq COLUMNS * EXCEPT (op, seq)")
//!     .await?
//!     .show()
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! ## What an embedding engine uses
//!
//! * [`CdcSession`] (statements, tables, flows) or [`AutoCdc::install`]
//!   (the planner alone, in a `SessionStateBuilder` of your own), with
//!   [`AutoCdcConfig`] and the settings of [`config`];
//! * the builders of [`api`] (`create_auto_cdc_flow`, `update_pipeline`, …)
//!   and the metrics they return ([`metrics`]);
//! * [`AutoCdcDataFrame`] (`DataFrame::auto_cdc`, `snapshot_diff`);
//! * [`catalog`] (the warehouse in any `SessionContext`), [`physical`] (the
//!   operators and their codec, for a cluster), [`sql`] (the statement
//!   parser), [`table`] (the target `TableProvider`, table names), and the
//!   typed errors ([`CdcError`]).
//!
//! ## Layers
//!
//! Each module uses only those below it (no cycles among the top-level
//! modules); the crate-internal ones are in brackets:
//!
//! ```text
//!  api, session,         statements: the Rust builder, SQL dispatch;
//!  catalog               the warehouse in any SessionContext
//!  (pipeline)            plans one update: CdcCommit(CdcWrite(AutoCdc(events,
//!                        ...))); DML statements as write → commit plans
//!  physical              the execs and the extension planner
//!  (logical, functions), plan nodes; table functions (table_changes, ...);
//!  sql                   the statement parser
//!  table                 Delta storage: warehouse, target TableProvider,
//!                        writing and committing an update, deletion vectors
//!  (spec), config        flow definitions and their validation; settings
//!  (fold), clock         pure per-key kernels (no I/O); the session clock
//!  error                 the typed errors ([`CdcError`])
//! ```
//!
//! DML on a target is planned by the update pipeline and reaches the
//! target's `TableProvider` through [`table::TargetDml`], which the session
//! hands to every table it registers, so storage never calls up into
//! planning.

pub mod api;
pub mod catalog;
pub mod clock;
pub mod config;
pub mod error;
pub(crate) mod fit;
pub(crate) mod fold;
pub(crate) mod functions;
pub(crate) mod logical;
pub mod metrics;
pub mod physical;
pub(crate) mod pipeline;
pub mod query;
pub(crate) mod raise;
pub mod session;
pub(crate) mod spec;
pub mod sql;
pub(crate) mod stored_value;
pub mod table;
pub(crate) mod values_columns;

use std::sync::Arc;

use datafusion::execution::session_state::SessionStateBuilder;

pub use api::{
    AppendFlowBuilder, AutoCdcFlowBuilder, PipelineUpdate, TableStatus, TableUpdate,
    UpdatePipelineBuilder,
};
pub use config::AutoCdcConfig;
pub use error::CdcError;
pub use query::AutoCdcDataFrame;
pub use session::CdcSession;
pub use spec::{ColumnSelection, FlowSource, FlowSpec, ScdType, SequenceBy};

/// The extension: installs the AUTO CDC planner into a DataFusion session.
#[derive(Debug, Clone, Copy, Default)]
pub struct AutoCdc;

impl AutoCdc {
    /// Install the query planner that knows the `AutoCdc` and `CdcCommit`
    /// nodes, and the optimizer rule that pushes key filters below the fold
    /// (`PushKeyFilters`). [`CdcSession`] does this and adds the
    /// warehouse catalog and the statements.
    pub fn install(builder: SessionStateBuilder) -> SessionStateBuilder {
        builder
            .with_query_planner(Arc::new(physical::CdcQueryPlanner))
            .with_optimizer_rule(Arc::new(logical::PushKeyFilters))
            .with_analyzer_rule(Arc::new(pipeline::DmlFitChecks))
    }
}
