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
//! counted (the fold drops what they corrected).

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

/// The events of `batch` that count: the `new` ones, and the `stored`
/// upserts and deletes (kind column at `kind`).
pub(crate) fn counted(
    batch: &RecordBatch,
    kind: usize,
    new: &BooleanArray,
    stored: &BooleanArray,
) -> Result<BooleanArray> {
    let kinds = batch
        .column(kind)
        .as_primitive_opt::<Int8Type>()
        .ok_or_else(|| DataFusionError::Internal("the kind column is not Int8".into()))?;
    let event = BooleanArray::from_unary(kinds, |k| {
        k == Kind::Upsert as i8 || k == Kind::Delete as i8
    });
    Ok(or(new, &and(stored, &event)?)?)
}

/// One identity's counted events, as they are met.
#[derive(Debug, Default)]
pub(crate) struct Identity<'a> {
    /// The values of its first counted event.
    first: Option<&'a [u8]>,
    /// Whether another counted event differs from the first.
    conflict: bool,
    /// The values of its stored event, if any.
    stored: Option<&'a [u8]>,
}

impl<'a> Identity<'a> {
    /// A counted event with `values`, `stored` or new.
    pub(crate) fn count(&mut self, values: &'a [u8], stored: bool) {
        match self.first {
            None => self.first = Some(values),
            Some(first) => self.conflict |= first != values,
        }
        if stored {
            self.stored = Some(values);
        }
    }

    /// Whether its counted events are not all equal.
    pub(crate) fn conflicts(&self) -> bool {
        self.conflict
    }

    /// Whether a new event of it with `values` is rejected.
    pub(crate) fn rejects(&self, values: &[u8]) -> bool {
        self.conflict && self.stored.is_none_or(|s| s != values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The new events the rule rejects, of one identity's `(values, stored)`
    /// events, all counted.
    fn rejected<'a>(events: &[(&'a str, bool)]) -> Vec<&'a str> {
        let mut identity = Identity::default();
        for (values, stored) in events {
            identity.count(values.as_bytes(), *stored);
        }
        events
            .iter()
            .filter(|(values, stored)| !stored && identity.rejects(values.as_bytes()))
            .map(|(values, _)| *values)
            .collect()
    }

    #[test]
    fn each_row_of_the_table() {
        assert!(rejected(&[("a", false), ("a", false)]).is_empty());
        assert_eq!(
            rejected(&[("a", false), ("b", false), ("a", false)]),
            ["a", "b", "a"]
        );
        assert_eq!(rejected(&[("s", false), ("s", true), ("x", false)]), ["x"]);
        // equal to the stored event: a replay, whatever the order
        assert!(rejected(&[("s", true), ("s", false)]).is_empty());
    }
}
