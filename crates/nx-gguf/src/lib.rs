//! GGUF v2/v3 reader and writer: header, typed metadata, tensor table.
//!
//! The key design choice: the reader parses the header only and validates every count,
//! length and offset against the file length before use, so a hostile file is a typed
//! error naming the field and byte offset, never a panic or an out-of-bounds read. Tensor
//! data is never touched here beyond checking that it lies inside the file.

mod error;
mod file;
mod header;
mod types;
mod value;
mod writer;

pub use error::GgufError;
pub use file::Gguf;
pub use header::{GgufHeader, TensorInfo, MAX_DIMS};
pub use types::GgmlType;
pub use value::{ArrayValue, Metadata, Value, ValueType};
pub use writer::GgufWriter;

/// The four bytes every GGUF file starts with.
pub const MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of every tensor when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
