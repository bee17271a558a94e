//! The six states of a consumer reservation and the moves allowed between them.

use std::fmt;

/// Where a reservation is in its life (Gen A).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum State {
    /// A destination is reserved and a remote writer may be writing into it.
    Writing,
    /// The writer completed; the tensor can be loaded.
    Ready,
    /// Cancelled while a writer may still write: memory kept until the writer completes
    /// or the producer abandons.
    CancelPending,
    /// Timed out while a writer may still write: memory kept likewise.
    ExpirePending,
    /// Terminal: cancelled (also the tombstone of a cancel-before-reserve).
    Cancelled,
    /// Terminal: timed out or refreshed away.
    Expired,
}

impl State {
    /// The reference's upper-case name, as it appears in its error messages.
    pub fn name(self) -> &'static str {
        match self {
            State::Writing => "WRITING",
            State::Ready => "READY",
            State::CancelPending => "CANCEL_PENDING",
            State::ExpirePending => "EXPIRE_PENDING",
            State::Cancelled => "CANCELLED",
            State::Expired => "EXPIRED",
        }
    }

    /// Visible through `status`.
    pub fn is_active(self) -> bool {
        !self.is_terminal()
    }

    /// CANCELLED or EXPIRED.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Cancelled | State::Expired)
    }

    /// Waiting for a writer that timeouts may no longer release.
    pub fn is_deferred(self) -> bool {
        matches!(self, State::CancelPending | State::ExpirePending)
    }

    /// A remote writer may still be writing into the destination.
    pub fn is_writer_owned(self) -> bool {
        matches!(self, State::Writing | State::CancelPending | State::ExpirePending)
    }

    /// The transition table of the reference (ec-behaviour.md §3.2).
    pub fn can_become(self, to: State) -> bool {
        use State::*;
        matches!(
            (self, to),
            (Writing, Ready | CancelPending | ExpirePending | Cancelled)
                | (Ready, Cancelled | Expired)
                | (CancelPending, Cancelled)
                | (ExpirePending, Cancelled | Expired)
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::State::*;
    use super::*;

    const ALL: [State; 6] = [Writing, Ready, CancelPending, ExpirePending, Cancelled, Expired];

    #[test]
    fn transition_table_matches_the_reference() {
        let allowed = [
            (Writing, Ready),
            (Writing, CancelPending),
            (Writing, ExpirePending),
            (Writing, Cancelled),
            (Ready, Cancelled),
            (Ready, Expired),
            (CancelPending, Cancelled),
            (ExpirePending, Cancelled),
            (ExpirePending, Expired),
        ];
        for from in ALL {
            for to in ALL {
                assert_eq!(from.can_become(to), allowed.contains(&(from, to)), "{from} -> {to}");
            }
        }
    }

    #[test]
    fn state_classes() {
        assert_eq!(ALL.iter().filter(|s| s.is_active()).count(), 4);
        assert_eq!(ALL.iter().filter(|s| s.is_deferred()).count(), 2);
        assert!(!Ready.is_writer_owned());
        assert!(ExpirePending.is_writer_owned());
        assert!(Cancelled.is_terminal() && Expired.is_terminal());
    }
}
