//! msgpack frames between Python objects and the wire, as msgspec maps them: `bytes`
//! stay bin, `str` stay str, integers take any width that fits msgpack. Objects are
//! written with the core's one writer (`value::Writer`) and built by the core's one
//! parser (`value::read`), with no intermediate value tree either way.

use crate::{keys, utf8};
use ctlplane_core::p2p::value::{self, Build, DecodeError, Writer};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// Writes `obj` as one msgpack value; what msgspec would refuse raises the same kind of
/// error (and leaves `w`'s buffer in an unspecified state).
pub fn write(w: &mut Writer<'_>, obj: &Bound<'_, PyAny>) -> PyResult<()> {
    if obj.is_none() {
        w.nil();
    } else if let Ok(b) = obj.cast::<PyBool>() {
        w.bool(b.is_true());
    } else if obj.is_instance_of::<PyInt>() {
        w.int(int_value(obj)?);
    } else if let Ok(s) = obj.cast::<PyString>() {
        write_str(w, s)?;
    } else if let Ok(d) = obj.cast::<PyDict>() {
        w.map(d.len());
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(PyTypeError::new_err("Only dicts with str keys are supported"));
            };
            write_str(w, key)?;
            write(w, &v)?;
        }
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

/// `obj` as one msgpack frame.
pub fn encode(obj: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    // Room for a typical control message, so the writer never grows the buffer.
    let mut frame = Vec::with_capacity(256);
    write(&mut Writer::new(&mut frame), obj)?;
    Ok(frame)
}

/// The Python object msgspec's `decode` builds from `frame`.
pub fn decode<'py>(py: Python<'py>, frame: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    value::read(frame, &mut PyBuilder { py }).map_err(|e| match e {
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
struct PyBuilder<'py> {
    py: Python<'py>,
}

type Built<'py> = Result<Bound<'py, PyAny>, BuildError>;

impl<'py> Build for PyBuilder<'py> {
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
        Ok(map.set_item(keys::key_string(self.py, key), value)?)
    }
    fn end_map(&mut self, map: Bound<'py, PyDict>) -> Built<'py> {
        Ok(map.into_any())
    }
}
