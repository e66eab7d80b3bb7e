//! Typed errors of the GGUF reader: each names the field and the byte offset.

use std::path::PathBuf;

/// Everything that can be wrong with a GGUF file or a metadata lookup.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:?} at offset 0, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {version} at offset 4 (supported: 2, 3)")]
    UnsupportedVersion { version: u32 },
    #[error(
        "file truncated: {field} at offset {offset} needs {needed} bytes, file has {file_len}"
    )]
    Truncated {
        field: String,
        offset: u64,
        needed: u64,
        file_len: u64,
    },
    #[error(
        "{field} at offset {offset}: string length {len} exceeds the {limit} limit or the file"
    )]
    StringTooLong {
        field: String,
        offset: u64,
        len: u64,
        limit: u64,
    },
    #[error("{field} at offset {offset}: string is not valid UTF-8")]
    InvalidUtf8 { field: String, offset: u64 },
    #[error("{field} at offset {offset}: array count {count} cannot fit in the file")]
    ArrayTooLong {
        field: String,
        offset: u64,
        count: u64,
    },
    #[error("{field} at offset {offset}: unknown metadata value type {type_id}")]
    UnknownValueType {
        field: String,
        offset: u64,
        type_id: u32,
    },
    #[error("{field} at offset {offset}: arrays nested deeper than {limit}")]
    NestingTooDeep {
        field: String,
        offset: u64,
        limit: usize,
    },
    #[error("{field} at offset {offset}: count {count} cannot fit in the file")]
    CountTooLarge {
        field: String,
        offset: u64,
        count: u64,
    },
    #[error("duplicate metadata key {key:?} at offset {offset}")]
    DuplicateKey { key: String, offset: u64 },
    #[error("tensor {tensor:?} at offset {offset}: {n_dims} dimensions (at most {max})")]
    TooManyDims {
        tensor: String,
        offset: u64,
        n_dims: u32,
        max: usize,
    },
    #[error("tensor {tensor:?} at offset {offset}: unknown ggml type {type_id}")]
    UnknownGgmlType {
        tensor: String,
        offset: u64,
        type_id: u32,
    },
    #[error("tensor {tensor:?}: bad shape {ne:?}: {reason}")]
    BadShape {
        tensor: String,
        ne: Vec<u64>,
        reason: String,
    },
    #[error("duplicate tensor name {name:?} at offset {offset}")]
    DuplicateTensor { name: String, offset: u64 },
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error("tensor {tensor:?}: data bytes {start}..{end} lie past the end of the file ({file_len} bytes)")]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        file_len: u64,
    },
    #[error("general.alignment = {value} is not a power of two between 1 and 65536")]
    BadAlignment { value: u64 },
    #[error("metadata key {key:?} is missing")]
    MissingKey { key: String },
    #[error("metadata key {key:?} has type {found}, expected {expected}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
}
