//! Each token's largest matmul output without every output exactly: approximate outputs
//! with a proven error bound, then the exact outputs of the few rows that can still win.
//!
//! A greedy decode step needs only the LM head's argmax, yet the exact outputs cost the
//! most where the head is largest: the single-token kernel's float order (eight lane
//! chains per row, one FMA per block and lane) is what keeps every logit bit-identical,
//! and with several tokens per step those FMAs, not the weight reads, bound the pass.
//! Here one pass computes, for every row and token, the same sum in a cheaper order —
//! each block's integer dot product whole, one FMA per block — together with a bound
//! on how far any two float orders of that sum can lie apart. A row whose upper end
//! falls below the best lower end cannot hold the maximum; the rest (a handful) get
//! their exact outputs from the per-output kernel, so the caller picks its token from
//! the very bits a full matmul would have produced.
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
//! non-finite value, or whose candidates exceed [`MAX_CANDIDATES`], gets `None`: the
//! caller computes its row in full.

use nx_syscalls::ThreadPool;

use crate::{LazyWeight, LazyWeightError, QuantizedActs};

/// At most this many rows per token get exact outputs; beyond that (rows with equal
/// or nearly equal outputs), the caller's full matmul is cheaper.
pub const MAX_CANDIDATES: usize = 64;

/// The rows that can hold one token's largest output, in increasing order, each with
/// its exact output (the bits [`crate::matmul`] gives). Every row whose exact output is
/// the largest of all rows is here; every row not here has a smaller exact output than
/// some row that is. All outputs are finite.
pub type Candidates = Vec<(u32, f32)>;

/// Buffers of [`ArgmaxHead::candidates`], kept across calls.
#[derive(Debug, Default)]
pub struct ArgmaxScratch {
    acts: QuantizedActs,
    #[cfg(target_arch = "x86_64")]
    layout: Vec<u8>,
}

