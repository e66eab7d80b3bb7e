//! Every malformed-file case named by the Foundation issue is a typed error, never a panic.

use nx_gguf::{GgmlType, GgufError, GgufHeader, GgufWriter, Value};
use proptest::prelude::*;

/// A small valid file: a few metadata kinds (incl. a nested array) and two tensors.
fn valid_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_metadata("llama.block_count", Value::U32(2));
    w.add_metadata("tokenizer.ggml.tokens", Value::str_array(&["a", "b", "c"]));
    w.add_metadata("x.scores", Value::f32_array(&[0.5, -1.0]));
    w.add_metadata(
        "x.nested",
        Value::Array(nx_gguf::ArrayValue {
            elem_type: nx_gguf::ValueType::Array,
            values: vec![Value::i32_array(&[1, 2]), Value::i32_array(&[3])],
        }),
    );
    w.add_metadata("x.flag", Value::Bool(true));
    w.add_metadata("x.f64", Value::F64(2.5));
    w.add_tensor("a.weight", GgmlType::F32, vec![4, 2], vec![0u8; 32]);
    w.add_tensor("b.weight", GgmlType::Q8_0, vec![32, 1], vec![0u8; 34]);
    w.to_bytes()
}

/// Offset of the first byte after the metadata (start of the tensor table) in `valid_file`.
fn tensor_table_offset(bytes: &[u8]) -> usize {
    // Parse once, then search for the first tensor's name-length + name.
    let name = b"a.weight";
    let mut needle = (name.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(name);
    bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("tensor table")
}

fn parse(bytes: &[u8]) -> Result<GgufHeader, GgufError> {
    GgufHeader::parse(bytes)
}

fn err_text(bytes: &[u8]) -> String {
    parse(bytes).expect_err("must fail").to_string()
}

#[test]
fn valid_file_round_trips() {
    let bytes = valid_file();
    let h = parse(&bytes).unwrap();
    assert_eq!(h.version, 3);
    assert_eq!(h.tensors.len(), 2);
    assert_eq!(h.metadata.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(
        h.metadata.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["a", "b", "c"]
    );
    assert_eq!(h.data_offset % 32, 0);
    // Rewriting what was read gives the same bytes.
    let mut w = GgufWriter::new();
    for (k, v) in h.metadata.iter() {
        w.add_metadata(k, v.clone());
    }
    for t in &h.tensors {
        let start = (h.data_offset + t.offset) as usize;
        w.add_tensor(
            t.name.clone(),
            t.ggml_type,
            t.ne.clone(),
            bytes[start..start + t.n_bytes as usize].to_vec(),
        );
    }
    assert_eq!(w.to_bytes(), bytes);
}

#[test]
fn version_2_is_accepted() {
    let mut bytes = valid_file();
    bytes[4..8].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(parse(&bytes).unwrap().version, 2);
}

#[test]
fn bad_magic() {
    let mut bytes = valid_file();
    bytes[0..4].copy_from_slice(b"GGML");
    assert!(matches!(parse(&bytes), Err(GgufError::BadMagic { .. })));
    assert!(err_text(&bytes).contains("offset 0"));
}

#[test]
fn unsupported_version() {
    let mut bytes = valid_file();
    bytes[4..8].copy_from_slice(&7u32.to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::UnsupportedVersion { version: 7 })
    ));
}

#[test]
fn truncated_header() {
    let bytes = valid_file();
    for len in [0, 3, 6, 10, 20] {
        let e = parse(&bytes[..len]).unwrap_err();
        assert!(
            matches!(e, GgufError::Truncated { .. } | GgufError::BadMagic { .. }),
            "len {len}: {e}"
        );
    }
    assert!(err_text(&bytes[..20]).contains("metadata count"));
}

#[test]
fn truncated_metadata() {
    let bytes = valid_file();
    let end = tensor_table_offset(&bytes);
    // Every cut inside the metadata region is an error naming a field and an offset.
    for len in 24..end {
        let e = parse(&bytes[..len]).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("offset"), "len {len}: {text}");
    }
}

#[test]
fn string_longer_than_file() {
    let mut bytes = valid_file();
    // The first key's length field sits right after the 24-byte fixed header.
    bytes[24..32].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = parse(&bytes).unwrap_err();
    assert!(
        matches!(e, GgufError::StringTooLong { offset: 24, .. }),
        "{e}"
    );
}

#[test]
fn absurd_array_count() {
    let bytes = valid_file();
    let key = b"tokenizer.ggml.tokens";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    // type id (u32 = 9), element type (u32 = 8), then the count.
    let count_at = at + 4 + 4;
    let mut bad = bytes.clone();
    bad[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = parse(&bad).unwrap_err();
    assert!(matches!(e, GgufError::ArrayTooLong { .. }), "{e}");
    assert!(e.to_string().contains("tokenizer.ggml.tokens"));
    bad[count_at..count_at + 8].copy_from_slice(&(1u64 << 33).to_le_bytes());
    assert!(matches!(parse(&bad), Err(GgufError::ArrayTooLong { .. })));
}

#[test]
fn absurd_tensor_and_metadata_counts() {
    let mut bytes = valid_file();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::CountTooLarge { .. })
    ));
    let mut bytes = valid_file();
    bytes[16..24].copy_from_slice(&(1u64 << 50).to_le_bytes());
    assert!(matches!(
        parse(&bytes),
        Err(GgufError::CountTooLarge { .. })
    ));
}

