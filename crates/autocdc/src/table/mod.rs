//! Streaming tables: Delta storage in the warehouse and the `TableProvider`
//! that shows their live rows.

pub mod bucket;
pub mod deletion_vectors;
mod dml;
pub mod meta;
pub(crate) mod provider;
pub mod stored_rows;
pub mod superseded;
mod warehouse;
pub mod writer;

pub use meta::{TableMeta, FLOW_KEY_PREFIX, TABLE_KEY};
pub use provider::ScdTable;
pub use warehouse::{TableName, Warehouse};
