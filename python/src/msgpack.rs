//! msgpack frames between Python objects and the wire, as msgspec maps them: `bytes`
//! stay bin, `str` stay str, integers take any width that fits msgpack. Objects are
//! written with the core's one writer (`value::Writer`) and built by the core's one
//! parser (`value::read`), with no intermediate value tree either way.

use crate::keys::{self, Kept};
use crate::utf8;
use ctlplane_core::p2p::value::{self, Build, DecodeError, Writer};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use pyo3::Borrowed;

/// Writes `obj` as one msgpack value; what msgspec would refuse raises the same kind of
/// error (and leaves `w`'s buffer in an unspecified state).
pub fn write(w: &mut Writer<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    // The exact types control messages are made of first, one pointer comparison each;
    // subclasses and the rarer types take the checks below, in msgspec's order.
    if let Ok(s) = obj.cast_exact::<PyString>() {
        return write_str(w, s);
    }
    if obj.is_exact_instance_of::<PyInt>() {
        w.int(int_value(obj)?);
        return Ok(());
    }
    if let Ok(b) = obj.cast_exact::<PyBytes>() {
        w.bin(b.as_bytes());
        return Ok(());
    }
    if let Ok(d) = obj.cast_exact::<PyDict>() {
        return write_dict(w, d);
    }
    if obj.is_none() {
        w.nil();
    } else if let Ok(b) = obj.cast::<PyBool>() {
        w.bool(b.is_true());
    } else if obj.is_instance_of::<PyInt>() {
        w.int(int_value(obj)?);
    } else if let Ok(s) = obj.cast::<PyString>() {
        write_str(w, s)?;
    } else if let Ok(d) = obj.cast::<PyDict>() {
        write_dict(w, d)?;
    } else if let Ok(b) = obj.cast::<PyBytes>() {
        w.bin(b.as_bytes());
    } else if let Ok(f) = obj.cast::<PyFloat>() {
        w.float(f.value());
    } else if let Ok(l) = obj.cast::<PyList>() {
        w.array(l.len());
        for item in l.iter() {
            write(w, &item)?;
        }
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        w.array(t.len());
        for item in t.iter() {
            write(w, &item)?;
        }
    } else if let Ok(b) = obj.cast::<PyByteArray>() {
        w.bin(&b.to_vec());
    } else {
        let type_name = obj.get_type().name()?;
        return Err(PyTypeError::new_err(format!("Encoding objects of type {type_name} is unsupported")));
    }
    Ok(())
}

fn write_dict(w: &mut Writer<'_>, d: &Bound<'_, PyDict>) -> PyResult<()> {
    w.map(d.len());
    let py = d.py();
    let (mut pos, mut key, mut value): (ffi::Py_ssize_t, *mut ffi::PyObject, *mut ffi::PyObject) =
        (0, std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `PyDict_Next` hands out borrowed references, valid while the dict is not
    // changed. The GIL is held throughout and writing runs no Python code (exact `str`
    // keys, values read through C accessors), so nothing can change it meanwhile.
    while unsafe { ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
        let (key, value) = unsafe { (Borrowed::from_ptr(py, key), Borrowed::from_ptr(py, value)) };
        let Ok(key) = key.cast::<PyString>() else {
            return Err(PyTypeError::new_err("Only dicts with str keys are supported"));
        };
        write_str(w, &key)?;
        write(w, &value)?;
    }
    Ok(())
}

fn write_str(w: &mut Writer<'_>, s: &Bound<'_, PyString>) -> PyResult<()> {
    match utf8::as_str(s) {
        Some(text) => w.str(text),
        // Lone surrogates: `to_cow` raises the encoding error msgspec raises.
        None => w.str(&s.to_cow()?),
    }
    Ok(())
}

/// An `int` within msgpack's range (`-2^63 ..= 2^64 - 1`), else `OverflowError`.
fn int_value(obj: &Bound<'_, PyAny>) -> PyResult<i128> {
    if let Ok(i) = obj.extract::<i64>() {
        return Ok(i128::from(i));
    }
    obj.extract::<u64>().map(i128::from).map_err(|_| PyOverflowError::new_err("Integer value out of range"))
}

/// The Python objects msgspec's `decode` builds from each frame, in order, in one list.
pub fn decode_list<'a, 'py>(
    py: Python<'py>,
    frames: impl IntoIterator<Item = &'a [u8]>,
) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    keys::with_kept(|keys| {
        for frame in frames {
            // Every call here runs with the GIL held and no Python code, so the kept keys
            // stay borrowed for the whole batch.
            list.append(decode_with(py, keys, frame)?)?;
        }
        Ok(list)
    })
}

