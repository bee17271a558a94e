//! JSON values between Python objects and `serde_json` (the EC channel's payloads).

use crate::utf8;
use ctlplane_core::ec::dumps;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};
use serde_json::{Number, Value};

/// The Python object `json.loads` would build from `v`.
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Null => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Number(n) => number_to_py(py, n)?,
        Value::String(s) => PyString::new(py, s).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Object(map) => {
            let dict = PyDict::new(py);
            for (k, item) in map {
                dict.set_item(k, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// An integer literal becomes an `int` of any width, anything else a `float`, as
/// `json.loads` reads them.
fn number_to_py<'py>(py: Python<'py>, n: &Number) -> PyResult<Bound<'py, PyAny>> {
    if let Some(i) = n.as_i64() {
        return Ok(i.into_pyobject(py)?.into_any());
    }
    if let Some(u) = n.as_u64() {
        return Ok(u.into_pyobject(py)?.into_any());
    }
    let text = n.to_string();
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        return py.get_type::<PyInt>().call1((text,));
    }
    match text.parse::<f64>() {
        Ok(f) => Ok(PyFloat::new(py, f).into_any()),
        Err(_) => Err(PyValueError::new_err(format!("unreadable JSON number {text}"))),
    }
}

/// Appends `obj` as `json.dumps(obj)` writes it (default separators, `ensure_ascii`,
/// dict order kept), or returns `None` for what this writer leaves to `json.dumps`
/// itself: floats (Python's `repr` spelling, NaN), integers beyond 64 bits, non-`str`
/// keys, lone surrogates and every other type. `out` is then in an unspecified state.
pub fn write(out: &mut Vec<u8>, obj: &Bound<'_, PyAny>) -> Option<()> {
    if obj.is_none() {
        out.extend_from_slice(b"null");
    } else if let Ok(b) = obj.cast_exact::<PyBool>() {
        out.extend_from_slice(if b.is_true() { b"true" } else { b"false" });
    } else if let Ok(s) = obj.cast_exact::<PyString>() {
        dumps::write_str(out, utf8::as_str(s)?);
    } else if obj.is_exact_instance_of::<PyInt>() {
        match obj.extract::<i64>() {
            Ok(i) if i < 0 => {
                out.push(b'-');
                dumps::write_u64(out, i.unsigned_abs());
            }
            Ok(i) => dumps::write_u64(out, i.unsigned_abs()),
            Err(_) => dumps::write_u64(out, obj.extract::<u64>().ok()?),
        }
    } else if let Ok(d) = obj.cast_exact::<PyDict>() {
        out.push(b'{');
        for (i, (k, v)) in d.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b", ");
            }
            dumps::write_str(out, utf8::as_str(k.cast_exact::<PyString>().ok()?)?);
            out.extend_from_slice(b": ");
            write(out, &v)?;
        }
        out.push(b'}');
    } else if let Ok(l) = obj.cast_exact::<PyList>() {
        write_items(out, l.iter())?;
    } else if let Ok(t) = obj.cast_exact::<PyTuple>() {
        write_items(out, t.iter())?;
    } else {
        return None;
    }
    Some(())
}

fn write_items<'py>(out: &mut Vec<u8>, items: impl Iterator<Item = Bound<'py, PyAny>>) -> Option<()> {
    out.push(b'[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        write(out, &item)?;
    }
    out.push(b']');
    Some(())
}
