//! Borrowing a `str`'s UTF-8 bytes without a copy.
//!
//! `PyUnicode_AsUTF8AndSize` joined the limited API only in 3.10, so under abi3-py39
//! PyO3 reads a `str` through a temporary `bytes` object. The function itself is
//! exported with the same signature by every CPython 3.x, so it is declared here and
//! called directly: the UTF-8 form is cached in the string (ASCII strings hand out their
//! own buffer), and a request's dozen strings cost no allocations.

use pyo3::ffi::{PyObject, Py_ssize_t};
use pyo3::prelude::*;
use pyo3::types::PyString;
use std::os::raw::c_char;

extern "C" {
    fn PyUnicode_AsUTF8AndSize(unicode: *mut PyObject, size: *mut Py_ssize_t) -> *const c_char;
}

/// `s` as UTF-8, or `None` (no error left set) when it holds lone surrogates.
pub fn as_str<'a>(s: &'a Bound<'_, PyString>) -> Option<&'a str> {
    let mut size: Py_ssize_t = 0;
    // SAFETY: `s` is a live `str` (the GIL is held through the `Bound`); the returned
    // buffer is owned by `s` and lives as long as it, which the lifetime `'a` ties.
    let data = unsafe { PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut size) };
    if data.is_null() {
        // A lone surrogate: drop the UnicodeEncodeError, the caller falls back.
        let _ = PyErr::take(s.py());
        return None;
    }
    let len = usize::try_from(size).ok()?;
    // SAFETY: CPython hands out `len` valid bytes at `data`, and they are UTF-8: it
    // refused (NULL, handled above) every string that has no UTF-8 form.
    Some(unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(data.cast::<u8>(), len)) })
}
