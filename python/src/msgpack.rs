//! msgpack values between Python objects and the core's model, as msgspec maps them:
//! `bytes` stay bin, `str` stay str, integers take any width that fits msgpack.

use ctlplane_core::p2p::Value;
use pyo3::exceptions::{PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple};

/// The Python object msgspec's `decode` builds for `v`.
pub fn to_py<'py>(py: Python<'py>, v: &Value) -> PyResult<Bound<'py, PyAny>> {
    Ok(match v {
        Value::Nil => py.None().into_bound(py),
        Value::Bool(b) => PyBool::new(py, *b).to_owned().into_any(),
        Value::Int(i) => i.into_pyobject(py)?.into_any(),
        Value::Float(f) => PyFloat::new(py, *f).into_any(),
        Value::Str(s) => PyString::new(py, s).into_any(),
        Value::Bin(b) => PyBytes::new(py, b).into_any(),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_py(py, item)?)?;
            }
            list.into_any()
        }
        Value::Map(entries) => {
            let dict = PyDict::new(py);
            for (k, item) in entries {
                dict.set_item(k, to_py(py, item)?)?;
            }
            dict.into_any()
        }
    })
}

/// `obj` as a msgpack value; what msgspec would refuse raises the same kind of error.
pub fn from_py(obj: &Bound<'_, PyAny>) -> PyResult<Value> {
    if obj.is_none() {
        return Ok(Value::Nil);
    }
    if let Ok(b) = obj.cast::<PyBool>() {
        return Ok(Value::Bool(b.is_true()));
    }
    if obj.is_instance_of::<PyInt>() {
        let i: i128 = obj.extract().map_err(|_| PyOverflowError::new_err("Integer value out of range"))?;
        if i < i128::from(i64::MIN) || i > i128::from(u64::MAX) {
            return Err(PyOverflowError::new_err("Integer value out of range"));
        }
        return Ok(Value::Int(i));
    }
    if let Ok(f) = obj.cast::<PyFloat>() {
        return Ok(Value::Float(f.value()));
    }
    if let Ok(s) = obj.cast::<PyString>() {
        return Ok(Value::Str(s.to_cow()?.to_string()));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(Value::Bin(b.as_bytes().to_vec()));
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(Value::Bin(b.to_vec()));
    }
    if let Ok(d) = obj.cast::<PyDict>() {
        let mut entries = Vec::with_capacity(d.len());
        for (k, v) in d.iter() {
            let Ok(key) = k.cast::<PyString>() else {
                return Err(PyTypeError::new_err("Only dicts with str keys are supported"));
            };
            entries.push((key.to_cow()?.to_string(), from_py(&v)?));
        }
        return Ok(Value::Map(entries));
    }
    if let Ok(l) = obj.cast::<PyList>() {
        return l.iter().map(|item| from_py(&item)).collect::<PyResult<Vec<_>>>().map(Value::Array);
    }
    if let Ok(t) = obj.cast::<PyTuple>() {
        return t.iter().map(|item| from_py(&item)).collect::<PyResult<Vec<_>>>().map(Value::Array);
    }
    let type_name = obj.get_type().name()?;
    Err(PyTypeError::new_err(format!("Encoding objects of type {type_name} is unsupported")))
}
