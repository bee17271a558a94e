//! Dict keys made once: JSON replies and msgpack messages repeat a handful of keys.

use pyo3::prelude::*;
use pyo3::types::PyString;
use std::cell::RefCell;

thread_local! {
    /// Keys already made, shared by every reply and message: both repeat a handful of
    /// keys, and a kept `str` also keeps its hash, so the dict insert does not hash it
    /// again. Bounded, so a peer inventing keys costs nothing lasting. Per thread (the GIL
    /// holder's), so taking a key costs no lock.
    static KEYS: RefCell<Vec<(Box<str>, Py<PyString>)>> = const { RefCell::new(Vec::new()) };
}
const MAX_KEPT_KEYS: usize = 64;
const MAX_KEPT_KEY_LEN: usize = 32;

pub fn key_string<'py>(py: Python<'py>, s: &str) -> Bound<'py, PyString> {
    if s.len() > MAX_KEPT_KEY_LEN {
        return PyString::new(py, s);
    }
    KEYS.with_borrow_mut(|keys| {
        if let Some((_, kept)) = keys.iter().find(|(k, _)| &**k == s) {
            return kept.bind(py).clone();
        }
        let made = PyString::new(py, s);
        if keys.len() < MAX_KEPT_KEYS {
            keys.push((s.into(), made.clone().unbind()));
        }
        made
    })
}
