//! P2P peers in the simulated world: registry + session hosts over the ZeroMQ model (in progress).
