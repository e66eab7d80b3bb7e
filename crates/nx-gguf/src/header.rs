//! The GGUF header parser: metadata and tensor table, every bound checked.

use std::collections::HashSet;

use crate::value::{ArrayValue, Metadata, Value, ValueType};
use crate::{GgmlType, GgufError, DEFAULT_ALIGNMENT, MAGIC};

/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;
/// Longest string accepted (tokenizer vocabularies hold short strings; chat templates a
/// few kilobytes). Anything longer is a corrupt or hostile file.
const MAX_STRING_LEN: u64 = 64 << 20;
/// Deepest array nesting accepted.
const MAX_ARRAY_DEPTH: usize = 4;

/// One entry of the tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Shape, `ne[0]` the contiguous row length.
    pub ne: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }

    /// Length of one row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.ne.first().copied().unwrap_or(1)
    }

    /// Number of rows (product of `ne[1..]`).
    pub fn n_rows(&self) -> u64 {
        self.ne.iter().skip(1).product()
    }
}

/// A parsed GGUF header: version, metadata, tensor table and where the data starts.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufHeader {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
}

impl GgufHeader {
    /// Parses the header of a whole file held in `bytes`. Tensor data is only
    /// bounds-checked, never read.
    pub fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
        let mut r = Reader { bytes, pos: 0 };
        let magic = r.take("magic", 4)?;
        if magic != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(magic);
            return Err(GgufError::BadMagic { found });
        }
        let version = r.u32("version")?;
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion { version });
        }
        let tensor_count_at = r.pos as u64;
        let tensor_count = r.u64("tensor count")?;
        let kv_count_at = r.pos as u64;
        let kv_count = r.u64("metadata count")?;
        // Each metadata pair is at least 8 (key length) + 4 (type) + 1 bytes; each tensor
        // info at least 8 + 4 + 4 + 8. Reject counts that cannot fit before looping.
        r.check_count("metadata count", kv_count_at, kv_count, 13)?;
        r.check_count("tensor count", tensor_count_at, tensor_count, 24)?;

        let mut metadata = Metadata::default();
        for i in 0..kv_count {
            r.metadata_pair(i, &mut metadata)?;
        }
        let alignment = alignment_of(&metadata)?;
        let mut tensors = Vec::with_capacity(tensor_count as usize);
        let mut names = HashSet::with_capacity(tensor_count as usize);
        for i in 0..tensor_count {
            let name_at = r.pos as u64;
            let t = r.tensor_info(i, alignment)?;
            if !names.insert(t.name.clone()) {
                return Err(GgufError::DuplicateTensor {
                    name: t.name,
                    offset: name_at,
                });
            }
            tensors.push(t);
        }
        let data_offset = (r.pos as u64).div_ceil(alignment) * alignment;
        check_bounds(&tensors, data_offset, bytes.len() as u64)?;
        Ok(GgufHeader {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Bytes of a tensor of this shape and type, checking that rows are whole blocks and that
/// nothing overflows.
fn tensor_bytes(name: &str, ne: &[u64], ty: GgmlType) -> Result<u64, GgufError> {
    let bad = |reason: String| GgufError::BadShape {
        tensor: name.to_string(),
        ne: ne.to_vec(),
        reason,
    };
    let mut n_elements: u64 = 1;
    for &d in ne {
        n_elements = n_elements
            .checked_mul(d)
            .ok_or_else(|| bad("element count overflows".into()))?;
    }
    let row_len = ne.first().copied().unwrap_or(1);
    if !row_len.is_multiple_of(ty.block_size() as u64) {
        return Err(bad(format!(
            "row length {row_len} is not a multiple of the {} block size {}",
            ty.name(),
            ty.block_size()
        )));
    }
    ty.row_bytes(n_elements)
        .ok_or_else(|| bad("byte size overflows".into()))
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

/// `general.alignment` (32 when absent): a power of two up to 65536.
fn alignment_of(metadata: &Metadata) -> Result<u64, GgufError> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(v) => {
            let a = v.as_u64().ok_or_else(|| GgufError::WrongType {
                key: "general.alignment".into(),
                expected: "u32",
                found: v.type_description(),
            })?;
            if a == 0 || !a.is_power_of_two() || a > 65536 {
                return Err(GgufError::BadAlignment { value: a });
            }
            Ok(a)
        }
    }
}

/// Every tensor's bytes lie inside the file (offsets from `data_offset`, no overflow).
fn check_bounds(tensors: &[TensorInfo], data_offset: u64, file_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(_), Some(end)) if end <= file_len => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: t.name.clone(),
                    start: data_offset.saturating_add(t.offset),
                    end: data_offset
                        .saturating_add(t.offset)
                        .saturating_add(t.n_bytes),
                    file_len,
                })
            }
        }
    }
    Ok(())
}

