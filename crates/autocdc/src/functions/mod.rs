//! Table functions installed by the extension.

mod snapshot_version;
mod stream;

pub use snapshot_version::{
    MisplacedSnapshotVersion, SnapshotVersionFunction, CURRENT_SNAPSHOT_VERSION,
    LAST_SNAPSHOT_VERSION,
};
pub use stream::StreamFunction;
