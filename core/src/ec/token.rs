//! The handle a sans-IO machine gives each request it hands a driver, so the answer finds
//! its way back (the producer's coordinator and the scheduler both number theirs).

/// Routes the answer of a transmitted request back to what asked for it; unique per
/// machine that issued it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub(crate) u64);

impl Token {
    /// The raw number.
    pub fn get(self) -> u64 {
        self.0
    }
}
