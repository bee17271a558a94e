//! Request frames and result shapes of the EC channel: decided in the core
//! (`ctlplane_core::ec::requests`), re-exported here for the drivers' callers.

pub use ctlplane_core::ec::requests::*;
