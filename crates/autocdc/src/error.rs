//! The errors of an update, typed.
//!
//! Every error a user can cause or meet names where it happened: the flow,
//! the clause, the key and the value. [`CdcError`] keeps these as fields, so
//! a program can match on them, and its message says them in words. It
//! travels inside DataFusion as `DataFusionError::External` (the form every
//! operator and stream carries); [`CdcError::find`] gets it back from any
//! `DataFusionError`, through the context and sharing DataFusion adds.
//!
//! | variant          | when                                        | committed |
//! |------------------|---------------------------------------------|-----------|
//! | `NullKey`        | a KEYS column is NULL in an event           | nothing   |
//! | `NullSequence`   | a SEQUENCE BY value is NULL                 | nothing   |
//! | `ConflictingEvents` | one key, one sequence, two different events | nothing |
//! | `CommitFailed` | the Delta commit failed (another writer committed first, or Delta refused it) | nothing |
//! | `Internal`       | an invariant of ours broke (a bug)          | nothing   |

use std::fmt;

use datafusion::common::DataFusionError;

/// A typed AUTO CDC error (see the module docs).
#[derive(Debug)]
pub enum CdcError {
    /// A KEYS column is NULL in an UPSERT or DELETE event.
    NullKey {
        /// The flow.
        flow: String,
        /// The KEYS column.
        column: String,
        /// The event's kind (`UPSERT`, `DELETE`).
        kind: &'static str,
        /// The event's SEQUENCE BY value.
        sequence: String,
    },
    /// A SEQUENCE BY value is NULL.
    NullSequence {
        /// The flow.
        flow: String,
        /// The event's key (`k1=v1, k2=v2`); `None` for a TRUNCATE event.
        key: Option<String>,
    },
    /// Two events of one key with equal sequence differ in kind or content.
    ConflictingEvents {
        /// The flow.
        flow: String,
        /// The key (`k1=v1, k2=v2`).
        key: String,
        /// The SEQUENCE BY value they share.
        sequence: String,
        /// Whether one of them is a stored event (from an earlier update).
        against_stored: bool,
    },
    /// The Delta commit of an update failed, most often because another
    /// writer committed to the target between this update's read and its
    /// commit.
    CommitFailed {
        /// The flow.
        flow: String,
        /// The target.
        target: String,
        /// What the Delta commit said.
        cause: String,
        /// Whether another writer committed first (then running it again
        /// may succeed).
        conflict: bool,
    },
    /// A broken invariant of ours.
    Internal(String),
}

impl CdcError {
    /// The flow the error belongs to, when it belongs to one.
    pub fn flow(&self) -> Option<&str> {
        match self {
            Self::NullKey { flow, .. }
            | Self::NullSequence { flow, .. }
            | Self::ConflictingEvents { flow, .. }
            | Self::CommitFailed { flow, .. } => Some(flow),
            Self::Internal(_) => None,
        }
    }

    /// The typed error carried by `error`, if any, looking through the
    /// context, sharing and wrapping DataFusion adds on the way up.
    pub fn find(error: &DataFusionError) -> Option<&CdcError> {
        match error {
            DataFusionError::External(inner) => inner.downcast_ref::<CdcError>(),
            DataFusionError::Context(_, inner) => Self::find(inner),
            DataFusionError::Shared(inner) => Self::find(inner),
            DataFusionError::ArrowError(inner, _) => match inner.as_ref() {
                arrow::error::ArrowError::ExternalError(e) => e
                    .downcast_ref::<DataFusionError>()
                    .and_then(Self::find)
                    .or_else(|| e.downcast_ref::<CdcError>()),
                _ => None,
            },
            _ => None,
        }
    }
}

impl fmt::Display for CdcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NullKey {
                flow,
                column,
                kind,
                sequence,
            } => write!(
                f,
                "flow '{flow}': KEYS column '{column}' is NULL in a {kind} event with sequence {sequence}; nothing was committed"
            ),
            Self::NullSequence {
                flow,
                key: Some(key),
            } => write!(
                f,
                "flow '{flow}': SEQUENCE BY value is NULL for key ({key}); nothing was committed"
            ),
            Self::NullSequence { flow, key: None } => write!(
                f,
                "flow '{flow}': SEQUENCE BY value is NULL in a TRUNCATE event; nothing was committed"
            ),
            Self::ConflictingEvents {
                flow,
                key,
                sequence,
                against_stored,
            } => {
                let against = if *against_stored {
                    " (against a stored event)"
                } else {
                    ""
                };
                write!(
                    f,
                    "flow '{flow}': conflicting events for key ({key}) at SEQUENCE BY value {sequence}{against}: \
                     two events with the same key and sequence differ in kind or content; nothing was committed"
                )
            }
            Self::CommitFailed {
                flow,
                target,
                cause,
                conflict,
            } => write!(
                f,
                "flow '{flow}': commit to '{target}' failed: {cause}; nothing of this update was committed{}",
                if *conflict {
                    " (another writer committed first): run it again"
                } else {
                    ""
                }
            ),
            Self::Internal(message) => write!(f, "internal error of datafusion-autocdc: {message}"),
        }
    }
}

impl std::error::Error for CdcError {}

impl From<CdcError> for DataFusionError {
    fn from(error: CdcError) -> Self {
        DataFusionError::External(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed error survives the wrapping DataFusion adds and still names
    /// its flow, key and value in its message.
    #[test]
    fn the_typed_error_is_found_through_wrapping() {
        let error: DataFusionError = CdcError::ConflictingEvents {
            flow: "f".into(),
            key: "id=1".into(),
            sequence: "5".into(),
            against_stored: true,
        }
        .into();
        let wrapped = DataFusionError::Shared(std::sync::Arc::new(error.context("while folding")));
        let found = CdcError::find(&wrapped).expect("typed error");
        assert_eq!(found.flow(), Some("f"));
        assert!(matches!(found, CdcError::ConflictingEvents { key, .. } if key == "id=1"));
        let text = wrapped.to_string();
        assert!(
            text.contains("flow 'f': conflicting events for key (id=1) at SEQUENCE BY value 5 (against a stored event)"),
            "{text}"
        );
        assert!(CdcError::find(&DataFusionError::Plan("x".into())).is_none());
    }
}
