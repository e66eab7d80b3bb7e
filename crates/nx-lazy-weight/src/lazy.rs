//! `LazyWeight`: a typed, validated view of one tensor's bytes inside the mapping.
//!
//! Construction checks the type and that the byte length equals
//! `n_rows · row_bytes`; nothing is copied or dequantized. Rows are read (and the
//! mapped pages touched) only when the forward pass asks for them.

use nx_gguf::{GgmlType, TensorInfo};

use crate::dequant::dequantize_row_unchecked;
use crate::formats::{is_supported_weight, row_bytes, vec_dot_type};
use crate::LazyWeightError;

/// A borrowed view of one tensor: ggml type, shape and the bytes of all its rows.
///
/// `ne[0]` is the row length K; the rows are the product of the other dimensions.
/// A matmul weight of shape `[K, N]` has N rows of K elements.
#[derive(Debug, Clone, Copy)]
pub struct LazyWeight<'a> {
    ggml_type: GgmlType,
    ne: [u64; 4],
    n_dims: usize,
    row_len: usize,
    n_rows: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> LazyWeight<'a> {
    /// View the tensor described by `info` in `data` (its bytes, e.g. from
    /// `Gguf::tensor_bytes`). Errors name the tensor when the type is unsupported,
    /// the shape is unusable or the byte length does not match.
    pub fn new(info: &TensorInfo, data: &'a [u8]) -> Result<Self, LazyWeightError> {
        Self::build(&info.name, info.ggml_type, &info.ne, data)
    }

    /// View `data` as a tensor of type `ggml_type` and shape `ne` (`ne[0]` = row length).
    pub fn from_parts(
        ggml_type: GgmlType,
        ne: &[u64],
        data: &'a [u8],
    ) -> Result<Self, LazyWeightError> {
        Self::build("", ggml_type, ne, data)
    }

    fn build(
        name: &str,
        ggml_type: GgmlType,
        ne: &[u64],
        data: &'a [u8],
    ) -> Result<Self, LazyWeightError> {
        if !is_supported_weight(ggml_type) {
            if !name.is_empty() {
                return Err(LazyWeightError::UnsupportedTensorType {
                    name: name.to_string(),
                    ggml_type,
                    supported: crate::formats::supported_weight_names(),
                });
            }
            return Err(LazyWeightError::UnsupportedType {
                ggml_type,
                op: "weight",
            });
        }
        let bad = |reason| LazyWeightError::BadShape {
            ne: ne.to_vec(),
            reason,
        };
        if ne.is_empty() || ne.len() > 4 {
            return Err(bad("a tensor has 1 to 4 dimensions"));
        }
        if ne.contains(&0) {
            return Err(bad("zero-sized dimension"));
        }
        let row_len = usize::try_from(ne[0]).map_err(|_| bad("row length overflows usize"))?;
        let n_rows = ne[1..]
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
            .ok_or_else(|| bad("row count overflows usize"))?;
        let row_bytes = row_bytes(ggml_type, row_len)?;
        let expected = n_rows
            .checked_mul(row_bytes)
            .ok_or_else(|| bad("tensor byte size overflows usize"))?;
        if data.len() != expected {
            return Err(LazyWeightError::TensorBytes {
                name: name.to_string(),
                ggml_type,
                ne: ne.to_vec(),
                expected: expected as u64,
                actual: data.len() as u64,
            });
        }
        let mut ne_arr = [1u64; 4];
        ne_arr[..ne.len()].copy_from_slice(ne);
        Ok(LazyWeight {
            ggml_type,
            ne: ne_arr,
            n_dims: ne.len(),
            row_len,
            n_rows,
            row_bytes,
            data,
        })
    }

    /// The tensor's ggml type.
    pub fn ggml_type(&self) -> GgmlType {
        self.ggml_type
    }

    /// The activation type its dot product consumes (see [`crate::vec_dot_type`]).
    pub fn vec_dot_type(&self) -> GgmlType {
        // Construction admits only supported weight types, which all have one.
        vec_dot_type(self.ggml_type).unwrap_or(GgmlType::F32)
    }

    /// The shape, `ne[0]` first, as stored in the file.
    pub fn ne(&self) -> &[u64] {
        &self.ne[..self.n_dims]
    }

    /// Number of rows (N for a `[K, N]` matmul weight).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Elements per row (K).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// All the tensor's bytes.
    pub fn bytes(&self) -> &'a [u8] {
        self.data
    }

    /// Rows `rows` of this weight as a weight of their own: a view of the same bytes,
    /// nothing copied (Phi-3 stores Q, K and V one after another in `attn_qkv`, gate
    /// and up in `ffn_up`). Each output of a matmul over the view is the one the whole
    /// weight computes for that row. The rows of a 3-D tensor count through its last
    /// dimension (expert `e` of `[k, n, n_expert]` is rows `e·n..(e+1)·n`). The range must
    /// be non-empty and inside the rows.
    pub fn row_range(&self, rows: std::ops::Range<usize>) -> Result<Self, LazyWeightError> {
        if rows.is_empty() || rows.end > self.n_rows {
            return Err(LazyWeightError::BadShape {
                ne: self.ne().to_vec(),
                reason: "row range empty or past the rows",
            });
        }
        let data = &self.data[rows.start * self.row_bytes..rows.end * self.row_bytes];
        Self::from_parts(self.ggml_type, &[self.ne[0], rows.len() as u64], data)
    }

    /// The bytes of row `i`.
    ///
    /// # Panics
    /// When `i >= n_rows()` (a caller bug, like slice indexing); use [`Self::get_row`]
    /// for indices that come from input.
    pub fn row(&self, i: usize) -> &'a [u8] {
        match self.get_row(i) {
            Some(r) => r,
            None => panic!("row {i} out of range: tensor has {} rows", self.n_rows),
        }
    }

    /// The bytes of row `i`, or `None` past the end.
    pub fn get_row(&self, i: usize) -> Option<&'a [u8]> {
        if i >= self.n_rows {
            return None;
        }
        let start = i * self.row_bytes;
        self.data.get(start..start + self.row_bytes)
    }

    /// Dequantize row `i` into `out` (length `row_len()`), bit-exact with ggml.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) -> Result<(), LazyWeightError> {
        let row = self.get_row(i).ok_or(LazyWeightError::RowOutOfRange {
            row: i,
            n_rows: self.n_rows,
        })?;
        if out.len() != self.row_len {
            return Err(LazyWeightError::LengthMismatch {
                what: "dequantize_row: output",
                expected: self.row_len,
                actual: out.len(),
            });
        }
        dequantize_row_unchecked(self.ggml_type, row, out);
        Ok(())
    }
}

