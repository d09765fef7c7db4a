//! SPEC §2.2 for the events of one identity (key, sequence and, bitemporal,
//! system sequence): which of them count, when they conflict, and which new
//! ones a conflict rejects. `RejectsExec` applies it over a hash table of a
//! partition's identities, [`super::sorted_conflicts`] over events sorted by
//! identity; both feed it events' values encoded as rows (kind and target
//! columns).
//!
//! | the identity's counted events (new ones; stored upserts and deletes) | new events rejected |
//! |-----------------------------------------------------------------------|---------------------|
//! | all equal (kind and target columns)                                   | none                |
//! | not all equal, no stored event                                        | every new one       |
//! | not all equal, a stored event                                         | the new ones that differ from it (equal ones are replays) |
//!
//! Stored events are never rejected; DML events and erasure marks are not
//! counted (the fold drops what they corrected). The event an SCD 2 version
//! implies (`Origin::Implied`) is the identity's stored event when no event
//! is stored as itself there, by a flow or by DML (which it then is: see
//! `fold::scd2`).

use arrow::array::{AsArray, BooleanArray, RecordBatch};
use arrow::compute::kernels::boolean::{and, or};
use arrow::datatypes::Int8Type;
use datafusion::common::{DataFusionError, Result};

use crate::fold::columns::{Kind, Origin};

/// Where `batch`'s events have `origin`, its origin column at `column` (an
/// input without one holds new events only).
pub(crate) fn of_origin(
    batch: &RecordBatch,
    column: Option<usize>,
    origin: Origin,
) -> Result<BooleanArray> {
    let Some(column) = column else {
        return Ok(BooleanArray::from(vec![
            origin == Origin::New;
            batch.num_rows()
        ]));
    };
    let origins = batch
        .column(column)
        .as_primitive_opt::<Int8Type>()
        .ok_or_else(|| DataFusionError::Internal("the origin column is not Int8".into()))?;
    Ok(BooleanArray::from_unary(origins, |o| o == origin as i8))
}

/// How the rule meets an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Met {
    /// A new event.
    New,
    /// A stored event.
    Stored,
    /// The event a stored version implies ([`Origin::Implied`]): the
    /// identity's stored event, unless that is also stored as itself.
    Implied,
    /// An event a DML statement wrote: not counted, but the event a version
    /// implies there is that one (a new event there is a replay of what the
    /// statement corrected, which the fold drops).
    ByDml,
}

/// The origins of a batch's events, as the rule tells them apart.
#[derive(Debug)]
pub(crate) struct Origins {
    /// The new events.
    pub(crate) new: BooleanArray,
    stored: BooleanArray,
    implied: BooleanArray,
    by_dml: BooleanArray,
}

impl Origins {
    /// The origins of `batch`, its origin column at `column` (see
    /// [`of_origin`]).
    pub(crate) fn try_new(batch: &RecordBatch, column: Option<usize>) -> Result<Self> {
        Ok(Self {
            new: of_origin(batch, column, Origin::New)?,
            stored: of_origin(batch, column, Origin::Stored)?,
            implied: of_origin(batch, column, Origin::Implied)?,
            by_dml: of_origin(batch, column, Origin::StoredByDml)?,
        })
    }

    /// How event `i` is met (for a counted event).
    pub(crate) fn met(&self, i: usize) -> Met {
        if self.stored.value(i) {
            Met::Stored
        } else if self.implied.value(i) {
            Met::Implied
        } else if self.by_dml.value(i) {
            Met::ByDml
        } else {
            Met::New
        }
    }

    /// The events of `batch` the rule meets: the new ones, and the stored
    /// (implied, DML-written) upserts and deletes (kind column at `kind`).
    pub(crate) fn counted(&self, batch: &RecordBatch, kind: usize) -> Result<BooleanArray> {
        let kinds = batch
            .column(kind)
            .as_primitive_opt::<Int8Type>()
            .ok_or_else(|| DataFusionError::Internal("the kind column is not Int8".into()))?;
        let event = BooleanArray::from_unary(kinds, |k| {
            k == Kind::Upsert as i8 || k == Kind::Delete as i8
        });
        let stored = or(&or(&self.stored, &self.implied)?, &self.by_dml)?;
        Ok(or(&self.new, &and(&stored, &event)?)?)
    }
}

