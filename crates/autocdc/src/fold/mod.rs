//! Per-key fold kernels.
//!
//! Kernels are pure: they consume Arrow batches already sorted by
//! `(keys, sequence, origin)` and produce the new stored state of every key
//! they see, without any I/O. The physical operators in
//! [`crate::physical`] drive them over DataFusion streams.

pub mod bitemporal;
pub mod columns;
pub mod count;
pub mod emits;
pub mod errors;
pub mod event_index;
pub mod index_sorted;
pub mod kernel;
pub mod key_slots;
pub mod late;
pub mod pairs;
pub mod partial;
pub mod per_column;
pub mod retained;
pub mod rows;
pub mod scd1;
pub mod scd1_indexed;
pub mod scd2;
pub mod scd2_indexed;
pub mod snapshot_diff;
pub mod snapshot_diff_indexed;

pub use columns::{EventLayout, Kind};
pub use index_sorted::IndexSortedFold;
pub use kernel::FoldKernel;
pub use partial::PartialUpdates;
pub use scd1::{FoldCounts, Scd1Fold};
pub use scd1_indexed::IndexedScd1Fold;
pub use scd2::Scd2Fold;
pub use scd2_indexed::IndexedScd2Fold;

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::Result;
use serde::{Deserialize, Serialize};

/// How the target stores history (`STORED AS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Serialize, Deserialize, Default)]
pub enum ScdType {
    /// `SCD TYPE 1`: latest row per key.
    #[default]
    Type1,
    /// `SCD TYPE 2`: versions with `__start_at` / `__end_at`.
    Type2,
    /// `BITEMPORAL`: business time × system time.
    Bitemporal,
}

impl std::fmt::Display for ScdType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Type1 => write!(f, "SCD TYPE 1"),
            Self::Type2 => write!(f, "SCD TYPE 2"),
            Self::Bitemporal => write!(f, "BITEMPORAL"),
        }
    }
}

/// How one partition orders and folds its events.
///
/// | engine        | applies to                                                        | events sorted by |
/// |---------------|-------------------------------------------------------------------|------------------|
/// | `Indexed`     | SCD 1 without partial updates; fixed-width sequence               | nothing: the [`IndexedScd1Fold`] folds its index |
/// | `Indexed`     | SCD 2 read as rows (a query), no partial updates; sequence ≤ 8 bytes | nothing: the [`IndexedScd2Fold`] folds its index |
/// | `IndexSorted` | every other fold; fixed-width sequence                            | an [`IndexSortedFold`] (a sorted index, then one gather) |
/// | `Sorted`      | wider sequences, or `autocdc.indexed_fold = false`                | DataFusion's sort below the operator |
///
/// The first two hold their partition's events in memory and fall back to
/// the third when the memory pool refuses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FoldEngine {
    Indexed,
    IndexSorted,
    Sorted,
}

impl FoldEngine {
    /// Name shown in `EXPLAIN` (`fold=…`).
    pub fn name(&self) -> &'static str {
        match self {
            Self::Indexed => "indexed",
            Self::IndexSorted => "index-sorted",
            Self::Sorted => "sorted",
        }
    }
}

/// What an `AutoCdc` operator folds: shared by the logical node, the exec
/// and the kernels.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Serialize, Deserialize)]
pub struct FoldSpec {
    /// Flow name (for messages).
    pub flow: String,
    /// Column positions of the event input.
    pub layout: EventLayout,
    /// Storage type.
    pub stored_as: ScdType,
    /// Tracked target columns (SCD 2).
    pub tracked: Vec<usize>,
    /// New events win ties with stored rows of equal sequence (a snapshot at
    /// `v` wins over events at `v`); otherwise the stored row wins and the event is late.
    pub new_wins_ties: bool,
    /// `IGNORE NULL UPDATES` / `COLUMNS TO UPDATE`.
    pub partial: Option<PartialUpdates>,
    /// Fold without DataFusion sorting the events where the keys and the
    /// sequence allow (see [`FoldSpec::engine`]).
    pub indexed_fold: bool,
    /// Bytes a partition's indexed fold may hold before it falls back to
    /// sorting (0: as many as the memory pool grants).
    pub indexed_fold_max_bytes: usize,
    /// Emit only the visible rows (live rows, versions): no tombstones,
    /// hidden events or change data feed rows. For a fold read as rows (a
    /// query's relation), never for one a target stores.
    #[serde(default)]
    pub visible_only: bool,
    /// The target's snapshot watermark (text of the sequence's type): new
    /// events at or below it are late ([`late`]). `None`: no snapshot yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_through: Option<String>,
}

