//! Quantized matmul: quantize each activation row once, then one dot product per output.
//!
//! `y[t][r] = dot(W row r, xq[t])` where `xq` is activation row `t` quantized to the
//! weight's `vec_dot_type`. Every output element is a single call of a dot kernel
//! whose reduction order depends on K alone, so `y[t][r]` is bit-identical whether
//! it is computed alone, inside a batch of any size, or inside any range of weight
//! rows — the batch- and thread-invariance guarantee. Threads will split work by
//! weight rows through [`matmul_rows`], never along K.

use std::ops::Range;

use nx_gguf::GgmlType;

use crate::dot_scalar::dot_kernel;
use crate::formats::row_bytes;
use crate::lazy::LazyWeight;
use crate::quant::quantize_row;
use crate::LazyWeightError;

/// Activation rows quantized to one `vec_dot_type`, reusable across weights with
/// the same K and dot type (Q, K and V projections share one) and across calls (the
/// buffer is kept and only grows).
#[derive(Debug, Clone)]
pub struct QuantizedActs {
    act_type: GgmlType,
    row_len: usize,
    n_rows: usize,
    row_bytes: usize,
    data: Vec<u8>,
}

impl Default for QuantizedActs {
    fn default() -> Self {
        Self::new()
    }
}

impl QuantizedActs {
    /// An empty holder (no rows).
    pub fn new() -> Self {
        QuantizedActs {
            act_type: GgmlType::F32,
            row_len: 0,
            n_rows: 0,
            row_bytes: 0,
            data: Vec::new(),
        }
    }

    /// Quantize `n` rows of `row_len` values from `x` (`[n, row_len]`, row-major) to
    /// `act_type` (F32, F16, BF16, Q8_0 or Q8_K), replacing the previous contents.
    pub fn quantize(
        &mut self,
        act_type: GgmlType,
        x: &[f32],
        n: usize,
        row_len: usize,
    ) -> Result<(), LazyWeightError> {
        if !matches!(
            act_type,
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q8_0 | GgmlType::Q8_K
        ) {
            return Err(LazyWeightError::UnsupportedType {
                ggml_type: act_type,
                op: "quantize activations",
            });
        }
        let expected = n
            .checked_mul(row_len)
            .ok_or(LazyWeightError::LengthMismatch {
                what: "activations: n·K overflows",
                expected: usize::MAX,
                actual: x.len(),
            })?;
        if x.len() != expected {
            return Err(LazyWeightError::LengthMismatch {
                what: "activations [n, K]",
                expected,
                actual: x.len(),
            });
        }
        let rb = row_bytes(act_type, row_len)?;
        let total = rb.checked_mul(n).ok_or(LazyWeightError::LengthMismatch {
            what: "quantized activations: size overflows",
            expected: usize::MAX,
            actual: 0,
        })?;
        self.data.resize(total, 0);
        if rb > 0 {
            for (xr, qr) in x.chunks_exact(row_len).zip(self.data.chunks_exact_mut(rb)) {
                if act_type == GgmlType::Q8_0 {
                    crate::quant::quantize_q8_0_acts(xr, qr);
                } else {
                    quantize_row(act_type, xr, qr)?;
                }
            }
        }
        self.act_type = act_type;
        self.row_len = row_len;
        self.n_rows = n;
        self.row_bytes = rb;
        Ok(())
    }

    /// Quantize `n` rows `x` (`[n, K]`) for multiplication with `w`.
    pub fn quantize_for(
        &mut self,
        w: &LazyWeight<'_>,
        x: &[f32],
        n: usize,
    ) -> Result<(), LazyWeightError> {
        self.quantize(w.vec_dot_type(), x, n, w.row_len())
    }

    /// The activation type held.
    pub fn act_type(&self) -> GgmlType {
        self.act_type
    }

    /// Elements per row (K).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Number of activation rows (tokens).
    pub fn n_rows(&self) -> usize {
        self.n_rows
    }

