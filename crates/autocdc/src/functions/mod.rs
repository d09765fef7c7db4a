//! Table functions installed by the extension.

mod snapshot_version;
mod stream;
mod table_as_of;
mod table_changes;

pub use snapshot_version::{
    MisplacedSnapshotVersion, SnapshotVersionFunction, CURRENT_SNAPSHOT_VERSION,
    LAST_SNAPSHOT_VERSION,
};
pub use stream::StreamFunction;
pub use table_as_of::TableAsOfFunction;
pub use table_changes::{TableChangesFunction, TableRegistry};
