//! The [`AsyncDB`] implementation that runs test statements on a [`CdcSession`].

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::error::{DataFusionError, Result};
use datafusion_autocdc::CdcSession;
use sqllogictest::{AsyncDB, DBOutput};

use crate::column_type::{column_types, CdcColumnType};
use crate::normalize::convert_batches;

/// A sqllogictest connection backed by a [`CdcSession`].
///
/// Every record of a test file is handed to [`CdcSession::sql`] as one statement and
/// its result is collected. A statement whose result has neither columns nor rows
/// (DDL, for example) completes as `DBOutput::StatementComplete(0)`; anything else is
/// reported as rows rendered by [`convert_batches`].
///
/// The session is shared (`Arc`), so all `connection` names of a test file use the
/// same session and therefore see the same warehouse.
#[derive(Clone)]
pub struct CdcDatabase {
    session: Arc<CdcSession>,
}

impl CdcDatabase {
    /// Wraps a session.
    pub fn new(session: Arc<CdcSession>) -> Self {
        Self { session }
    }

    /// The session the statements run on.
    pub fn session(&self) -> &CdcSession {
        &self.session
    }
}

impl std::fmt::Debug for CdcDatabase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CdcDatabase").finish_non_exhaustive()
    }
}

#[async_trait]
impl AsyncDB for CdcDatabase {
    type Error = DataFusionError;
    type ColumnType = CdcColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<CdcColumnType>> {
        let frame = self.session.sql(sql).await?;
        let schema = Arc::clone(frame.schema().inner());
        let batches = frame.collect().await?;
        let types = column_types(schema.fields());
        let rows = convert_batches(&batches)?;
        if types.is_empty() && rows.is_empty() {
            Ok(DBOutput::StatementComplete(0))
        } else {
            Ok(DBOutput::Rows { types, rows })
        }
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "autocdc"
    }

    async fn sleep(duration: Duration) {
        tokio::time::sleep(duration).await;
    }
}
