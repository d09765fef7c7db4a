//! Per-key fold kernels.
//!
//! Kernels are pure: they consume Arrow batches already sorted by
//! `(keys, sequence, origin)` and produce the new stored state of every key
//! they see, without any I/O. The physical operators in
//! [`crate::physical`] drive them over DataFusion streams.

pub mod columns;
pub mod scd1;

pub use columns::{EventLayout, Kind, Origin};
pub use scd1::{FoldCounts, Scd1Fold};
