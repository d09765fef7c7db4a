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

/// A typed AUTO CDC error (see the module docs). Its `Debug` is its
/// message (`CdcError("flow 'f': …")`): an error raised on a cluster's
/// executor reaches the client as the debug text of the errors around it,
/// and [`remote_message`] finds the message there.
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

impl fmt::Debug for CdcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("CdcError").field(&self.to_string()).finish()
    }
}

/// The message of the error that failed a cluster's task, in `text` (a
/// Ballista job failure, which carries the executor's error as its debug
/// text: `…DataFusionError(Shared(External(CdcError("flow 'f': …"))))`):
/// that of the innermost `CdcError`, else of the innermost execution or
/// planning error; `None` when `text` holds neither.
pub fn remote_message(text: &str) -> Option<String> {
    let start = [
        "CdcError(\"",
        "Execution(\"",
        "Plan(\"",
        "NotImplemented(\"",
    ]
    .iter()
    .filter_map(|marker| text.rfind(marker).map(|at| (at, marker.len())))
    // (a CdcError wins: it says the most; otherwise the innermost)
    .max_by_key(|(at, len)| (text[*at..].starts_with("CdcError"), *at + *len))?;
    let mut message = String::new();
    let mut chars = text[start.0 + start.1..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(message),
            '\\' => match chars.next()? {
                'n' => message.push('\n'),
                't' => message.push('\t'),
                'r' => message.push('\r'),
                '0' => message.push('\0'),
                'u' => {
                    // \u{…}
                    let code: String = chars.by_ref().skip(1).take_while(|c| *c != '}').collect();
                    message.push(char::from_u32(u32::from_str_radix(&code, 16).ok()?)?);
                }
                other => message.push(other),
            },
            c => message.push(c),
        }
    }
    None
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

    /// The message of an error raised on an executor is found in the debug
    /// text Ballista hands back.
    #[test]
    fn a_remote_message_is_found_in_debug_text() {
        let error = CdcError::NullKey {
            flow: "f".into(),
            column: "id".into(),
            kind: "UPSERT",
            sequence: "2".into(),
        };
        let wrapped = DataFusionError::Shared(std::sync::Arc::new(DataFusionError::External(
            Box::new(DataFusionError::External(Box::new(error))),
        )));
        let text = format!(
            "Job 0 failed: Task failed due to runtime execution error: {wrapped:?} and more"
        );
        assert_eq!(
            remote_message(&text).as_deref(),
            Some(
                "flow 'f': KEYS column 'id' is NULL in a UPSERT event with sequence 2; nothing \
                 was committed"
            )
        );
        let plain = DataFusionError::Execution("flow 'f': COLUMNS TO UPDATE: 'a\"b' \u{e9}".into());
        assert_eq!(
            remote_message(&format!("Job failed: {plain:?}")).as_deref(),
            Some("flow 'f': COLUMNS TO UPDATE: 'a\"b' \u{e9}")
        );
        assert_eq!(remote_message("a plain message"), None);
    }

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
