//! Host programs: each drives one core machine over simulated sockets.