impl<'a> TryFrom<(&TensorInfo, &'a [u8])> for LazyWeight<'a> {
    type Error = LazyWeightError;

    fn try_from((info, data): (&TensorInfo, &'a [u8])) -> Result<Self, Self::Error> {
        LazyWeight::new(info, data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(ty: GgmlType, ne: Vec<u64>, n_bytes: u64) -> TensorInfo {
        TensorInfo {
            name: "blk.0.test.weight".into(),
            ne,
            ggml_type: ty,
            offset: 0,
            n_bytes,
        }
    }

    #[test]
    fn an_unsupported_type_names_the_tensor_and_what_nx_reads() {
        let bytes = vec![0u8; 36];
        let err = LazyWeight::new(&info(GgmlType::NVFP4, vec![64, 1], 36), &bytes).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("blk.0.test.weight") && text.contains("NVFP4") && text.contains("IQ1_M"),
            "{text}"
        );
    }

    #[test]
    fn validates_byte_length_and_names_the_tensor() {
        let bytes = vec![0u8; 3 * 144];
        let ok = LazyWeight::new(&info(GgmlType::Q4_K, vec![256, 3], 432), &bytes).unwrap();
        assert_eq!((ok.n_rows(), ok.row_len(), ok.row_bytes()), (3, 256, 144));
        assert_eq!(ok.row(2).len(), 144);
        assert!(ok.get_row(3).is_none());
        assert_eq!(ok.ne(), &[256, 3]);
        let err = LazyWeight::new(&info(GgmlType::Q4_K, vec![256, 4], 576), &bytes).unwrap_err();
        assert!(matches!(
            err,
            LazyWeightError::TensorBytes {
                expected: 576,
                actual: 432,
                ..
            }
        ));
        assert!(err.to_string().contains("blk.0.test.weight"), "{err}");
    }

    #[test]
    fn a_row_range_views_the_same_bytes_and_refuses_bad_ranges() {
        let bytes: Vec<u8> = (0..5 * 34).map(|i| (i * 7 % 251) as u8).collect();
        let w = LazyWeight::from_parts(GgmlType::Q8_0, &[32, 5], &bytes).unwrap();
        let v = w.row_range(1..4).unwrap();
        assert_eq!((v.n_rows(), v.row_len(), v.ne()), (3, 32, &[32u64, 3][..]));
        for r in 0..3 {
            assert_eq!(v.row(r), w.row(r + 1));
            assert_eq!(
                v.row(r).as_ptr(),
                w.row(r + 1).as_ptr(),
                "a view, not a copy"
            );
        }
        for bad in [2..2, 4..6, 0..9] {
            assert!(matches!(
                w.row_range(bad),
                Err(LazyWeightError::BadShape { .. })
            ));
        }
        // A 3-D tensor's rows run through its last dimension.
        let w3 = LazyWeight::from_parts(GgmlType::Q8_0, &[32, 1, 5], &bytes).unwrap();
        assert_eq!(w3.row_range(4..5).unwrap().row(0), w.row(4));
    }

    #[test]
    fn rejects_bad_shapes_and_types() {
        let bytes = vec![0u8; 144];
        assert!(matches!(
            LazyWeight::from_parts(GgmlType::Q4_K, &[128, 2], &bytes),
            Err(LazyWeightError::NotBlockMultiple { .. })
        ));
        assert!(matches!(
            LazyWeight::from_parts(GgmlType::Q4_K, &[], &bytes),
            Err(LazyWeightError::BadShape { .. })
        ));
        assert!(matches!(
            LazyWeight::from_parts(GgmlType::Q4_K, &[256, 0], &bytes),
            Err(LazyWeightError::BadShape { .. })
        ));
        assert!(matches!(
            LazyWeight::from_parts(GgmlType::Q4_K, &[256, u64::MAX, 2], &bytes),
            Err(LazyWeightError::BadShape { .. })
        ));
        assert!(matches!(
            LazyWeight::from_parts(GgmlType::NVFP4, &[64], &bytes[..36]),
            Err(LazyWeightError::UnsupportedType { .. })
        ));
        let w = LazyWeight::from_parts(GgmlType::Q4_K, &[256, 1, 1, 1], &bytes).unwrap();
        assert!(matches!(
            w.dequantize_row(1, &mut [0.0; 256]),
            Err(LazyWeightError::RowOutOfRange { row: 1, n_rows: 1 })
        ));
        assert!(w.dequantize_row(0, &mut [0.0; 255]).is_err());
    }
}
