//! The tokio runtime of a `CdcSession`, shared with the providers and table
//! functions it lends to datafusion-python: they keep it alive as long as
//! a foreign session holds them (a query there runs on it after the
//! `CdcSession` itself is gone).
//!
//! The last owner may be dropped anywhere, inside another runtime's task
//! included, where a blocking shutdown panics: the runtime then shuts down
//! in the background.

use std::future::Future;

use tokio::runtime::{Handle, Runtime};

/// A session's runtime (see the module docs).
#[derive(Debug)]
pub(crate) struct SharedRuntime {
    handle: Handle,
    runtime: Option<Runtime>,
}

impl SharedRuntime {
    /// Own `runtime`.
    pub(crate) fn new(runtime: Runtime) -> Self {
        Self {
            handle: runtime.handle().clone(),
            runtime: Some(runtime),
        }
    }

    /// A handle to spawn on or enter.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// Run `future` to completion on the runtime, blocking this thread
    /// (which must be outside any runtime).
    pub(crate) fn block_on<F: Future>(&self, future: F) -> F::Output {
        self.handle.block_on(future)
    }
}

impl Drop for SharedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
