//! Shared test support.

pub mod venv;
