//! Conflicting events in events sorted by identity: the streaming check
//! `RejectsExec` falls back to when the memory pool refuses to hold a
//! partition's events (they are sorted, spilling, by key and sequence).
//!
//! Events of one identity (key, sequence and, bitemporal, system sequence)
//! are adjacent; the last identity of a batch may go on in the next, so its
//! rows are carried over. Each identity's events are judged by SPEC §2.2's
//! rule as `RejectsExec` judges them over a hash table
//! ([`super::conflict_rule`]). The kernel is I/O-free: batches in, checked
//! batches out.

use arrow::array::{BooleanArray, RecordBatch};
use arrow::compute::concat_batches;
use arrow::datatypes::SchemaRef;
use arrow::row::{RowConverter, Rows, SortField};
use datafusion::common::Result;

use super::conflict_rule::{Identity, Origins};

/// Rows whose identities are complete, and which of them to reject.
pub(crate) struct Checked {
    pub batch: RecordBatch,
    /// New events of an identity whose events conflict.
    pub conflicting: BooleanArray,
}

/// The streaming conflict check (see the module docs).
pub(crate) struct SortedConflicts {
    schema: SchemaRef,
    group: Vec<usize>,
    values: Vec<usize>,
    kind: usize,
    origin: Option<usize>,
    group_rows: RowConverter,
    value_rows: RowConverter,
    /// The rows of the last identity seen, which may go on.
    carry: Option<RecordBatch>,
}

impl SortedConflicts {
    /// For events of `schema` sorted by the `group` columns (their
    /// identity); `values` must agree among equal events; `origin`: the
    /// column telling new from stored events, if stored ones come along.
    pub(crate) fn try_new(
        schema: SchemaRef,
        group: Vec<usize>,
        values: Vec<usize>,
        kind: usize,
        origin: Option<usize>,
    ) -> Result<Self> {
        let converter = |columns: &[usize]| {
            RowConverter::new(
                columns
                    .iter()
                    .map(|&c| SortField::new(schema.field(c).data_type().clone()))
                    .collect(),
            )
        };
        Ok(Self {
            group_rows: converter(&group)?,
            value_rows: converter(&values)?,
            schema,
            group,
            values,
            kind,
            origin,
            carry: None,
        })
    }

    /// Take the next sorted batch; returns the rows of the identities it
    /// completed.
    pub(crate) fn push(&mut self, batch: RecordBatch) -> Result<Option<Checked>> {
        let batch = match self.carry.take() {
            Some(carried) => concat_batches(&self.schema, [&carried, &batch])?,
            None => batch,
        };
        let n = batch.num_rows();
        if n == 0 {
            return Ok(None);
        }
        let groups = self.encode(&self.group_rows, &self.group, &batch)?;
        let mut last = n - 1;
        while last > 0 && groups.row(last - 1) == groups.row(n - 1) {
            last -= 1;
        }
        self.carry = Some(batch.slice(last, n - last));
        if last == 0 {
            return Ok(None);
        }
        self.check(batch.slice(0, last)).map(Some)
    }

    /// The input ended: the rows of the last identity.
    pub(crate) fn finish(&mut self) -> Result<Option<Checked>> {
        self.carry.take().map(|batch| self.check(batch)).transpose()
    }

    fn encode(
        &self,
        converter: &RowConverter,
        columns: &[usize],
        batch: &RecordBatch,
    ) -> Result<Rows> {
        let arrays: Vec<_> = columns.iter().map(|&c| batch.column(c).clone()).collect();
        Ok(converter.convert_columns(&arrays)?)
    }

