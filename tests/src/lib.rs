//! Shared helpers for ctlplane's integration tests.