/// Whether [`ArgmaxHead`] has a kernel for weights of `w`'s type on this process's
/// tier (Q8_0 rows under the AVX-512 VNNI tier).
pub fn has_argmax_kernel(w: &LazyWeight<'_>) -> bool {
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

/// One weight made ready for [`ArgmaxHead::candidates`]: every block's `−128·Σw`, the
/// term that turns the pass's unsigned activations (`x + 128`) back into `Σ w·x` — one
/// load per block instead of flipping every weight quad (4 bytes per 34-byte block,
/// computed once).
#[derive(Debug)]
pub struct ArgmaxHead {
    /// `[n_rows, n_blocks]`.
    corrections: Vec<i32>,
    n_blocks: usize,
    /// The weight's address, length and row length (what [`Self::candidates`] checks).
    weight: (usize, usize, usize),
}

impl ArgmaxHead {
    /// Prepares `w` (one pass over its rows, on `pool`); `None` when
    /// [`has_argmax_kernel`] is false.
    pub fn new(w: &LazyWeight<'_>, pool: &ThreadPool) -> Option<ArgmaxHead> {
        if !has_argmax_kernel(w) {
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
        Some(ArgmaxHead {
            corrections,
            n_blocks,
            weight: (w.bytes().as_ptr() as usize, w.bytes().len(), w.row_len()),
        })
    }

    /// For each of the `n` tokens of `x` (`[n, w.row_len()]`), the rows of `w` that can
    /// hold its largest output `dot(w row r, x[t])`, with their exact outputs; `None` for
    /// a token whose bound did not hold (see the module docs). `w` must be the weight
    /// this head was built from.
    ///
    /// ```no_run
    /// # fn demo(w: &nx_lazy_weight::LazyWeight<'_>, x: &[f32], pool: &nx_syscalls::ThreadPool)
    /// # -> Result<(), nx_lazy_weight::LazyWeightError> {
    /// use nx_lazy_weight::{ArgmaxHead, ArgmaxScratch};
    /// let head = ArgmaxHead::new(w, pool).expect("Q8_0 rows on the AVX-512 VNNI tier");
    /// let per_token = head.candidates(w, x, 1, &mut ArgmaxScratch::default(), pool)?;
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
        n: usize,
        scratch: &mut ArgmaxScratch,
        pool: &ThreadPool,
    ) -> Result<Vec<Option<Candidates>>, LazyWeightError> {
        let (at, len, row_len) = self.weight;
        if (w.bytes().as_ptr() as usize, w.bytes().len(), w.row_len()) != (at, len, row_len)
            || !has_argmax_kernel(w)
        {
            return Err(LazyWeightError::OtherWeight { built: len });
        }
        scratch.acts.quantize_for_pool(w, x, n, pool)?;
        let mut out = Vec::with_capacity(n);
        let mut t0 = 0;
        while t0 < n {
            let nt = (n - t0).min(MAX_TOKENS);
            let rows = self.rows_of(w, scratch, t0, nt, pool);
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
        scratch: &mut ArgmaxScratch,
        t0: usize,
        nt: usize,
        pool: &ThreadPool,
    ) -> Vec<Option<Vec<u32>>> {
        x86::candidates(
            w,
            (&self.corrections, self.n_blocks),
            scratch,
            (t0, nt),
            pool,
        )
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn rows_of(
        &self,
        _: &LazyWeight<'_>,
        _: &mut ArgmaxScratch,
        _: usize,
        nt: usize,
        _: &ThreadPool,
    ) -> Vec<Option<Vec<u32>>> {
        vec![None; nt]
    }
}

/// Tokens per pass: two registers of eight.
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
mod x86 {
    //! The bound pass on AVX-512 VNNI: eight tokens per 256-bit register (one lane each),
    //! each weight quad broadcast from the row as `vpdpbusd`'s memory operand.

    use std::arch::x86_64::*;

    use super::{margin_factor, ArgmaxScratch, MAX_CANDIDATES, MAX_TOKENS, Q8_0_BLOCK};
    use crate::formats::read_f16;
    use crate::LazyWeight;
    use nx_syscalls::ThreadPool;

    /// Tokens per register.
    const LANES: usize = 8;
    /// Bytes of one block of one register's tokens in the layout: eight registers of
    /// quads (lane `t` holds token `t`'s quants `4j..4j+4`, plus 128 as unsigned bytes),
    /// the scales `d_x` and the bound weights `128·Σ|x|`.
    const GROUP_BLOCK_BYTES: usize = 10 * 32;
    /// Added to every margin: covers the absolute rounding errors of subnormal values
    /// (far below any output that is not itself negligible).
    const TINY: f32 = 7.5e-37;
    /// Rows per chunk of the pass.
    const CHUNK_ROWS: usize = 512;
    /// Independent `vpdpbusd` chains per row, block and register.
    const CHAINS: usize = 2;

    /// Per-thread results of the pass: the best lower end per lane, a sum that turns
    /// NaN when any lane saw a non-finite value, and the rows that may still win —
    /// each row whose upper end reached the thread's best lower end so far, with its
    /// upper ends. The best lower end only grows, so every row whose upper end reaches
    /// the final one is among them (rows are few: records of a running maximum).
    #[derive(Clone)]
    struct PassState {
        lower_max: [f32; MAX_TOKENS],
        check: [f32; MAX_TOKENS],
        maybe: Vec<(u32, [f32; MAX_TOKENS])>,
    }

    /// Row candidates of tokens `t0..t0 + nt` of `scratch.acts` (already quantized),
    /// `corrections` being the weight's `[n_rows, n_blocks]` block terms.
    pub(super) fn candidates(
        w: &LazyWeight<'_>,
        (corrections, n_blocks): (&[i32], usize),
        scratch: &mut ArgmaxScratch,
        (t0, nt): (usize, usize),
        pool: &ThreadPool,
    ) -> Vec<Option<Vec<u32>>> {
        let groups = nt.div_ceil(LANES);
        lay_out(&scratch.acts, t0, nt, n_blocks, &mut scratch.layout);
        let init = PassState {
            lower_max: [f32::NEG_INFINITY; MAX_TOKENS],
            check: [0.0; MAX_TOKENS],
            maybe: Vec::new(),
        };
        let mut states = vec![init; pool.n_threads().max(1)];
        let c = margin_factor(n_blocks);
        let layout = &scratch.layout[..];
        let bytes = w.bytes();
        let row_bytes = w.row_bytes();
        pool.parallel_for_with(w.n_rows(), CHUNK_ROWS, &mut states, |state, rows| {
            let w_rows = &bytes[rows.start * row_bytes..rows.end * row_bytes];
            let corr = &corrections[rows.start * n_blocks..rows.end * n_blocks];
            let args = (layout, n_blocks, c);
            // SAFETY: `has_argmax_kernel` checked the features; `w_rows` holds whole rows
            // of `n_blocks` Q8_0 blocks and `corr` their terms, the layout `groups`
            // registers per block.
            unsafe {
                if groups == 1 {
                    pass::<1>((w_rows, row_bytes, corr), args, (rows.start, nt), state);
                } else {
                    pass::<2>((w_rows, row_bytes, corr), args, (rows.start, nt), state);
                }
            }
        });
        let mut lower = [f32::NEG_INFINITY; MAX_TOKENS];
        let mut finite = [true; MAX_TOKENS];
        for s in &states {
            for t in 0..MAX_TOKENS {
                lower[t] = lower[t].max(s.lower_max[t]);
                finite[t] &= s.check[t] == 0.0;
            }
        }
        let mut maybe: Vec<&(u32, [f32; MAX_TOKENS])> =
            states.iter().flat_map(|s| &s.maybe).collect();
        maybe.sort_unstable_by_key(|m| m.0);
        (0..nt)
            .map(|t| {
                let rows: Vec<u32> = maybe
                    .iter()
                    .filter(|m| m.1[t] >= lower[t])
                    .map(|m| m.0)
                    .take(MAX_CANDIDATES + 1)
                    .collect();
                (finite[t] && lower[t].is_finite() && rows.len() <= MAX_CANDIDATES).then_some(rows)
            })
            .collect()
    }

    /// Lays out tokens `t0..t0 + nt` as the pass reads them: per block, per register
    /// of eight tokens, [`GROUP_BLOCK_BYTES`]. Padding lanes hold `x = 0` (quants 128
    /// unsigned, scale 0): their outputs are 0.
    fn lay_out(
        acts: &crate::QuantizedActs,
        t0: usize,
        nt: usize,
        n_blocks: usize,
        out: &mut Vec<u8>,
    ) {
        let groups = nt.div_ceil(LANES);
        out.clear();
        out.resize(n_blocks * groups * GROUP_BLOCK_BYTES, 0);
        for block in out.chunks_exact_mut(GROUP_BLOCK_BYTES) {
            block[..256].fill(0x80);
        }
        for t in 0..nt {
            let Some(row) = acts.get_row(t0 + t) else {
                continue;
            };
            let (g, lane) = (t / LANES, t % LANES);
            for (b, xb) in row.chunks_exact(Q8_0_BLOCK).take(n_blocks).enumerate() {
                let at = (b * groups + g) * GROUP_BLOCK_BYTES;
                let blk = &mut out[at..at + GROUP_BLOCK_BYTES];
                let qs = &xb[2..];
                for j in 0..8 {
                    for i in 0..4 {
                        blk[32 * j + 4 * lane + i] = qs[4 * j + i] ^ 0x80;
                    }
                }
                let abs: i32 = qs.iter().map(|&q| (q as i8 as i32).abs()).sum();
                let d = read_f16(xb, 0);
                blk[256 + 4 * lane..256 + 4 * lane + 4].copy_from_slice(&d.to_le_bytes());
                blk[288 + 4 * lane..288 + 4 * lane + 4]
                    .copy_from_slice(&((128 * abs) as f32).to_le_bytes());
            }
        }
    }

    /// Every row of `w` (`row_bytes` each, block terms in `corr`; the first is row
    /// `first` of the weight) against the layout's first `nt` tokens: the lower ends'
    /// maximum, the finiteness check and the rows that may win into `state`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL/VNNI and F16C; `w` holds whole rows of `n_blocks`
    /// Q8_0 blocks and `corr` `n_blocks` terms per row; the layout `G` registers per
    /// block.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn pass<const G: usize>(
        (w, row_bytes, corr): (&[u8], usize, &[i32]),
        (layout, n_blocks, c): (&[u8], usize, f32),
        (first, nt): (usize, usize),
        state: &mut PassState,
    ) {
        // Padding lanes (outputs 0) reach their own lower end on every row.
        let tokens = (1u32 << nt.min(MAX_TOKENS)) - 1;
        let rows = w.len() / row_bytes;
        assert!(row_bytes >= n_blocks * Q8_0_BLOCK);
        assert!(corr.len() >= rows * n_blocks);
        assert!(layout.len() >= n_blocks * G * GROUP_BLOCK_BYTES);
        let mut lower = [_mm256_set1_ps(f32::NEG_INFINITY); G];
        let mut check = [_mm256_setzero_ps(); G];
        for g in 0..G {
            // SAFETY: eight f32 each, inside the arrays.
            unsafe {
                lower[g] = _mm256_loadu_ps(state.lower_max[8 * g..].as_ptr());
                check[g] = _mm256_loadu_ps(state.check[8 * g..].as_ptr());
            }
        }
        let cv = _mm256_set1_ps(c);
        let tiny = _mm256_set1_ps(TINY);
        let mut r = 0;
        while r < rows {
            let mut sums = [[(_mm256_setzero_ps(), _mm256_setzero_ps()); G]; 4];
            let block = (&w[r * row_bytes..], row_bytes, &corr[r * n_blocks..]);
            // SAFETY: whole rows from `r` on; the features per this function's contract.
            let k = unsafe {
                if G == 1 && rows - r >= 4 {
                    row_sums::<G, 4>(block, (layout, n_blocks), &mut sums);
                    4
                } else if rows - r >= 2 {
                    row_sums::<G, 2>(block, (layout, n_blocks), &mut sums);
                    2
                } else {
                    row_sums::<G, 1>(block, (layout, n_blocks), &mut sums);
                    1
                }
            };
            for (i, row) in sums.iter().enumerate().take(k) {
                let mut hi = [_mm256_setzero_ps(); G];
                let mut reached = 0u32;
                for g in 0..G {
                    let (approx, total) = row[g];
                    hi[g] = _mm256_add_ps(_mm256_fmadd_ps(total, cv, approx), tiny);
                    let lo = _mm256_sub_ps(_mm256_fnmadd_ps(total, cv, approx), tiny);
                    lower[g] = _mm256_max_ps(lower[g], lo);
                    let span = _mm256_sub_ps(hi[g], lo);
                    check[g] = _mm256_add_ps(check[g], _mm256_sub_ps(span, span));
                    reached |=
                        (_mm256_cmp_ps_mask::<_CMP_GE_OQ>(hi[g], lower[g]) as u32) << (8 * g);
                }
                if reached & tokens != 0 {
                    let mut ends = [f32::NEG_INFINITY; MAX_TOKENS];
                    for g in 0..G {
                        // SAFETY: eight f32, inside `ends`.
                        unsafe { _mm256_storeu_ps(ends[8 * g..].as_mut_ptr(), hi[g]) };
                    }
                    state.maybe.push(((first + r + i) as u32, ends));
                }
            }
            r += k;
        }
        for g in 0..G {
            // SAFETY: eight f32 each, inside the arrays.
            unsafe {
                _mm256_storeu_ps(state.lower_max[8 * g..].as_mut_ptr(), lower[g]);
                _mm256_storeu_ps(state.check[8 * g..].as_mut_ptr(), check[g]);
            }
        }
    }

    /// `R` consecutive rows (from the start of `w`, `row_bytes` apart; their block terms
    /// from the start of `corr`) against the layout: for row `k` and register `g`, the
    /// approximation `Σ_b s_b·Σ w·x` (one FMA chain) and `T = Σ_b |s_b|·128·Σ|x|`.
    ///
    /// # Safety
    /// As [`pass`], with `R` whole rows in `w` and their terms in `corr`.
    #[inline(always)]
    unsafe fn row_sums<const G: usize, const R: usize>(
        (w, row_bytes, corr): (&[u8], usize, &[i32]),
        (layout, n_blocks): (&[u8], usize),
        sums: &mut [[(__m256, __m256); G]; 4],
    ) {
        assert!(w.len() >= (R - 1) * row_bytes + n_blocks * Q8_0_BLOCK);
        assert!(corr.len() >= R * n_blocks);
        let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
        let mut approx = [[_mm256_setzero_ps(); G]; R];
        let mut total = [[_mm256_setzero_ps(); G]; R];
        for b in 0..n_blocks {
            let xb = layout[b * G * GROUP_BLOCK_BYTES..].as_ptr();
            // Two independent chains of four quads per row and register (one chain of
            // eight `vpdpbusd` would wait on its own latency); integer sums, so their
            // order is free.
            let mut acc = [[[_mm256_setzero_si256(); CHAINS]; G]; R];
            // SAFETY (loads): inside the layout's block `b`, the rows' block `b` and their
            // terms (asserted by the caller and above).
            unsafe {
                for (k, acc) in acc.iter_mut().enumerate() {
                    // Σ(w)·(x+128) − 128·Σw = Σ w·x.
                    let corr = _mm256_set1_epi32(*corr.get_unchecked(k * n_blocks + b));
                    for acc in acc.iter_mut() {
                        acc[0] = corr;
                    }
                    // Every row is read once per step: stream ahead, as decoding does.
                    let row = &w[k * row_bytes..(k + 1) * row_bytes];
                    crate::avx2::prefetch_block(row, b * Q8_0_BLOCK, Q8_0_BLOCK, R);
                }
                for j in 0..8 {
                    let mut xu = [_mm256_setzero_si256(); G];
                    for (g, xu) in xu.iter_mut().enumerate() {
                        *xu =
                            _mm256_loadu_si256(xb.add(g * GROUP_BLOCK_BYTES + 32 * j) as *const _);
                    }
                    for k in 0..R {
                        let wq = w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK + 2 + 4 * j);
                        let wv = _mm256_set1_epi32((wq as *const i32).read_unaligned());
                        for g in 0..G {
                            let a = &mut acc[k][g][j % CHAINS];
                            *a = _mm256_dpbusd_epi32(*a, xu[g], wv);
                        }
                    }
                }
                for k in 0..R {
                    let d_bits = (w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK) as *const i16)
                        .read_unaligned();
                    let dw = _mm256_cvtph_ps(_mm_set1_epi16(d_bits));
                    for g in 0..G {
                        let at = g * GROUP_BLOCK_BYTES + 256;
                        let dx = _mm256_loadu_ps(xb.add(at) as *const f32);
                        let bound = _mm256_loadu_ps(xb.add(at + 32) as *const f32);
                        let s = _mm256_mul_ps(dw, dx);
                        let [a0, a1] = acc[k][g];
                        let sum = _mm256_add_epi32(a0, a1);
                        approx[k][g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), s, approx[k][g]);
                        total[k][g] =
                            _mm256_fmadd_ps(_mm256_and_ps(s, abs_mask), bound, total[k][g]);
                    }
                }
            }
        }
        for k in 0..R {
            for g in 0..G {
                sums[k][g] = (approx[k][g], total[k][g]);
            }
        }
    }
}
