//! Which executor ran which tasks: an execution engine that counts the
//! tasks it is given (and says so on stderr) before handing them to
//! Ballista's own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use ballista_core::JobId;
use ballista_executor::execution_engine::{
    DefaultExecutionEngine, ExecutionEngine, QueryStageExecutor,
};
use datafusion::common::Result;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionConfig;

/// Tasks run, by executor id (shared by the executors of one process).
#[derive(Debug, Clone, Default)]
pub struct TaskCounts(Arc<Mutex<BTreeMap<String, usize>>>);

impl TaskCounts {
    /// Tasks run so far, by executor id.
    pub fn snapshot(&self) -> BTreeMap<String, usize> {
        match self.0.lock() {
            Ok(counts) => counts.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn add(&self, executor: &str) {
        let mut counts = match self.0.lock() {
            Ok(counts) => counts,
            Err(poisoned) => poisoned.into_inner(),
        };
        *counts.entry(executor.to_string()).or_default() += 1;
    }
}

/// Ballista's execution engine, counting the tasks of one executor.
pub(crate) struct CountingEngine {
    executor: String,
    counts: TaskCounts,
    /// Whether each task is also written to stderr (the executor binary).
    log: bool,
    inner: DefaultExecutionEngine,
}

impl CountingEngine {
    pub(crate) fn new(executor: impl Into<String>, counts: TaskCounts, log: bool) -> Self {
        Self {
            executor: executor.into(),
            counts,
            log,
            inner: DefaultExecutionEngine::new(),
        }
    }
}

impl ExecutionEngine for CountingEngine {
    fn create_query_stage_exec(
        &self,
        job_id: JobId,
        stage_id: usize,
        task_id: usize,
        global_output_partition_ids: Vec<usize>,
        plan: Arc<dyn ExecutionPlan>,
        work_dir: &str,
        config: &SessionConfig,
    ) -> Result<Arc<dyn QueryStageExecutor>> {
        self.counts.add(&self.executor);
        if self.log {
            eprintln!(
                "autocdc-executor {}: task {job_id}/{stage_id}/{task_id} (partitions {global_output_partition_ids:?})",
                self.executor
            );
        }
        self.inner.create_query_stage_exec(
            job_id,
            stage_id,
            task_id,
            global_output_partition_ids,
            plan,
            work_dir,
            config,
        )
    }
}