impl<'a> Reader<'a> {
    /// Metadata pair `i` (key, type, value) into `metadata`; a repeated key is an error.
    fn metadata_pair(&mut self, i: u64, metadata: &mut Metadata) -> Result<(), GgufError> {
        let key_at = self.pos as u64;
        let key = self.string(&format!("metadata key #{i}"))?;
        let type_at = self.pos as u64;
        let type_id = self.u32(&format!("type of metadata {key:?}"))?;
        let ty = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            field: format!("metadata {key:?}"),
            offset: type_at,
            type_id,
        })?;
        let value = self.value(&format!("metadata {key:?}"), ty, 0)?;
        if !metadata.insert(key.clone(), value) {
            return Err(GgufError::DuplicateKey {
                key,
                offset: key_at,
            });
        }
        Ok(())
    }

    /// Tensor info `i`: name, dimensions, type and an `alignment`-aligned data offset.
    fn tensor_info(&mut self, i: u64, alignment: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string(&format!("tensor name #{i}"))?;
        let dims_at = self.pos as u64;
        let n_dims = self.u32(&format!("n_dims of tensor {name:?}"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                offset: dims_at,
                n_dims,
                max: MAX_DIMS,
            });
        }
        let mut ne = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            ne.push(self.u64(&format!("ne[{d}] of tensor {name:?}"))?);
        }
        let type_at = self.pos as u64;
        let type_id = self.u32(&format!("type of tensor {name:?}"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
            tensor: name.clone(),
            offset: type_at,
            type_id,
        })?;
        let offset = self.u64(&format!("data offset of tensor {name:?}"))?;
        let n_bytes = tensor_bytes(&name, &ne, ggml_type)?;
        if !offset.is_multiple_of(alignment) {
            return Err(GgufError::MisalignedTensor {
                tensor: name,
                offset,
                alignment,
            });
        }
        Ok(TensorInfo {
            name,
            ne,
            ggml_type,
            offset,
            n_bytes,
        })
    }

    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, field: &str, n: u64) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                field: field.to_string(),
                offset: self.pos as u64,
                needed: n,
                file_len: self.bytes.len() as u64,
            });
        }
        let n = n as usize;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        let s = self.take(field, N as u64)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn check_count(
        &self,
        field: &str,
        offset: u64,
        count: u64,
        min_size: u64,
    ) -> Result<(), GgufError> {
        if count.saturating_mul(min_size) > self.remaining() {
            return Err(GgufError::CountTooLarge {
                field: field.to_string(),
                offset,
                count,
            });
        }
        Ok(())
    }

    fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let at = self.pos as u64;
        let len = self.u64(field)?;
        if len > MAX_STRING_LEN || len > self.remaining() {
            return Err(GgufError::StringTooLong {
                field: field.to_string(),
                offset: at,
                len,
                limit: MAX_STRING_LEN.min(self.remaining()),
            });
        }
        let s = self.take(field, len)?;
        String::from_utf8(s.to_vec()).map_err(|_| GgufError::InvalidUtf8 {
            field: field.to_string(),
            offset: at,
        })
    }

    fn value(&mut self, field: &str, ty: ValueType, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(self.array::<1>(field)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(field)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(field)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(field)?)),
            ValueType::U32 => Value::U32(self.u32(field)?),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(field)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(field)?)),
            ValueType::Bool => {
                let at = self.pos as u64;
                match self.array::<1>(field)?[0] {
                    0 => Value::Bool(false),
                    1 => Value::Bool(true),
                    b => {
                        return Err(GgufError::UnknownValueType {
                            field: format!("{field} (bool byte {b})"),
                            offset: at,
                            type_id: ValueType::Bool.id(),
                        })
                    }
                }
            }
            ValueType::String => Value::String(self.string(field)?),
            ValueType::U64 => Value::U64(self.u64(field)?),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(field)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(field)?)),
            ValueType::Array => {
                let at = self.pos as u64;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(GgufError::NestingTooDeep {
                        field: field.to_string(),
                        offset: at,
                        limit: MAX_ARRAY_DEPTH,
                    });
                }
                let type_id = self.u32(field)?;
                let elem_type =
                    ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                        field: format!("{field} (array element)"),
                        offset: at,
                        type_id,
                    })?;
                let count_at = self.pos as u64;
                let count = self.u64(field)?;
                if count.saturating_mul(elem_type.min_encoded_size()) > self.remaining() {
                    return Err(GgufError::ArrayTooLong {
                        field: field.to_string(),
                        offset: count_at,
                        count,
                    });
                }
                let mut values = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    values.push(self.value(field, elem_type, depth + 1)?);
                }
                Value::Array(ArrayValue { elem_type, values })
            }
        })
    }
}
