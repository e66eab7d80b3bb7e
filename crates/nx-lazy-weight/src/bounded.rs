//! Each token's few largest matmul outputs without every output exactly: approximate
//! outputs with a proven error bound, then the exact outputs of the few rows that can
//! still be among them.
//!
//! A greedy decode step needs only the LM head's argmax, and a top-k sampler only its
//! `k` largest logits, yet the exact outputs cost the
//! most where the head is largest: the single-token kernel's float order (eight lane
//! chains per row, one FMA per block and lane) is what keeps every logit bit-identical,
//! and with several tokens per step those FMAs, not the weight reads, bound the pass.
//! Here one pass computes, for every row and token, the same sum in a cheaper order —
//! each block's integer dot product whole, one FMA per block — together with a bound
//! on how far any two float orders of that sum can lie apart. A row whose upper end
//! falls below the `k`-th largest lower end has `k` rows above it and cannot be among the
//! top `k`; the rest (a few more than `k`) get their exact outputs from the per-output
//! kernel, so the caller picks its token from the very bits a full matmul would have
//! produced.
//!
//! The bound. Every kernel of a Q8_0 row computes `S = Σ_b s_b·Σ_k w_k·x_k` with the
//! same `s_b = d_w·d_x` (one f32 product) and exact integer block sums; only the order
//! of the float additions differs. With `u = 2⁻²⁴` and `γ(m) = m·u / (1 − m·u)`, any
//! order in which each product passes through at most `m` roundings lies within
//! `γ(m)·Σ|terms|` of `S`, and `Σ|terms| ≤ T = Σ_b |s_b|·128·Σ_k |x_k|` (`|w| ≤ 128`).
//! The exact kernels keep eight lanes (`m ≤ n_blocks + 3`; `8·n_blocks + 16` is used, so
//! any lane split is covered) and this pass one chain (`m = n_blocks + 1`), so
//! `|exact − approx| ≤ (γ(8n+16) + γ(n+1))·T`. `T` itself is summed in f32 alongside
//! (a chain of non-negative terms, off by at most `γ(n)` relative), and the margin is
//! doubled to cover the rounding of `approx ± margin`.
//!
//! Outputs are finite whenever the approximations are: a non-finite scale makes a
//! product infinite or NaN, which no later addition undoes. A token whose pass saw a
//! non-finite value, or whose candidates exceed its `k` by more than
//! [`MAX_EXTRA_CANDIDATES`], gets `None`: the caller computes its row in full.

use nx_syscalls::ThreadPool;

use crate::{LazyWeight, LazyWeightError, QuantizedActs};

/// At most this many rows per token beyond its `k` get exact outputs; past that (rows
/// with equal or nearly equal outputs), the caller's full matmul is cheaper.
pub const MAX_EXTRA_CANDIDATES: usize = 64;

/// The rows that can be among one token's `k` largest outputs, in increasing order, each
/// with its exact output (the bits [`crate::matmul()`] gives). Every row among the top
/// `k` (ties at the `k`-th included) is here; every row not here has a smaller exact
/// output than `k` rows that are. All outputs are finite.
pub type Candidates = Vec<(u32, f32)>;

/// Buffers of [`BoundedHead::candidates`], kept across calls.
#[derive(Debug, Default)]
pub struct BoundedScratch {
    acts: QuantizedActs,
    #[cfg(target_arch = "x86_64")]
    layout: Vec<u8>,
}

/// Whether [`BoundedHead`] has a kernel for weights of `w`'s type on this process's
/// tier (Q8_0 rows under the AVX-512 VNNI tier).
pub fn has_bounded_kernel(w: &LazyWeight<'_>) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        w.ggml_type() == nx_gguf::GgmlType::Q8_0
            && w.row_len() > 0
            && w.row_len().is_multiple_of(32)
            && w.n_rows() <= u32::MAX as usize
            && matches!(
                crate::tier::active_tier(),
                Ok(nx_syscalls::CpuTier::Avx512Vnni)
            )
            && crate::avx512::available()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = w;
        false
    }
}

/// One weight made ready for [`BoundedHead::candidates`]: every block's `−128·Σw`, the
/// term that turns the pass's unsigned activations (`x + 128`) back into `Σ w·x` — one
/// load per block instead of flipping every weight quad (4 bytes per 34-byte block,
/// computed once).
#[derive(Debug)]
pub struct BoundedHead {
    /// `[n_rows, n_blocks]`.
    corrections: Vec<i32>,
    n_blocks: usize,
    /// The weight's address, length and row length (what [`Self::candidates`] checks).
    weight: (usize, usize, usize),
}

impl BoundedHead {
    /// Prepares `w` (one pass over its rows, on `pool`); `None` when
    /// [`has_bounded_kernel`] is false.
    pub fn new(w: &LazyWeight<'_>, pool: &ThreadPool) -> Option<BoundedHead> {
        if !has_bounded_kernel(w) {
            return None;
        }
        let n_blocks = w.row_len() / 32;
        let mut corrections = vec![0i32; w.n_rows() * n_blocks];
        let mut states = vec![(); pool.n_threads().max(1)];
        let (bytes, row_bytes) = (w.bytes(), w.row_bytes());
        pool.parallel_chunks_mut(
            &mut corrections,
            n_blocks,
            4096,
            &mut states,
            |_, rows, out| {
                let rows = &bytes[rows.start * row_bytes..rows.end * row_bytes];
                for (row, out) in rows
                    .chunks_exact(row_bytes)
                    .zip(out.chunks_exact_mut(n_blocks))
                {
                    for (wb, c) in row.chunks_exact(Q8_0_BLOCK).zip(out.iter_mut()) {
                        *c = -128 * wb[2..].iter().map(|&q| q as i8 as i32).sum::<i32>();
                    }
                }
            },
        );
        Some(BoundedHead {
            corrections,
            n_blocks,
            weight: (w.bytes().as_ptr() as usize, w.bytes().len(), w.row_len()),
        })
    }

