//! One malformed file per bug that bit another GGUF reader (advisories, issues and pull
//! requests named per test). Each must be a typed error naming the problem, never a
//! panic, an abort or an allocation sized by the file.

use nx_gguf::{GgmlType, GgufError, GgufHeader, GgufWriter, Value};

/// A file with one tensor `t` of type `ty` and shape `ne`, and `data` as its bytes.
fn one_tensor(ty: GgmlType, ne: Vec<u64>, data: Vec<u8>) -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.add_metadata("general.architecture", Value::String("llama".into()));
    w.add_tensor("t", ty, ne, data);
    w.to_bytes()
}

/// Byte offset of tensor `t`'s data offset field (after name, n_dims, ne, type).
fn offset_field(bytes: &[u8], n_dims: usize) -> usize {
    let mut needle = 1u64.to_le_bytes().to_vec();
    needle.push(b't');
    let at = bytes.windows(9).position(|w| w == needle).unwrap() + 9;
    at + 4 + 8 * n_dims + 4
}

fn err(bytes: &[u8]) -> GgufError {
    GgufHeader::parse(bytes).expect_err("must be refused")
}

#[test]
fn ghsa_96jg_mvhq_q7q7_element_count_times_type_size_overflows() {
    // 2^62 f32 elements: the count fits in 64 bits, its byte size does not.
    let e = err(&one_tensor(GgmlType::F32, vec![1 << 62], vec![]));
    assert!(e.to_string().contains("byte size overflows"), "{e}");
    // The element count itself overflowing.
    let e = err(&one_tensor(GgmlType::F32, vec![1 << 32, 1 << 32], vec![]));
    assert!(e.to_string().contains("element count overflows"), "{e}");
}

#[test]
fn pr_24759_padding_arithmetic_does_not_wrap() {
    // The largest aligned offset: data start + offset wraps a 64-bit sum.
    let mut bytes = one_tensor(GgmlType::F32, vec![8], vec![0; 32]);
    let at = offset_field(&bytes, 1);
    bytes[at..at + 8].copy_from_slice(&(!31u64).to_le_bytes());
    assert!(matches!(err(&bytes), GgufError::TensorOutOfBounds { .. }));
    // The largest alignment the format allows does not wrap the data start either.
    // (Written with alignment 32, then patched: the writer would pad to 2 GiB.)
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::U32(32));
    let mut bytes = w.to_bytes();
    let key = b"general.alignment";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len() + 4;
    for a in [1u32 << 31, u32::MAX] {
        bytes[at..at + 4].copy_from_slice(&a.to_le_bytes());
        let e = err(&bytes);
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    }
}

#[test]
fn issue_27203_int64_max_by_two() {
    // ne = (INT64_MAX, 2, 1, 1) in f32: the byte size overflows.
    // The nearest shape a block type accepts, (2^63 - 32, 2) in Q4_0, makes an element
    // count and a byte size that fit in 64 bits, and must still be refused as past the
    // end of the file.
    let e = err(&one_tensor(
        GgmlType::Q4_0,
        vec![(1 << 63) - 32, 2, 1, 1],
        vec![],
    ));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = err(&one_tensor(
        GgmlType::F32,
        vec![i64::MAX as u64, 2, 1, 1],
        vec![],
    ));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}

#[test]
fn pr_18674_huge_dimension_does_not_wrap_the_offset() {
    let e = err(&one_tensor(GgmlType::F32, vec![(1 << 42) + 1], vec![]));
    assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    let e = err(&one_tensor(
        GgmlType::F16,
        vec![(1 << 42) + 1, 1 << 22],
        vec![],
    ));
    assert!(matches!(e, GgufError::BadShape { .. }), "{e}");
}

#[test]
fn ghsa_x8qc_fggm_mpqg_tensor_data_past_the_end() {
    let bytes = one_tensor(GgmlType::F32, vec![8], vec![0; 32]);
    let e = err(&bytes[..bytes.len() - 4]);
    match e {
        GgufError::TensorOutOfBounds { end, file_len, .. } => assert!(end > file_len),
        e => panic!("{e}"),
    }
    let mut bytes = one_tensor(GgmlType::F32, vec![8], vec![0; 32]);
    let at = offset_field(&bytes, 1);
    bytes[at..at + 8].copy_from_slice(&64u64.to_le_bytes());
    assert!(matches!(err(&bytes), GgufError::TensorOutOfBounds { .. }));
}

#[test]
fn string_lengths_and_array_counts_beyond_the_file() {
    let mut w = GgufWriter::new();
    w.add_metadata("s", Value::String("abc".into()));
    let mut bytes = w.to_bytes();
    let at = bytes.windows(3).position(|w| w == b"abc").unwrap() - 8;
    for len in [bytes.len() as u64, 1 << 40, u64::MAX] {
        bytes[at..at + 8].copy_from_slice(&len.to_le_bytes());
        let e = err(&bytes);
        assert!(
            matches!(
                e,
                GgufError::StringTooLong { .. } | GgufError::Truncated { .. }
            ),
            "{e}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_metadata("a", Value::i32_array(&[1, 2, 3]));
    let mut bytes = w.to_bytes();
    // The count follows the element type (u32) after key "a".
    let key_end = bytes.windows(1).position(|w| w == b"a").unwrap() + 1;
    let count_at = key_end + 4 + 4;
    for count in [bytes.len() as u64, 1 << 61, u64::MAX] {
        bytes[count_at..count_at + 8].copy_from_slice(&count.to_le_bytes());
        let e = err(&bytes);
        assert!(
            matches!(
                e,
                GgufError::ArrayTooLong { .. } | GgufError::Truncated { .. }
            ),
            "{e}"
        );
    }
}

#[test]
fn negative_or_unknown_types() {
    let mut bytes = one_tensor(GgmlType::F32, vec![8], vec![0; 32]);
    let at = offset_field(&bytes, 1) - 4;
    for id in [u32::MAX, (-2i32) as u32, 4, 5, 1000] {
        bytes[at..at + 4].copy_from_slice(&id.to_le_bytes());
        let e = err(&bytes);
        assert!(
            matches!(e, GgufError::UnknownGgmlType { type_id, .. } if type_id == id),
            "{e}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_metadata("k", Value::U8(1));
    let mut bytes = w.to_bytes();
    let at = bytes.windows(1).position(|w| w == b"k").unwrap() + 1;
    for id in [u32::MAX, 13, 99] {
        bytes[at..at + 4].copy_from_slice(&id.to_le_bytes());
        assert!(matches!(
            err(&bytes),
            GgufError::UnknownValueType { type_id, .. } if type_id == id
        ));
    }
}

#[test]
fn alignment_zero_or_not_a_power_of_two() {
    for a in [0u32, 3, 48, 1000] {
        let mut w = GgufWriter::new();
        w.add_metadata("general.alignment", Value::U32(a));
        let e = err(&w.to_bytes());
        assert!(
            matches!(e, GgufError::BadAlignment { value } if value == a as u64),
            "{e}"
        );
    }
    let mut w = GgufWriter::new();
    w.add_metadata("general.alignment", Value::String("32".into()));
    assert!(matches!(err(&w.to_bytes()), GgufError::WrongType { .. }));
}
