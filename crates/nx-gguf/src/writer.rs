//! GGUF writer, used by the fixture generator and round-trip tests.

use std::io::{self, Write};

use crate::value::{Value, ValueType};
use crate::{GgmlType, DEFAULT_ALIGNMENT, MAGIC};

struct PendingTensor {
    name: String,
    ggml_type: GgmlType,
    ne: Vec<u64>,
    data: Vec<u8>,
}

/// Builds a GGUF v3 file in memory: metadata in insertion order, tensors laid out at the
/// alignment (`general.alignment` when set as metadata, else 32).
#[derive(Default)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    tensors: Vec<PendingTensor>,
}

impl GgufWriter {
    /// An empty file.
    pub fn new() -> GgufWriter {
        GgufWriter::default()
    }

    /// Adds a metadata pair (a later pair with the same key replaces the earlier one).
    pub fn add_metadata(&mut self, key: impl Into<String>, value: Value) {
        let key = key.into();
        if let Some(slot) = self.metadata.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
        } else {
            self.metadata.push((key, value));
        }
    }

    /// Adds a tensor; `data` must already be in `ggml_type`'s block layout.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        ggml_type: GgmlType,
        ne: Vec<u64>,
        data: Vec<u8>,
    ) {
        self.tensors.push(PendingTensor {
            name: name.into(),
            ggml_type,
            ne,
            data,
        });
    }

    fn alignment(&self) -> u64 {
        self.metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Serialises the file.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let align = self.alignment() as usize;
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_string(&mut out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0usize;
        let mut offsets = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.ne.len() as u32).to_le_bytes());
            for d in &t.ne {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offsets.push(offset);
            offset = (offset + t.data.len()).div_ceil(align) * align;
        }
        let data_start = out.len().div_ceil(align) * align;
        out.resize(data_start, 0);
        for (t, off) in self.tensors.iter().zip(offsets) {
            out.resize(data_start + off, 0);
            out.extend_from_slice(&t.data);
        }
        out
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.to_bytes())
    }
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(u8::from(*x)),
        Value::String(s) => put_string(out, s),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Array(a) => {
            out.extend_from_slice(&a.elem_type.id().to_le_bytes());
            out.extend_from_slice(&(a.values.len() as u64).to_le_bytes());
            for e in &a.values {
                debug_assert_eq!(e.value_type(), a.elem_type);
                put_value(out, e);
            }
        }
    }
}

impl Value {
    /// An array of strings.
    pub fn str_array<S: AsRef<str>>(items: &[S]) -> Value {
        Value::Array(crate::ArrayValue {
            elem_type: ValueType::String,
            values: items
                .iter()
                .map(|s| Value::String(s.as_ref().to_string()))
                .collect(),
        })
    }

    /// An array of f32.
    pub fn f32_array(items: &[f32]) -> Value {
        Value::Array(crate::ArrayValue {
            elem_type: ValueType::F32,
            values: items.iter().map(|&x| Value::F32(x)).collect(),
        })
    }

    /// An array of i32.
    pub fn i32_array(items: &[i32]) -> Value {
        Value::Array(crate::ArrayValue {
            elem_type: ValueType::I32,
            values: items.iter().map(|&x| Value::I32(x)).collect(),
        })
    }
}
