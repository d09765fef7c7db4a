//! The clock that stamps updates: stored rows carry the time of the update
//! that wrote them, and tombstones expire by it (retention).
//! Injectable so that retention can be tested without waiting.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use datafusion::prelude::SessionConfig;

/// Source of the current time for updates.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock (the default).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that moves only when told to (tests, replays of old feeds).
#[derive(Debug)]
pub struct ManualClock(Mutex<DateTime<Utc>>);

impl ManualClock {
    /// A clock showing `start`.
    pub fn new(start: DateTime<Utc>) -> Self {
        Self(Mutex::new(start))
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        if let Ok(mut t) = self.0.lock() {
            *t += by;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        match self.0.lock() {
            Ok(t) => *t,
            Err(p) => *p.into_inner(),
        }
    }
}

/// A session's clock as an extension of its `SessionConfig`: what code
/// reached through DataFusion's hooks (DML on targets) stamps rows with.
#[derive(Debug, Clone)]
pub struct SessionClock(pub Arc<dyn Clock>);

/// Now by the clock of the session configured by `config` (the system
/// clock when it has none).
pub fn now(config: &SessionConfig) -> DateTime<Utc> {
    config
        .get_extension::<SessionClock>()
        .map_or_else(Utc::now, |clock| clock.0.now())
}
