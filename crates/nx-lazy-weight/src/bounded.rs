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
//! `|exact − approx| ≤ (γ(8n+16) + γ(n+1))·T`. `T` is bounded per row, with no float work
//! per block: `|s_b| ≤ m·d_x·(1+u)` for the row's largest `m = max_b |d_w|`, so
//! `T ≤ (1+u)·m·X` with `X = Σ_b d_x·128·Σ|x|` per token, which is summed in f32 once per
//! step (a chain of non-negative terms, off by at most `γ(n)` relative) and multiplied by
//! `m` (one more rounding): the factor is divided by `(1 − γ(n))·(1 − u)/(1 + u)`. The
//! margin is doubled to cover the rounding of `approx ± margin`.
//!
//! Outputs are finite whenever the approximations are: a non-finite scale makes a
//! product infinite or NaN, which no later addition undoes. A token whose pass saw a
//! non-finite value, or whose candidates exceed its `k` by more than
//! [`MAX_EXTRA_CANDIDATES`], gets `None`: the caller computes its row in full.

use nx_syscalls::ThreadPool;

use crate::formats::read_f16;
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
/// tier: Q8_0 rows under the AVX-512 VNNI tier, or under the AVX2 tier where the CPU has
/// AVX-VNNI (`vpdpbusd` on 256-bit registers, VEX-encoded: Intel's cores since Alder Lake
/// and Sapphire Rapids, AMD's since Zen 5).
pub fn has_bounded_kernel(w: &LazyWeight<'_>) -> bool {
    w.ggml_type() == nx_gguf::GgmlType::Q8_0
        && w.row_len() > 0
        && w.row_len().is_multiple_of(32)
        && w.n_rows() <= u32::MAX as usize
        && vnni_width().is_some()
}

/// The fewest tokens per call for which the bound pass beats the full matmul of a head on
/// this process's tier. The pass sweeps every row once whatever the token count (up to
/// eight, sixteen with AMX); the full head's cost grows with the tokens, slowly on the
/// AVX-512 tier, fast on the AVX2 tier (Intel Xeon family 6 model 207, `NX_TIER=avx2`:
/// 2 tokens 8.3 ms against 16.0, 4 tokens 11.6 against 27.3). On the AVX-512 tier the
/// paired pass took it from six tokens to three: `benches/batched` there (two threads,
/// the Gemma 3 head), full head 2 / 4 / 8 tokens 5.6 / 7.8 / 13.0 ms against the pass's
/// 6.1–6.4 / 6.0–6.8 / 6.1–6.5; and in a serving step, where the head streams from memory
/// either way, `nx bench --parallel N` (alternating runs) gained with the pass at 3
/// sequences in 7 of 8 pairs (about +7 %), at 4 in 5 of 5 (+8 %), at 5 in 3 of 3
/// (+15–34 %: five tokens took the full head's eight-wide tiles). The row-lane pass that
/// replaced the paired one there does work in proportion to the tokens, but streams the
/// head no faster: two tokens still lose (full head 5.9–6.1 ms, the pass 6.0–6.8, AMD
/// EPYC family 25 model 17).
pub fn min_bounded_tokens() -> usize {
    match vnni_width() {
        Some(VnniWidth::Avx2) => 2,
        _ => 3,
    }
}

/// The widest `vpdpbusd` this process's tier may run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum VnniWidth {
    /// AVX-512 VNNI: eight or sixteen tokens per pass.
    Avx512,
    /// AVX-VNNI under the AVX2 tier: eight tokens per pass, or sixteen on register pairs.
    Avx2,
}

