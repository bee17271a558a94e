//! ZeroMQ socket semantics over turmoil TCP (in progress).