    /// Bytes per quantized row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// The bytes of quantized row `t`, or `None` past the end.
    pub fn get_row(&self, t: usize) -> Option<&[u8]> {
        if t >= self.n_rows {
            return None;
        }
        self.data.get(t * self.row_bytes..(t + 1) * self.row_bytes)
    }

    /// True when these activations can multiply `w` (same K and dot type).
    pub fn fits(&self, w: &LazyWeight<'_>) -> bool {
        self.check_for(w).is_ok()
    }

    pub(crate) fn check_for(&self, w: &LazyWeight<'_>) -> Result<(), LazyWeightError> {
        if self.act_type != w.vec_dot_type() {
            return Err(LazyWeightError::ActivationType {
                weight: w.ggml_type(),
                expected: w.vec_dot_type(),
                actual: self.act_type,
            });
        }
        if self.row_len != w.row_len() {
            return Err(LazyWeightError::LengthMismatch {
                what: "activation row length K",
                expected: w.row_len(),
                actual: self.row_len,
            });
        }
        Ok(())
    }
}

/// `y = x·Wᵀ`: `x` is `[n, K]`, `y` is `[n, N]` (N = `w.n_rows()`), both row-major.
/// Quantizes `x` into `scratch`, then calls [`matmul_quantized`].
pub fn matmul(
    w: &LazyWeight<'_>,
    x: &[f32],
    n: usize,
    y: &mut [f32],
    scratch: &mut QuantizedActs,
) -> Result<(), LazyWeightError> {
    scratch.quantize_for(w, x, n)?;
    matmul_quantized(w, scratch, y)
}

/// `y[t][r] = dot(W row r, xq row t)` for all tokens and all weight rows; `y` is
/// `[xq.n_rows(), w.n_rows()]`.
pub fn matmul_quantized(
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    y: &mut [f32],
) -> Result<(), LazyWeightError> {
    // For the full row range, matmul_rows' output layout [n, rows.len()] is y's.
    matmul_rows(w, xq, 0..w.n_rows(), y)
}

/// The inner entry for splitting work across threads by weight rows: computes
/// `out[t][r − rows.start] = dot(W row r, xq row t)` for `r` in `rows` and every token
/// `t`, with `out` laid out `[xq.n_rows(), rows.len()]` (token-major).
///
/// For one token (decode) `out` is simply `y[rows]`; for several, the caller copies
/// each token's slice into place. The value of each element does not depend on
/// `rows` or on the number of tokens.
pub fn matmul_rows(
    w: &LazyWeight<'_>,
    xq: &QuantizedActs,
    rows: Range<usize>,
    out: &mut [f32],
) -> Result<(), LazyWeightError> {
    xq.check_for(w)?;
    if rows.start > rows.end || rows.end > w.n_rows() {
        return Err(LazyWeightError::RowOutOfRange {
            row: rows.end.max(rows.start),
            n_rows: w.n_rows(),
        });
    }
    let width = rows.end - rows.start;
    let n = xq.n_rows();
    if out.len() != n * width {
        return Err(LazyWeightError::LengthMismatch {
            what: "matmul output [n, rows]",
            expected: n * width,
            actual: out.len(),
        });
    }
    let kernel = dot_kernel(w.ggml_type()).ok_or(LazyWeightError::UnsupportedType {
        ggml_type: w.ggml_type(),
        op: "matmul",
    })?;
    if width == 0 || n == 0 {
        return Ok(());
    }
    let w_rows = &w.bytes()[rows.start * w.row_bytes()..rows.end * w.row_bytes()];
    // Weight row outer, tokens inner: each weight row is read once and reused for
    // every token while it is in cache.
    for (j, w_row) in w_rows.chunks_exact(w.row_bytes()).enumerate() {
        for (t, x_row) in xq.data.chunks_exact(xq.row_bytes).take(n).enumerate() {
            out[t * width + j] = kernel(w_row, x_row);
        }
    }
    Ok(())
}