fn vnni_width() -> Option<VnniWidth> {
    #[cfg(target_arch = "x86_64")]
    {
        use nx_syscalls::CpuTier;
        match crate::tier::active_tier() {
            Ok(CpuTier::Avx512Vnni) if crate::avx512::available() => Some(VnniWidth::Avx512),
            Ok(CpuTier::Avx2) if crate::avx2::available() && x86::has_avx_vnni() => {
                Some(VnniWidth::Avx2)
            }
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// A pass of [`BoundedHead`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BoundedKernel {
    /// `vpdpbusd` (AVX-512 VNNI, or AVX-VNNI under the AVX2 tier): one token per 32-bit
    /// lane, each weight quad broadcast.
    Vnni,
    /// AMX-INT8: sixteen rows by sixteen tokens of one block's integer dot products per
    /// `tdpbssd`, where the CPU has it and the kernel grants tile data (`NX_AMX=0` turns
    /// it off). Its tile operations cost the same for any number of tokens: it is the
    /// faster pass above eight.
    Amx,
}

impl BoundedKernel {
    /// Whether this pass can run here for weights of `w`'s type ([`has_bounded_kernel`]).
    pub fn available(self, w: &LazyWeight<'_>) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            has_bounded_kernel(w)
                && (self == BoundedKernel::Vnni
                    || vnni_width() == Some(VnniWidth::Avx512) && crate::amx::available())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = w;
            false
        }
    }
}

/// Above this many tokens [`BoundedHead::new`]'s head takes the AMX pass where it can
/// (`benches/batched`, `bounded/…`: at eight tokens the VNNI pass's 256-bit registers are
/// as fast).
const AMX_ABOVE: usize = 8;

/// One weight made ready for [`BoundedHead::candidates`], computed once: every block's
/// `Σw`, from which the VNNI pass above eight tokens gets the term `−128·Σw` that turns
/// its unsigned activations (`x + 128`) back into `Σ w·x` (one small load per block
/// instead of flipping every weight quad, which it takes as `vpdpbusd`'s memory operand;
/// a token's two accumulators each start at half of it; up to eight tokens the row-lane
/// and paired passes flip the quads they load or broadcast anyway and start from the
/// activations' `−128·Σx`; the AMX pass multiplies signed bytes); each row's largest
/// `|d_w|` (its `T` is bounded per row, see the module docs); and under AVX-512 the scales
/// of every sixteen rows side by side, for the row-lane pass.
#[derive(Debug)]
pub struct BoundedHead {
    /// `[n_rows, n_blocks]`; empty for a head that never runs the VNNI pass.
    corrections: Vec<BlockSum>,
    /// `[n_rows]`, NaN when a scale is.
    row_max: Vec<f32>,
    /// `[n_rows / 16, n_blocks, 16]`: the f16 scales of each whole group of sixteen rows,
    /// block by block, as the AVX-512 pass of up to eight tokens reads them (one load
    /// per group and block, see `x86::lane_row_sums`); empty on other tiers.
    lane_scales: Vec<u16>,
    n_blocks: usize,
    /// Tokens above which a pass takes AMX (`usize::MAX`: never).
    amx_above: usize,
    /// The weight's address, length and row length (what [`Self::candidates`] checks).
    weight: (usize, usize, usize),
}

impl BoundedHead {
    /// Prepares `w` (one pass over its rows, on `pool`) for the fastest pass this CPU
    /// runs at each number of tokens; `None` when [`has_bounded_kernel`] is false.
    pub fn new(w: &LazyWeight<'_>, pool: &ThreadPool) -> Option<BoundedHead> {
        let amx = BoundedKernel::Amx.available(w);
        let mut head = BoundedHead::with_kernel(w, pool, BoundedKernel::Vnni)?;
        head.amx_above = if amx { AMX_ABOVE } else { usize::MAX };
        Some(head)
    }

    /// Prepares `w` for `kernel`'s pass at every number of tokens; `None` when that pass
    /// cannot run here. Every pass gives the candidates the same (exact) outputs; which
    /// rows below the top they list may differ.
    pub fn with_kernel(
        w: &LazyWeight<'_>,
        pool: &ThreadPool,
        kernel: BoundedKernel,
    ) -> Option<BoundedHead> {
        if !kernel.available(w) {
            return None;
        }
        let n_blocks = w.row_len() / 32;
        let corrections = match kernel {
            // Each block's `Σw`: the VNNI passes start two lanes or two chains of every
            // token at half its `−128·Σw`.
            BoundedKernel::Vnni => per_row(w, pool, n_blocks, |row, out| {
                for (wb, c) in row.chunks_exact(Q8_0_BLOCK).zip(out) {
                    *c = block_sum(wb);
                }
            }),
            // A head that only runs the AMX pass (signed bytes) needs no terms.
            BoundedKernel::Amx => Vec::new(),
        };
        let row_max = per_row(w, pool, 1, |row, out| {
            out[0] = row.chunks_exact(Q8_0_BLOCK).fold(0f32, |m, wb| {
                let d = read_f16(wb, 0);
                if d.is_nan() || m.is_nan() {
                    f32::NAN
                } else {
                    m.max(d.abs())
                }
            });
        });
        let lane_scales = match (kernel, vnni_width()) {
            (BoundedKernel::Vnni, Some(VnniWidth::Avx512)) => lane_scales(w, pool, n_blocks),
            _ => Vec::new(),
        };
        Some(BoundedHead {
            corrections,
            row_max,
            lane_scales,
            n_blocks,
            amx_above: match kernel {
                BoundedKernel::Vnni => usize::MAX,
                BoundedKernel::Amx => 0,
            },
            weight: (w.bytes().as_ptr() as usize, w.bytes().len(), w.row_len()),
        })
    }

    /// The pass this head runs for `n_tokens` tokens (per sixteen).
    pub fn kernel_for(&self, n_tokens: usize) -> BoundedKernel {
        if n_tokens.min(MAX_TOKENS) > self.amx_above {
            BoundedKernel::Amx
        } else {
            BoundedKernel::Vnni
        }
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
        // Tokens per pass: the lanes of the widest register (a pair of 256-bit ones on
        // the AVX2 tier).
        let per_pass = MAX_TOKENS;
        let mut t0 = 0;
        while t0 < n {
            let nt = (n - t0).min(per_pass);
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
        let tables = x86::Tables {
            corrections: &self.corrections,
            row_max: &self.row_max,
            lane_scales: &self.lane_scales,
            n_blocks: self.n_blocks,
        };
        let kernel = self.kernel_for(top.len());
        let avx2 = vnni_width() == Some(VnniWidth::Avx2);
        x86::candidates(w, (tables, kernel, avx2), scratch, (t0, top), pool)
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

/// A Q8_0 block's `Σw`: `|Σw| ≤ 32·128`, so two bytes hold it, where the `i32` term
/// `−128·Σw` would take four. The table is read beside the whole head on every pass of
/// more than eight tokens (for Gemma 3's head, 10.5 MB instead of 21 MB next to the 178
/// MB of weights).
type BlockSum = i16;

/// `Σw` of the Q8_0 block `wb` (its 2-byte scale, then 32 signed quants).
fn block_sum(wb: &[u8]) -> BlockSum {
    let sum: i32 = wb[2..Q8_0_BLOCK].iter().map(|&q| q as i8 as i32).sum();
    // |sum| ≤ 32·128 = 4096: exact in an i16.
    sum as BlockSum
}

/// Half of a block's `−128·Σw` (exact: the term is even), where each of a token's two
/// accumulators starts: `Σ (x + 128)·w` from both then sums to `Σ w·x`.
#[inline(always)]
fn half_term(sum: BlockSum) -> i32 {
    -64 * i32::from(sum)
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

/// Rows per group of the AVX-512 pass of up to eight tokens (one row per 32-bit lane).
const LANE_ROWS: usize = 16;

/// `BoundedHead::lane_scales` of `w`: for each whole group of [`LANE_ROWS`] rows and each
/// block, the rows' f16 scale bits side by side.
pub(crate) fn lane_scales(w: &LazyWeight<'_>, pool: &ThreadPool, n_blocks: usize) -> Vec<u16> {
    let groups = w.n_rows() / LANE_ROWS;
    let mut out = vec![0u16; groups * n_blocks * LANE_ROWS];
    let mut states = vec![(); pool.n_threads().max(1)];
    let (bytes, row_bytes) = (w.bytes(), w.row_bytes());
    let per_group = n_blocks * LANE_ROWS;
    pool.parallel_chunks_mut(&mut out, per_group, 256, &mut states, |_, groups, out| {
        for (g, out) in groups.zip(out.chunks_exact_mut(per_group)) {
            group_scales(&bytes[g * LANE_ROWS * row_bytes..], row_bytes, out);
        }
    });
    out
}

/// The f16 scale bits of [`LANE_ROWS`] rows from the start of `group` (`row_bytes` apart)
/// into `out`, `[n_blocks, LANE_ROWS]`.
fn group_scales(group: &[u8], row_bytes: usize, out: &mut [u16]) {
    for (b, lanes) in out.chunks_exact_mut(LANE_ROWS).enumerate() {
        for (k, d) in lanes.iter_mut().enumerate() {
            let at = k * row_bytes + b * Q8_0_BLOCK;
            *d = u16::from_le_bytes([group[at], group[at + 1]]);
        }
    }
}

/// `[n_rows, per]` values, `f(row, out)` filling each row's `per` (one pass over the rows
/// on `pool`).
fn per_row<T: Copy + Default + Send>(
    w: &LazyWeight<'_>,
    pool: &ThreadPool,
    per: usize,
    f: impl Fn(&[u8], &mut [T]) + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); w.n_rows() * per];
    let mut states = vec![(); pool.n_threads().max(1)];
    let (bytes, row_bytes) = (w.bytes(), w.row_bytes());
    pool.parallel_chunks_mut(&mut out, per, 4096, &mut states, |_, rows, out| {
        let rows = &bytes[rows.start * row_bytes..rows.end * row_bytes];
        for (row, out) in rows.chunks_exact(row_bytes).zip(out.chunks_exact_mut(per)) {
            f(row, out);
        }
    });
    out
}

/// The margin factor `c` of the module docs for rows of `n_blocks` blocks: an output's
/// exact value lies within `c·T` of its approximation, `T` as summed by the pass.
fn margin_factor(n_blocks: usize) -> f32 {
    let u = f64::powi(2.0, -24);
    let gamma = |m: usize| {
        let mu = m as f64 * u;
        mu / (1.0 - mu)
    };
    let c = 2.0 * (gamma(8 * n_blocks + 16) + gamma(n_blocks + 1) + 4.0 * u)
        / (1.0 - gamma(n_blocks))
        * (1.0 + u)
        / (1.0 - u);
    // Rounded up to f32.
    (c * (1.0 + 1e-6)) as f32
}

#[cfg(target_arch = "x86_64")]
mod x86;