impl FoldSpec {
    /// Schema of the stored rows produced from events of `input`.
    pub fn output_schema(&self, input: &Schema) -> Result<SchemaRef> {
        match self.stored_as {
            ScdType::Type1 if self.layout.group_sequences => {
                per_column::output_schema(&self.layout, input)
            }
            ScdType::Type1 => columns::scd1_output_schema(&self.layout, input),
            ScdType::Type2 => Ok(scd2::scd2_output_schema(&self.layout, input)),
            ScdType::Bitemporal => Ok(bitemporal::output_schema(&self.layout, input)),
        }
    }

    /// How events of `input` are ordered and folded (see [`FoldEngine`]).
    pub fn engine(&self, input: &Schema) -> FoldEngine {
        if !self.indexed_fold || !event_index::EventIndex::supports(&self.layout, input) {
            FoldEngine::Sorted
        } else if self.partial.is_none()
            && match self.stored_as {
                ScdType::Type1 => !self.layout.group_sequences,
                // a query's history (the versions only)
                ScdType::Type2 => {
                    self.visible_only && IndexedScd2Fold::supports(&self.layout, input)
                }
                ScdType::Bitemporal => false,
            }
        {
            FoldEngine::Indexed
        } else {
            FoldEngine::IndexSorted
        }
    }

    /// An indexed SCD 1 fold for one partition ([`FoldEngine::Indexed`]).
    pub fn indexed_kernel(&self, input: &SchemaRef) -> Result<IndexedScd1Fold> {
        Ok(
            IndexedScd1Fold::try_new(&self.flow, self.layout.clone(), input, self.new_wins_ties)?
                .with_visible_only(self.visible_only),
        )
    }

    /// An indexed SCD 2 fold of a query's partition ([`FoldEngine::Indexed`]).
    pub fn indexed_scd2_kernel(&self, input: &SchemaRef) -> Result<IndexedScd2Fold> {
        IndexedScd2Fold::try_new(&self.flow, self.layout.clone(), self.tracked.clone(), input)
    }

    /// A fresh kernel for one partition.
    pub fn kernel(&self, input: &SchemaRef) -> Result<Box<dyn FoldKernel>> {
        Ok(match self.stored_as {
            ScdType::Type1 if self.layout.group_sequences => {
                Box::new(per_column::PerColumnScd1Fold::try_new(
                    &self.flow,
                    self.layout.clone(),
                    self.partial.clone(),
                    input,
                )?)
            }
            ScdType::Type1 => {
                let fold = Scd1Fold::try_new(&self.flow, self.layout.clone(), input)?
                    .with_new_wins_ties(self.new_wins_ties)
                    .with_visible_only(self.visible_only);
                match &self.partial {
                    None => Box::new(fold),
                    Some(mode) => Box::new(partial::MergingScd1Fold::try_new(
                        &self.flow,
                        self.layout.clone(),
                        mode.clone(),
                        input,
                        fold,
                    )?),
                }
            }
            ScdType::Type2 => Box::new(
                Scd2Fold::try_new(
                    &self.flow,
                    self.layout.clone(),
                    self.tracked.clone(),
                    self.partial.clone(),
                    input,
                )?
                .with_visible_only(self.visible_only),
            ),
            ScdType::Bitemporal => Box::new(bitemporal::BitemporalFold::try_new(
                &self.flow,
                self.layout.clone(),
                input,
            )?),
        })
    }

    /// Key column names.
    pub fn key_names(&self) -> Vec<&str> {
        self.layout
            .key_indices
            .iter()
            .map(|&i| self.layout.target_columns[i].as_str())
            .collect()
    }
}

#[cfg(test)]
mod keys_only_tests;
#[cfg(test)]
mod test_support;
