//! The readiness events a shard holds for its PUSH socket, in one byte buffer.
//!
//! Every READY record costs one event, so the queue is on the path of every completion:
//! events are written straight into a reused buffer (no allocation per event) and sent
//! from it in order. The oldest event is dropped when the backlog is full.

use std::collections::VecDeque;

/// Bytes already sent that a push may reclaim by moving the rest to the front.
const COMPACT_AT: usize = 64 * 1024;

/// A FIFO of encoded event frames.
#[derive(Clone, Debug, Default)]
pub(crate) struct EventQueue {
    /// Frames back to back; the queue's first frame starts at `head`.
    buf: Vec<u8>,
    head: usize,
    /// The length of every queued frame, oldest first.
    lens: VecDeque<usize>,
}

impl EventQueue {
    /// Number of queued frames.
    pub(crate) fn len(&self) -> usize {
        self.lens.len()
    }

    /// The oldest frame.
    pub(crate) fn front(&self) -> Option<&[u8]> {
        let len = *self.lens.front()?;
        self.buf.get(self.head..self.head + len)
    }

    /// Drops the oldest frame; `false` if there was none.
    pub(crate) fn pop_front(&mut self) -> bool {
        let Some(len) = self.lens.pop_front() else { return false };
        self.head += len;
        if self.lens.is_empty() {
            self.buf.clear();
            self.head = 0;
        }
        true
    }

    /// Appends the frame `write` puts at the end of the buffer it is handed.
    pub(crate) fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        // Amortised: at most as many bytes move as were sent since the last move.
        if self.head >= COMPACT_AT && self.head >= self.buf.len() / 2 {
            self.buf.drain(..self.head);
            self.head = 0;
        }
        let start = self.buf.len();
        write(&mut self.buf);
        self.lens.push_back(self.buf.len() - start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_come_out_in_order_across_compactions() {
        let mut q = EventQueue::default();
        let frame = |i: usize| format!("{{\"event\": {i}, \"pad\": \"{}\"}}", "x".repeat(i % 300)).into_bytes();
        let mut next_out = 0;
        for i in 0..5000 {
            q.push_with(|out| out.extend_from_slice(&frame(i)));
            if i % 3 != 0 {
                assert_eq!(q.front(), Some(frame(next_out).as_slice()));
                assert!(q.pop_front());
                next_out += 1;
            }
        }
        assert_eq!(q.len(), 5000 - next_out);
        while let Some(f) = q.front() {
            assert_eq!(f, frame(next_out).as_slice());
            q.pop_front();
            next_out += 1;
        }
        assert_eq!(next_out, 5000);
        assert!(!q.pop_front());
        q.push_with(|out| out.extend_from_slice(b"{}"));
        assert_eq!(q.front(), Some(&b"{}"[..]));
    }
}