    /// For each of the `n` tokens of `x` (`[n, w.row_len()]`), the rows of `w` that can be
    /// among its `top[t]` largest outputs `dot(w row r, x[t])` (1: the largest), with
    /// their exact outputs; `None` for a token whose bound did not hold (see the module
    /// docs). `w` must be the weight this head was built from.
    ///
    /// ```no_run
    /// # fn demo(w: &nx_lazy_weight::LazyWeight<'_>, x: &[f32], pool: &nx_syscalls::ThreadPool)
    /// # -> Result<(), nx_lazy_weight::LazyWeightError> {
    /// use nx_lazy_weight::{BoundedHead, BoundedScratch};
    /// let head = BoundedHead::new(w, pool).expect("Q8_0 rows on the AVX-512 VNNI tier");
    /// let per_token = head.candidates(w, x, &[1], &mut BoundedScratch::default(), pool)?;
    /// if let Some(rows) = &per_token[0] {
    ///     // Highest output, lowest row on ties: the row a full matmul would give.
    ///     let best = rows.iter().fold(rows[0], |b, &c| if c.1 > b.1 { c } else { b });
    ///     println!("row {} ({})", best.0, best.1);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn candidates(
        &self,
        w: &LazyWeight<'_>,
        x: &[f32],
        top: &[usize],
        scratch: &mut BoundedScratch,
        pool: &ThreadPool,
    ) -> Result<Vec<Option<Candidates>>, LazyWeightError> {
        let n = top.len();
        // A count of 0 asks for nothing: it is taken as 1.
        let top: Vec<usize> = top.iter().map(|&k| k.max(1)).collect();
        let (at, len, row_len) = self.weight;
        if (w.bytes().as_ptr() as usize, w.bytes().len(), w.row_len()) != (at, len, row_len)
            || !has_bounded_kernel(w)
        {
            return Err(LazyWeightError::OtherWeight { built: len });
        }
        scratch.acts.quantize_for_pool(w, x, n, pool)?;
        let mut out = Vec::with_capacity(n);
        let mut t0 = 0;
        while t0 < n {
            let nt = (n - t0).min(MAX_TOKENS);
            let rows = self.rows_of(w, scratch, t0, &top[t0..t0 + nt], pool);
            for (t, rows) in rows.into_iter().enumerate() {
                out.push(match rows {
                    Some(rows) => Some(exact_outputs(w, &scratch.acts, t0 + t, &rows)?),
                    None => None,
                });
            }
            t0 += nt;
        }
        Ok(out)
    }

    #[cfg(target_arch = "x86_64")]
    fn rows_of(
        &self,
        w: &LazyWeight<'_>,
        scratch: &mut BoundedScratch,
        t0: usize,
        top: &[usize],
        pool: &ThreadPool,
    ) -> Vec<Option<Vec<u32>>> {
        x86::candidates(
            w,
            (&self.corrections, self.n_blocks),
            scratch,
            (t0, top),
            pool,
        )
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn rows_of(
        &self,
        _: &LazyWeight<'_>,
        _: &mut BoundedScratch,
        _: usize,
        top: &[usize],
        _: &ThreadPool,
    ) -> Vec<Option<Vec<u32>>> {
        vec![None; top.len()]
    }
}

/// Tokens per pass: sixteen lanes.
const MAX_TOKENS: usize = 16;
/// Bytes of a Q8_0 block.
const Q8_0_BLOCK: usize = crate::formats::Q8_0_BYTES;

/// The exact outputs of `rows` for token `t`: the per-output kernel, whose bits every
/// matmul shares.
fn exact_outputs(
    w: &LazyWeight<'_>,
    acts: &QuantizedActs,
    t: usize,
    rows: &[u32],
) -> Result<Candidates, LazyWeightError> {
    let x_row = acts.get_row(t).ok_or(LazyWeightError::LengthMismatch {
        what: "argmax_candidates: activation rows",
        expected: t + 1,
        actual: acts.n_rows(),
    })?;
    rows.iter()
        .map(|&r| {
            let y = crate::dot_row(w.ggml_type(), w.row(r as usize), x_row, w.row_len())?;
            Ok((r, y))
        })
        .collect()
}

/// The margin factor `c` of the module docs for rows of `n_blocks` blocks: an output's
/// exact value lies within `c·T` of its approximation, `T` as summed by the pass.
fn margin_factor(n_blocks: usize) -> f32 {
    let u = f64::powi(2.0, -24);
    let gamma = |m: usize| {
        let mu = m as f64 * u;
        mu / (1.0 - mu)
    };
    let c =
        2.0 * (gamma(8 * n_blocks + 16) + gamma(n_blocks + 1) + 4.0 * u) / (1.0 - gamma(n_blocks));
    // Rounded up to f32.
    (c * (1.0 + 1e-6)) as f32
}

#[cfg(target_arch = "x86_64")]
mod x86;
