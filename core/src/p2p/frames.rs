//! The received frames a connection keeps until its owner reads them.

/// Frames in arrival order, back to back in one buffer: keeping a received message costs
/// no allocation of its own, and a reader takes the whole lot at once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frames {
    bytes: Vec<u8>,
    /// Where each frame ends in `bytes`.
    ends: Vec<usize>,
}

impl Frames {
    /// Appends a copy of `frame`.
    pub fn push(&mut self, frame: &[u8]) {
        self.bytes.extend_from_slice(frame);
        self.ends.push(self.bytes.len());
    }

    /// How many frames are kept.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The frames in arrival order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts.zip(self.ends.iter().copied()).map(|(start, end)| &self.bytes[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_back_whole_and_in_order() {
        let mut f = Frames::default();
        assert!(f.is_empty());
        for frame in [&b"one"[..], b"", b"three"] {
            f.push(frame);
        }
        assert_eq!(f.len(), 3);
        assert_eq!(f.iter().collect::<Vec<_>>(), [&b"one"[..], b"", b"three"]);
    }
}
