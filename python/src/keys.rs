//! Dict keys made once: JSON replies and msgpack messages repeat a handful of keys.

use pyo3::prelude::*;
use pyo3::types::PyString;
use std::cell::RefCell;

thread_local! {
    /// Keys already made, shared by every reply and message: both repeat a handful of
    /// keys, and a kept `str` also keeps its hash, so the dict insert does not hash it
    /// again. Bounded, so a peer inventing keys costs nothing lasting. Per thread (the GIL
    /// holder's), so taking a key costs no lock.
    static KEYS: RefCell<Kept> = const { RefCell::new(Kept { keys: Vec::new(), next: 0 }) };
}
const MAX_KEPT_KEYS: usize = 64;
const MAX_KEPT_KEY_LEN: usize = 32;

pub struct Kept {
    keys: Vec<(Box<str>, Py<PyString>)>,
    /// Where the key after the last one taken was kept: messages of one kind repeat
    /// their keys in one order, so the next key is mostly found at the first look.
    next: usize,
}

impl Kept {
    /// The kept `str` for `s`, made (and kept, while there is room) if new.
    pub fn key<'py>(&mut self, py: Python<'py>, s: &str) -> Bound<'py, PyString> {
        if s.len() > MAX_KEPT_KEY_LEN {
            return PyString::new(py, s);
        }
        let hit = match self.keys.get(self.next) {
            Some((k, _)) if &**k == s => Some(self.next),
            _ => self.keys.iter().position(|(k, _)| &**k == s),
        };
        if let Some(i) = hit {
            self.next = i + 1;
            return self.keys[i].1.bind(py).clone();
        }
        let made = PyString::new(py, s);
        if self.keys.len() < MAX_KEPT_KEYS {
            self.keys.push((s.into(), made.clone().unbind()));
            self.next = self.keys.len();
        }
        made
    }
}

/// Runs `f` with this thread's kept keys: a batch of messages takes them once.
pub fn with_kept<T>(f: impl FnOnce(&mut Kept) -> T) -> T {
    KEYS.with_borrow_mut(f)
}

/// One key (see [`Kept::key`]).
pub fn key_string<'py>(py: Python<'py>, s: &str) -> Bound<'py, PyString> {
    with_kept(|kept| kept.key(py, s))
}
