//! Table functions installed by the extension.

mod stream;

pub use stream::StreamFunction;