fn decode_with<'py>(py: Python<'py>, keys: &mut Kept, frame: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    value::read(frame, &mut PyBuilder { py, keys }).map_err(|e| match e {
        BuildError::Frame(e) => PyValueError::new_err(e.to_string()),
        BuildError::Py(e) => e,
    })
}

enum BuildError {
    Frame(DecodeError),
    Py(PyErr),
}

impl From<DecodeError> for BuildError {
    fn from(e: DecodeError) -> Self {
        BuildError::Frame(e)
    }
}

impl From<PyErr> for BuildError {
    fn from(e: PyErr) -> Self {
        BuildError::Py(e)
    }
}

/// Builds Python objects as msgspec does.
struct PyBuilder<'py, 'k> {
    py: Python<'py>,
    keys: &'k mut Kept,
}

type Built<'py> = Result<Bound<'py, PyAny>, BuildError>;

impl<'py> Build for PyBuilder<'py, '_> {
    type Node = Bound<'py, PyAny>;
    type Seq = Bound<'py, PyList>;
    type Map = Bound<'py, PyDict>;
    type Error = BuildError;

    fn nil(&mut self) -> Built<'py> {
        Ok(self.py.None().into_bound(self.py))
    }
    fn bool(&mut self, b: bool) -> Built<'py> {
        Ok(PyBool::new(self.py, b).to_owned().into_any())
    }
    fn int(&mut self, i: i128) -> Built<'py> {
        // The parser yields nothing beyond msgpack's range, which u64 and i64 cover.
        Ok(match i64::try_from(i) {
            Ok(i) => PyInt::new(self.py, i).into_any(),
            Err(_) => PyInt::new(self.py, u64::try_from(i).unwrap_or(u64::MAX)).into_any(),
        })
    }
    fn float(&mut self, x: f64) -> Built<'py> {
        Ok(PyFloat::new(self.py, x).into_any())
    }
    fn str(&mut self, s: &str) -> Built<'py> {
        Ok(PyString::new(self.py, s).into_any())
    }
    fn bin(&mut self, b: &[u8]) -> Built<'py> {
        Ok(PyBytes::new(self.py, b).into_any())
    }
    fn seq(&mut self, _len: usize) -> Result<Bound<'py, PyList>, BuildError> {
        Ok(PyList::empty(self.py))
    }
    fn push(&mut self, seq: &mut Bound<'py, PyList>, item: Bound<'py, PyAny>) -> Result<(), BuildError> {
        Ok(seq.append(item)?)
    }
    fn end_seq(&mut self, seq: Bound<'py, PyList>) -> Built<'py> {
        Ok(seq.into_any())
    }
    fn map(&mut self, _len: usize) -> Result<Bound<'py, PyDict>, BuildError> {
        Ok(PyDict::new(self.py))
    }
    fn insert(&mut self, map: &mut Bound<'py, PyDict>, key: &str, value: Bound<'py, PyAny>) -> Result<(), BuildError> {
        Ok(map.set_item(self.keys.key(self.py, key), value)?)
    }
    fn end_map(&mut self, map: Bound<'py, PyDict>) -> Built<'py> {
        Ok(map.into_any())
    }
}