/// Rewrites one tensor info field of `a.weight` in `valid_file`.
fn with_tensor_field(field: &str, value: u64) -> Vec<u8> {
    let mut bytes = valid_file();
    let at = tensor_table_offset(&bytes) + 8 + b"a.weight".len();
    // n_dims u32, ne[0] u64, ne[1] u64, type u32, offset u64
    let (pos, width) = match field {
        "n_dims" => (at, 4),
        "ne0" => (at + 4, 8),
        "type" => (at + 20, 4),
        "offset" => (at + 24, 8),
        _ => unreachable!(),
    };
    bytes[pos..pos + width].copy_from_slice(&value.to_le_bytes()[..width]);
    bytes
}

#[test]
fn tensor_past_end_of_file() {
    let e = parse(&with_tensor_field("offset", 1 << 20)).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    assert!(e.to_string().contains("a.weight"));
    // Overflowing offsets are caught too.
    let e = parse(&with_tensor_field("offset", u64::MAX - 31)).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    // And a file cut short inside the data section.
    let bytes = valid_file();
    let e = parse(&bytes[..bytes.len() - 1]).unwrap_err();
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
}

#[test]
fn misaligned_tensor_offset() {
    let e = parse(&with_tensor_field("offset", 4)).unwrap_err();
    assert!(
        matches!(
            e,
            GgufError::MisalignedTensor {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn duplicate_tensor_names() {
    let mut w = GgufWriter::new();
    w.add_tensor("same", GgmlType::F32, vec![4], vec![0; 16]);
    w.add_tensor("same", GgmlType::F32, vec![4], vec![0; 16]);
    let e = parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateTensor { .. }), "{e}");
}

#[test]
fn duplicate_metadata_keys() {
    let mut w = GgufWriter::new();
    w.add_metadata("k.a", Value::U8(1));
    w.add_metadata("k.b", Value::U8(2));
    let mut bytes = w.to_bytes();
    let at = bytes.windows(3).position(|w| w == b"k.b").unwrap();
    bytes[at..at + 3].copy_from_slice(b"k.a");
    let e = parse(&bytes).unwrap_err();
    assert!(matches!(e, GgufError::DuplicateKey { .. }), "{e}");
}

#[test]
fn unknown_ggml_type() {
    let e = parse(&with_tensor_field("type", 4)).unwrap_err();
    assert!(
        matches!(e, GgufError::UnknownGgmlType { type_id: 4, .. }),
        "{e}"
    );
    let e = parse(&with_tensor_field("type", 0xFFFF_FFFF)).unwrap_err();
    assert!(matches!(e, GgufError::UnknownGgmlType { .. }), "{e}");
}

#[test]
fn shape_not_multiple_of_block_size() {
    let mut w = GgufWriter::new();
    w.add_tensor("q", GgmlType::Q4_K, vec![100, 2], vec![0; 288]);
    let e = parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
    assert!(e.to_string().contains("block size 256"));
}

#[test]
fn too_many_dims_and_overflowing_shape() {
    let e = parse(&with_tensor_field("n_dims", 9)).unwrap_err();
    assert!(matches!(e, GgufError::TooManyDims { n_dims: 9, .. }), "{e}");
    let mut w = GgufWriter::new();
    w.add_tensor("big", GgmlType::F32, vec![1 << 40, 1 << 40], vec![]);
    let e = parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}

#[test]
fn unknown_value_type_and_bad_alignment() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1));
    let mut bytes = w.to_bytes();
    // key length (8) + "k" (1) → type id at 24 + 9.
    bytes[33..37].copy_from_slice(&13u32.to_le_bytes());
    let e = parse(&bytes).unwrap_err();
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 13, .. }),
        "{e}"
    );

    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(3));
    let e = parse(&w.to_bytes()).unwrap_err();
    assert!(matches!(e, GgufError::BadAlignment { value: 3 }), "{e}");
}

#[test]
fn invalid_utf8_string() {
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::String("ab".into()));
    let mut bytes = w.to_bytes();
    let at = bytes.windows(2).position(|w| w == b"ab").unwrap();
    bytes[at] = 0xFF;
    let e = parse(&bytes).unwrap_err();
    assert!(matches!(e, GgufError::InvalidUtf8 { .. }), "{e}");
}

#[test]
fn non_default_alignment_round_trips() {
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(64));
    w.add_tensor("a", GgmlType::F32, vec![3], vec![1; 12]);
    w.add_tensor("b", GgmlType::F32, vec![5], vec![2; 20]);
    let bytes = w.to_bytes();
    let h = parse(&bytes).unwrap();
    assert_eq!(h.alignment, 64);
    assert_eq!(h.data_offset % 64, 0);
    assert_eq!(h.tensors[1].offset, 64);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 2000 }))]
    /// Random byte mutations of a valid file parse to Ok or Err, never a panic.
    #[test]
    fn mutated_files_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        do_cut in any::<bool>(),
    ) {
        let mut bytes = valid_file();
        for (i, b) in edits {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        if do_cut {
            let n = cut.index(bytes.len() + 1);
            bytes.truncate(n);
        }
        let _ = parse(&bytes);
    }
}