    /// The conflicting new events of `batch`, whose identities are complete.
    fn check(&self, batch: RecordBatch) -> Result<Checked> {
        let n = batch.num_rows();
        let groups = self.encode(&self.group_rows, &self.group, &batch)?;
        let values = self.encode(&self.value_rows, &self.values, &batch)?;
        let origins = Origins::try_new(&batch, self.origin)?;
        let counted = origins.counted(&batch, self.kind)?;
        let mut conflicting = vec![false; n];
        let mut start = 0;
        while start < n {
            let mut end = start + 1;
            while end < n && groups.row(end) == groups.row(start) {
                end += 1;
            }
            let mut identity = Identity::default();
            for i in (start..end).filter(|&i| counted.value(i)) {
                identity.count(values.row(i).data(), origins.met(i));
            }
            if identity.conflicts() {
                for (i, flag) in conflicting.iter_mut().enumerate().take(end).skip(start) {
                    *flag = origins.new.value(i) && identity.rejects(values.row(i).data());
                }
            }
            start = end;
        }
        Ok(Checked {
            batch,
            conflicting: BooleanArray::from(conflicting),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fold::columns::{Kind, Origin};
    use arrow::array::AsArray;
    use arrow::array::{Int64Array, Int8Array, StringArray};
    use arrow::datatypes::{DataType, Field, Schema};
    use std::sync::Arc;

    /// (id, seq, v, kind, origin) events, sorted by (id, seq).
    fn events(rows: &[(i64, i64, &str, Kind, Origin)]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("seq", DataType::Int64, false),
            Field::new("v", DataType::Utf8, false),
            Field::new("kind", DataType::Int8, false),
            Field::new("origin", DataType::Int8, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2))),
                Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.3 as i8))),
                Arc::new(Int8Array::from_iter_values(rows.iter().map(|r| r.4 as i8))),
            ],
        )
        .unwrap()
    }

    /// The (id, v) of the rejected rows, pushing `batches` in turn.
    fn rejected(batches: Vec<RecordBatch>) -> Result<Vec<(i64, String)>> {
        let schema = batches[0].schema();
        let mut check = SortedConflicts::try_new(schema, vec![0, 1], vec![2, 3], 3, Some(4))?;
        let mut checked = Vec::new();
        for batch in batches {
            checked.extend(check.push(batch)?);
        }
        checked.extend(check.finish()?);
        let mut out = Vec::new();
        for Checked { batch, conflicting } in checked {
            let ids = batch
                .column(0)
                .as_primitive::<arrow::datatypes::Int64Type>();
            let vs = batch.column(2).as_string::<i32>();
            for i in conflicting.values().set_indices() {
                out.push((ids.value(i), vs.value(i).to_string()));
            }
        }
        Ok(out)
    }

    #[test]
    fn each_row_of_the_table() -> Result<()> {
        use Kind::{Delete as D, Upsert as U};
        use Origin::{Dml, Implied as I, New as N, Stored as S, StoredByDml};
        let all = events(&[
            // equal events: none
            (1, 1, "a", U, N),
            (1, 1, "a", U, N),
            // differing, no stored event: every new one
            (2, 1, "a", U, N),
            (2, 1, "b", U, N),
            (2, 1, "a", U, N),
            // differing, a stored event: those differing from it
            (3, 1, "s", U, S),
            (3, 1, "s", U, N),
            (3, 1, "x", U, N),
            // a kind differs
            (4, 2, "a", U, N),
            (4, 2, "a", D, N),
            // a DML event is not counted
            (5, 1, "d", U, Dml),
            (5, 1, "a", U, N),
            // a version's event is the stored one ...
            (6, 1, "v", U, I),
            (6, 1, "v", U, N),
            (6, 1, "y", U, N),
            // ... but where the event is stored as itself
            (7, 1, "raw", U, S),
            (7, 1, "merged", U, I),
            (7, 1, "raw", U, N),
            // ... or written by DML: not counted, the new event is a replay
            (8, 1, "dml", U, StoredByDml),
            (8, 1, "dml", U, I),
            (8, 1, "x", U, N),
        ]);
        let expected = [
            (2, "a".to_string()),
            (2, "b".into()),
            (2, "a".into()),
            (3, "x".into()),
            (4, "a".into()),
            (4, "a".into()),
            (6, "y".into()),
        ];
        assert_eq!(rejected(vec![all.clone()])?, expected);
        // the same, cut anywhere into batches (identities across batches)
        for size in 1..all.num_rows() {
            let batches: Vec<_> = (0..all.num_rows())
                .step_by(size)
                .map(|s| all.slice(s, size.min(all.num_rows() - s)))
                .collect();
            assert_eq!(rejected(batches)?, expected, "batches of {size}");
        }
        Ok(())
    }
}
