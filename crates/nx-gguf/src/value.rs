//! Metadata values and typed lookups.

use std::collections::HashMap;

use crate::GgufError;

/// A metadata value type as stored in the file (ids 0..=12).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl ValueType {
    /// The type for an id from the file.
    pub fn from_id(id: u32) -> Option<ValueType> {
        Some(match id {
            0 => ValueType::U8,
            1 => ValueType::I8,
            2 => ValueType::U16,
            3 => ValueType::I16,
            4 => ValueType::U32,
            5 => ValueType::I32,
            6 => ValueType::F32,
            7 => ValueType::Bool,
            8 => ValueType::String,
            9 => ValueType::Array,
            10 => ValueType::U64,
            11 => ValueType::I64,
            12 => ValueType::F64,
            _ => return None,
        })
    }

    /// The id written to the file.
    pub fn id(self) -> u32 {
        match self {
            ValueType::U8 => 0,
            ValueType::I8 => 1,
            ValueType::U16 => 2,
            ValueType::I16 => 3,
            ValueType::U32 => 4,
            ValueType::I32 => 5,
            ValueType::F32 => 6,
            ValueType::Bool => 7,
            ValueType::String => 8,
            ValueType::Array => 9,
            ValueType::U64 => 10,
            ValueType::I64 => 11,
            ValueType::F64 => 12,
        }
    }

    /// Lower-case name for messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "string",
            ValueType::Array => "array",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type occupies in the file; used to reject array
    /// counts that could not possibly fit before allocating for them.
    pub(crate) fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => 1,
            ValueType::U16 | ValueType::I16 => 2,
            ValueType::U32 | ValueType::I32 | ValueType::F32 => 4,
            ValueType::U64 | ValueType::I64 | ValueType::F64 | ValueType::String => 8,
            ValueType::Array => 12,
        }
    }
}

/// An array value: its declared element type and the elements.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrayValue {
    pub elem_type: ValueType,
    pub values: Vec<Value>,
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(ArrayValue),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// The stored type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A description of the type for error messages (`array of string`).
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {}", a.elem_type.name()),
            v => v.value_type().name().to_string(),
        }
    }

    /// Any integer as i128, so conversions can check their range exactly.
    fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// An integer value that fits in u64.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_i128().and_then(|v| u64::try_from(v).ok())
    }

    /// An integer value that fits in i64.
    pub fn as_i64(&self) -> Option<i64> {
        self.as_i128().and_then(|v| i64::try_from(v).ok())
    }

    /// A float value (f32, or f64 narrowed).
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            Value::F32(v) => Some(v),
            Value::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    /// A string value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// A bool value.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// An array value.
    pub fn as_array(&self) -> Option<&ArrayValue> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// The metadata key/value pairs of a file, in file order, with lookup by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Adds a pair; returns false (and keeps the first) when the key already exists.
    pub(crate) fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    /// Whether `key` is present.
    pub fn contains(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// Number of pairs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are no pairs.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Pairs in file order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Value)> {
        self.entries.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        f: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<T, GgufError> {
        let v = self.require(key)?;
        f(v).ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected,
            found: v.type_description(),
        })
    }

    /// An integer that fits in u32 (any integer type is accepted).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.typed(key, "u32", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    /// An integer that fits in u64.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.typed(key, "u64", Value::as_u64)
    }

    /// An integer that fits in i32.
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.typed(key, "i32", |v| {
            v.as_i64().and_then(|x| i32::try_from(x).ok())
        })
    }

    /// A float (f32 or f64).
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        self.typed(key, "f32", Value::as_f32)
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        self.typed(key, "bool", Value::as_bool)
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        self.typed(key, "string", Value::as_str)
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&ArrayValue, GgufError> {
        self.typed(key, "array", Value::as_array)
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        self.typed(key, "array of string", |v| {
            v.as_array()?.values.iter().map(Value::as_str).collect()
        })
    }

    /// An array of floats.
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        self.typed(key, "array of f32", |v| {
            v.as_array()?.values.iter().map(Value::as_f32).collect()
        })
    }

    /// An array of integers that each fit in i32.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        self.typed(key, "array of i32", |v| {
            v.as_array()?
                .values
                .iter()
                .map(|x| x.as_i64().and_then(|x| i32::try_from(x).ok()))
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_lookups_name_key_and_type() {
        let mut m = Metadata::default();
        m.insert("a.count".into(), Value::U64(7));
        m.insert("a.neg".into(), Value::I32(-1));
        m.insert("a.name".into(), Value::String("x".into()));
        assert!(!m.insert("a.name".into(), Value::Bool(true)));
        assert_eq!(m.get_u32("a.count").unwrap(), 7);
        assert_eq!(m.get_i32("a.neg").unwrap(), -1);
        let e = m.get_u32("a.neg").unwrap_err().to_string();
        assert!(e.contains("a.neg") && e.contains("expected u32"), "{e}");
        let e = m.get_u32("a.name").unwrap_err().to_string();
        assert!(e.contains("string"), "{e}");
        let e = m.get_str("missing.key").unwrap_err().to_string();
        assert!(e.contains("missing.key"), "{e}");
        assert_eq!(m.iter().count(), 3);
    }
}
