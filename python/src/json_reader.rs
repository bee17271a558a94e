//! Builds Python objects straight from a reply's JSON text, as `json.loads` would, without
//! an intermediate value tree.
//!
//! Anything this reader does not take (lone surrogates, NaN, nesting deeper than
//! serde_json's limit) is an error, and the caller hands the text to `json.loads`.

use crate::keys;
use ctlplane_core::ec::scan::Scan;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyList, PyString};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// The key serde_json's `arbitrary_precision` uses to hand a number over as its text.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// `text` as Python objects, or `None` when `json.loads` must read it.
pub fn loads<'py>(py: Python<'py>, text: &[u8]) -> Option<Bound<'py, PyAny>> {
    if let Some(flat) = flat_object(py, text) {
        return Some(flat);
    }
    let mut de = serde_json::Deserializer::from_slice(text);
    let value = Seed { py }.deserialize(&mut de).ok()?;
    de.end().ok()?;
    Some(value)
}

/// An object of strings, non-negative integers, booleans and nulls in `json.dumps`'s
/// layout (every reply a shard sends), read with the core's scanner. Anything else, or a
/// Python error, is `None` and goes to the general reader; what the scanner accepts reads
/// as the same value there, so the shortcut changes nothing but the cost.
fn flat_object<'py>(py: Python<'py>, text: &[u8]) -> Option<Bound<'py, PyAny>> {
    let mut scan = Scan::new(text);
    scan.lit(b"{")?;
    let dict = PyDict::new(py);
    if !scan.eat(b"}") {
        loop {
            let key = scan.str()?;
            scan.lit(b": ")?;
            let value = match scan.peek()? {
                b'"' => PyString::new(py, scan.str()?).into_any(),
                b't' | b'f' => PyBool::new(py, scan.bool()?).to_owned().into_any(),
                b'n' => {
                    scan.lit(b"null")?;
                    py.None().into_bound(py)
                }
                b'0'..=b'9' => PyInt::new(py, scan.uint()?).into_any(),
                _ => return None,
            };
            dict.set_item(keys::key_string(py, key), value).ok()?;
            if !scan.eat(b", ") {
                scan.lit(b"}")?;
                break;
            }
        }
    }
    scan.end()?;
    Some(dict.into_any())
}

#[derive(Clone, Copy)]
struct Seed<'py> {
    py: Python<'py>,
}

impl<'de, 'py> DeserializeSeed<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

fn py_err<E: de::Error>(e: PyErr) -> E {
    E::custom(e.to_string())
}

/// An integer literal of any width, or a float, from its text.
fn number<'py, E: de::Error>(py: Python<'py>, text: &str) -> Result<Bound<'py, PyAny>, E> {
    if text.bytes().all(|b| b.is_ascii_digit() || b == b'-') {
        if let Ok(i) = text.parse::<i64>() {
            return Ok(PyInt::new(py, i).into_any());
        }
        return py.get_type::<PyInt>().call1((text,)).map_err(py_err);
    }
    text.parse::<f64>().map(|f| PyFloat::new(py, f).into_any()).map_err(E::custom)
}

impl<'de, 'py> Visitor<'de> for Seed<'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(self.py.None().into_bound(self.py))
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Self::Value, E> {
        Ok(PyBool::new(self.py, b).to_owned().into_any())
    }

    fn visit_i64<E: de::Error>(self, i: i64) -> Result<Self::Value, E> {
        Ok(PyInt::new(self.py, i).into_any())
    }

    fn visit_u64<E: de::Error>(self, u: u64) -> Result<Self::Value, E> {
        Ok(PyInt::new(self.py, u).into_any())
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Self::Value, E> {
        Ok(PyFloat::new(self.py, f).into_any())
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(PyString::new(self.py, s).into_any())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let list = PyList::empty(self.py);
        while let Some(item) = seq.next_element_seed(self)? {
            list.append(item).map_err(py_err)?;
        }
        Ok(list.into_any())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let dict = PyDict::new(self.py);
        while let Some(key) = map.next_key_seed(KeySeed { py: self.py })? {
            match key {
                Key::Number => return map.next_value_seed(NumberSeed { py: self.py }),
                Key::Name(name) => {
                    let value = map.next_value_seed(self)?;
                    dict.set_item(name, value).map_err(py_err)?;
                }
            }
        }
        Ok(dict.into_any())
    }
}

/// A map key: a `str`, or serde_json's marker of a number handed over as text.
enum Key<'py> {
    Number,
    Name(Bound<'py, PyString>),
}

struct KeySeed<'py> {
    py: Python<'py>,
}

impl<'de, 'py> DeserializeSeed<'de> for KeySeed<'py> {
    type Value = Key<'py>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, 'py> Visitor<'de> for KeySeed<'py> {
    type Value = Key<'py>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        Ok(if s == NUMBER_TOKEN { Key::Number } else { Key::Name(keys::key_string(self.py, s)) })
    }
}

/// The text of a number behind [`NUMBER_TOKEN`].
struct NumberSeed<'py> {
    py: Python<'py>,
}

impl<'de, 'py> DeserializeSeed<'de> for NumberSeed<'py> {
    type Value = Bound<'py, PyAny>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de, 'py> Visitor<'de> for NumberSeed<'py> {
    type Value = Bound<'py, PyAny>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a number's text")
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Self::Value, E> {
        number(self.py, s)
    }
}