/// One identity's counted events, as they are met.
#[derive(Debug, Default)]
pub(crate) struct Identity<'a> {
    /// The values of its first new event.
    first_new: Option<&'a [u8]>,
    /// Whether another new event differs from the first.
    new_differ: bool,
    /// The values of its stored event, if any ...
    stored: Option<&'a [u8]>,
    /// ... and of the event a version implies, which counts only without
    /// a stored or DML-written one.
    implied: Option<&'a [u8]>,
    by_dml: bool,
}

impl<'a> Identity<'a> {
    /// A counted event with `values`, met as `met`.
    pub(crate) fn count(&mut self, values: &'a [u8], met: Met) {
        match met {
            Met::New => match self.first_new {
                None => self.first_new = Some(values),
                Some(first) => self.new_differ |= first != values,
            },
            Met::Stored => self.stored = Some(values),
            Met::Implied => self.implied = Some(values),
            Met::ByDml => self.by_dml = true,
        }
    }

    /// Its stored event: stored as itself, or implied by a version (but
    /// where DML wrote one, which is not counted).
    fn stored_event(&self) -> Option<&'a [u8]> {
        self.stored.or(self.implied.filter(|_| !self.by_dml))
    }

    /// Whether its counted events are not all equal.
    pub(crate) fn conflicts(&self) -> bool {
        self.new_differ
            || self
                .first_new
                .zip(self.stored_event())
                .is_some_and(|(new, stored)| new != stored)
    }

    /// Whether a new event of it with `values` is rejected.
    pub(crate) fn rejects(&self, values: &[u8]) -> bool {
        self.conflicts() && self.stored_event().is_none_or(|s| s != values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The new events the rule rejects, of one identity's `(values, stored)`
    /// events, all counted.
    fn rejected<'a>(events: &[(&'a str, Met)]) -> Vec<&'a str> {
        let mut identity = Identity::default();
        for (values, met) in events {
            identity.count(values.as_bytes(), *met);
        }
        events
            .iter()
            .filter(|(values, met)| *met == Met::New && identity.rejects(values.as_bytes()))
            .map(|(values, _)| *values)
            .collect()
    }

    #[test]
    fn each_row_of_the_table() {
        use Met::{ByDml, Implied, New, Stored};
        assert!(rejected(&[("a", New), ("a", New)]).is_empty());
        assert_eq!(
            rejected(&[("a", New), ("b", New), ("a", New)]),
            ["a", "b", "a"]
        );
        assert_eq!(rejected(&[("s", New), ("s", Stored), ("x", New)]), ["x"]);
        // equal to the stored event: a replay, whatever the order
        assert!(rejected(&[("s", Stored), ("s", New)]).is_empty());
        // a version's event is the stored one, unless that is stored too
        assert_eq!(rejected(&[("v", Implied), ("x", New)]), ["x"]);
        assert_eq!(rejected(&[("x", New), ("v", Implied), ("v", New)]), ["x"]);
        assert!(rejected(&[("v", New), ("v", Implied)]).is_empty());
        assert!(rejected(&[("m", Implied), ("r", Stored), ("r", New)]).is_empty());
        assert_eq!(
            rejected(&[("r", Stored), ("m", New), ("m", Implied)]),
            ["m"]
        );
        // a DML-written event is not counted, nor the version's event there
        assert!(rejected(&[("d", ByDml), ("d", Implied), ("x", New)]).is_empty());
        assert_eq!(
            rejected(&[("d", ByDml), ("x", New), ("y", New)]),
            ["x", "y"]
        );
    }
}
