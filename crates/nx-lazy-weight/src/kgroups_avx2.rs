//! Token groups for the AVX2 tier's K-quants: up to eight Q8_K tokens against each Q4_K /
//! Q5_K / Q6_K weight super-block, for prefill, batched decode steps and draft verification.
//!
//! The single-token kernels give i32 lane `l` of a super-block the sum, over its eight
//! 32-quant vectors `v`, of `scale(v, l)·quad_l(v)`, where `quad_l(v)` is the dot of quants
//! `4l..4l+4` of `v`; each vector costs them a `maddubs` (pair sums) and a `madd` by its
//! scale (pairs to quads and the scale at once), two multiplies per token. Here two
//! neighbouring vectors are taken together: their weight bytes are regrouped (word `2l` of
//! one register holds vector `v`'s quants `4l, 4l+1`, word `2l+1` vector `v+1`'s; the
//! other register the quants `4l+2, 4l+3`) once for all the groups of tokens, a few rows at
//! a time ([`WideBlock`]), and every token's
//! activations are regrouped the same way once per step ([`KGroupActs::build`]). Then two
//! `maddubs` and a word add give both vectors' quad sums side by side, and one `madd` by
//! the scale pair gives `scale(v)·quad_l(v) + scale(v+1)·quad_l(v+1)`: three multiplies
//! per token for two vectors instead of four. The integers are the single-token
//! kernel's (a quad sum fits an i16: `4·63·128` at most), and the float part per token is
//! its FMA chains, so every output keeps the single-token kernel's bits.

use std::arch::x86_64::*;
use std::cell::RefCell;

use nx_gguf::GgmlType;

use crate::avx2::{
    hsum4_ps, hsum_epi32, hsum_ps, k4_sub_block_sums, load16, load32, prefetch_ahead,
    q6_k_half_levels, q6_k_half_scales,
};
use crate::formats::{
    q4_k, q6_k, q8_k, read_f32, scales_mins_k4_packed, Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES,
    Q8_K_BYTES,
};

/// Most tokens one pass over the weight rows takes (their eight i32 sums, the two weight
/// registers and the scales fit the sixteen AVX2 registers).
pub(crate) const GROUP: usize = 8;

/// Bytes of one token's super-block in [`KGroupActs`]: the 256 regrouped quants, the
/// sixteen 16-quant sums (`bsums`, as in Q8_K) and the eight 32-quant sums.
const SLOT: usize = 256 + 32 + 16;
/// Offset of the `bsums` in a slot.
const SLOT_BSUMS: usize = 256;
/// Offset of the 32-quant sums in a slot.
const SLOT_SUB_SUMS: usize = 288;

/// Q8_K activations regrouped for the kernels of this module, super-block by super-block
/// (token `t` of block `b` at slot `b·n_tokens + t`), and their scales `d_x`.
#[derive(Debug, Clone, Default)]
pub(crate) struct KGroupActs {
    slots: Vec<u8>,
    dx: Vec<f32>,
    n_tokens: usize,
    n_blocks: usize,
}

impl KGroupActs {
    /// Tokens held (0 when empty).
    pub(crate) fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Forgets the contents (keeps the buffers).
    pub(crate) fn clear(&mut self) {
        self.n_tokens = 0;
        self.n_blocks = 0;
    }

    /// Lays out the `n` Q8_K activation rows of `rows` (`row_bytes` each); leaves nothing
    /// unless there are at least two whole rows of whole blocks and the CPU has AVX2.
    pub(crate) fn build(&mut self, rows: &[u8], n: usize, row_bytes: usize) {
        self.clear();
        if n < 2
            || row_bytes == 0
            || !row_bytes.is_multiple_of(Q8_K_BYTES)
            || rows.len() < n * row_bytes
            || !available()
        {
            return;
        }
        let n_blocks = row_bytes / Q8_K_BYTES;
        self.slots.clear();
        self.slots.resize(n_blocks * n * SLOT, 0);
        self.dx.clear();
        self.dx.resize(n_blocks * n, 0.0);
        for t in 0..n {
            for b in 0..n_blocks {
                let at = t * row_bytes + b * Q8_K_BYTES;
                let xb = &rows[at..at + Q8_K_BYTES];
                let slot = b * n + t;
                self.dx[slot] = read_f32(xb, 0);
                let out = &mut self.slots[slot * SLOT..(slot + 1) * SLOT];
                // SAFETY: `available` was checked above; `xb` is a whole Q8_K block and
                // `out` a whole slot.
                unsafe { regroup_block(xb, out) };
            }
        }
        self.n_tokens = n;
        self.n_blocks = n_blocks;
    }
}

/// One Q8_K block into one slot: each 64 quants as the register pair of
/// [`pair_vectors`], then the `bsums`, then the 32-quant sums.
///
/// # Safety
/// The CPU has AVX2; `xb` is a whole Q8_K block, `out` a whole slot.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn regroup_block(xb: &[u8], out: &mut [u8]) {
    assert!(xb.len() >= Q8_K_BYTES && out.len() >= SLOT);
    let dst = out.as_mut_ptr();
    // SAFETY: the loads lie inside the Q8_K block and the stores inside the slot
    // (asserted above).
    unsafe {
        for c in 0..4 {
            let x0 = load32(xb, q8_k::QS + 64 * c);
            let x1 = load32(xb, q8_k::QS + 64 * c + 32);
            let (a, b) = pair_vectors(x0, x1);
            _mm256_storeu_si256(dst.add(64 * c) as *mut __m256i, a);
            _mm256_storeu_si256(dst.add(64 * c + 32) as *mut __m256i, b);
        }
        let bsums = load32(xb, q8_k::BSUMS);
        _mm256_storeu_si256(dst.add(SLOT_BSUMS) as *mut __m256i, bsums);
        _mm_storeu_si128(
            dst.add(SLOT_SUB_SUMS) as *mut __m128i,
            k4_sub_block_sums(xb),
        );
    }
}

/// Two 32-byte vectors `v`, `w` regrouped by words: dword `l` of the first result is
/// `v[4l], v[4l+1], w[4l], w[4l+1]`, of the second `v[4l+2], v[4l+3], w[4l+2], w[4l+3]`.
/// The same for weights and activations, so byte `i` of one meets byte `i` of the other.
#[inline(always)]
unsafe fn pair_vectors(v: __m256i, w: __m256i) -> (__m256i, __m256i) {
    // SAFETY: the caller runs with AVX2 (every user is an AVX2 `target_feature` fn).
    unsafe {
        (
            _mm256_blend_epi16::<0xAA>(v, _mm256_slli_epi32::<16>(w)),
            _mm256_blend_epi16::<0xAA>(_mm256_srli_epi32::<16>(v), w),
        )
    }
}

/// The i32 lanes `s_v·quad_l(v) + s_{v+1}·quad_l(v+1)` of one regrouped weight pair
/// (`wa`, `wb`) and scale pairs `scales` against the 64 regrouped activation bytes at
/// `x`, added to `sum`.
///
/// # Safety
/// The CPU has AVX2; `x` is valid for 64 bytes of reads.
#[inline(always)]
unsafe fn pair_dot(
    sum: __m256i,
    wa: __m256i,
    wb: __m256i,
    scales: __m256i,
    x: *const u8,
) -> __m256i {
    // SAFETY: the contract.
    unsafe {
        let xa = _mm256_loadu_si256(x as *const __m256i);
        let xb = _mm256_loadu_si256(x.add(32) as *const __m256i);
        // Each pair sum is at most 2·63·128 and their sum 4·63·128 < 2^15: no wrap.
        let quads = _mm256_add_epi16(_mm256_maddubs_epi16(wa, xa), _mm256_maddubs_epi16(wb, xb));
        _mm256_add_epi32(sum, _mm256_madd_epi16(quads, scales))
    }
}

/// Zero, as a value the compiler cannot know until every sum in `sums` is computed. Each
/// 64-quant step offsets its loads (weights and activations) by the zero from the
/// step before's sums: without that LLVM hoists every step's loads and products of a
/// super-block (all tokens, all four steps) to its start and spills most of them to the
/// stack. The `asm` blocks are empty (no instruction, no memory access); as blocks with
/// side effects they keep their order, so the zero comes after all the sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn zero_after<const N: usize>(sums: &mut [__m256i; N]) -> usize {
    let mut zero = 0usize;
    // SAFETY: empty instruction sequences; every operand comes back unchanged.
    unsafe {
        for sum in sums.iter_mut() {
            std::arch::asm!(
                "/* {s} */",
                s = inout(ymm_reg) * sum,
                options(nomem, nostack, preserves_flags)
            );
        }
        std::arch::asm!("/* {z} */", z = inout(reg) zero, options(nomem, nostack, preserves_flags));
    }
    zero
}

/// Weight types the group kernels of this module take (with Q8_K activations).
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    matches!(
        weight_type,
        GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K
    )
}

/// True when this CPU has the group kernels' features.
pub(crate) fn available() -> bool {
    crate::avx2::available()
}

/// For every token of `acts` and every row of `w_rows` (`row_bytes` each, of
/// `weight_type`), the dot product with the single-token kernel's bits, written for row
/// `r`, token `t` to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`available`] and [`has_kernel`] must be true, `acts` built from Q8_K activations of
/// the weight's row length; `out_ptr` must be valid for writes at every such index, with
/// no other thread accessing them during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &KGroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if acts.n_tokens == 0 || row_bytes == 0 || w_rows.len() < row_bytes {
        return;
    }
    let kind = match weight_type {
        GgmlType::Q4_K => Kind::Q4K,
        GgmlType::Q5_K => Kind::Q5K,
        GgmlType::Q6_K => Kind::Q6K,
        _ => return,
    };
    // SAFETY: the caller's contract.
    unsafe { run_kind(kind, w_rows, row_bytes, acts, out_ptr, out_stride) }
}

/// The formats of this module.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Q4K,
    Q5K,
    Q6K,
}

impl Kind {
    fn block_bytes(self) -> usize {
        match self {
            Kind::Q4K => Q4_K_BYTES,
            Kind::Q5K => Q5_K_BYTES,
            Kind::Q6K => Q6_K_BYTES,
        }
    }
}

/// One weight super-block widened for the token loops: the regrouped weight pair and
/// the scale pairs of each of its four 64-quant steps ([`pair_dot`]'s operands), the
/// words of the min term (Q4_K, Q5_K: the eight mins) or of the bsum term (Q6_K: the
/// sixteen scales), `d_w` and `−dmin_w` (Q4_K, Q5_K).
#[derive(Clone, Copy)]
#[repr(C)]
struct WideBlock {
    steps: [[__m256i; 2]; 4],
    scales: [__m256i; 4],
    extra: __m256i,
    d: f32,
    neg_dmin: f32,
}

/// Bytes of widened super-blocks one pass keeps for every group of tokens, in L1 and L2
/// beside a group's activations: rows of the 1536-wide Qwen2.5-1.5B shapes sixteen at a
/// time (6 super-blocks of 448 bytes each), the 8960-wide down projection's three.
const WIDENED_BYTES: usize = 48 * 1024;

thread_local! {
    /// Each thread's widened weight rows.
    static WIDENED: RefCell<Vec<WideBlock>> = const { RefCell::new(Vec::new()) };
}

/// [`run`] for one format: rows widened ([`WideBlock`]) a few at a time, then every
/// group of tokens against them. Widening a super-block costs about as much vector work as
/// two tokens' products; with several groups it is done once for all of them.
///
/// # Safety
/// As [`run`].
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_kind(
    kind: Kind,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &KGroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if acts.n_tokens <= GROUP {
        // SAFETY: the caller's contract.
        return unsafe { run_stored(kind, w_rows, row_bytes, acts, out_ptr, out_stride) };
    }
    let n_blocks = acts.n_blocks;
    assert!(row_bytes >= n_blocks * kind.block_bytes());
    let n_rows = w_rows.len() / row_bytes;
    let rows_per_pass = (WIDENED_BYTES / (n_blocks * size_of::<WideBlock>()).max(1)).clamp(1, 16);
    WIDENED.with(|cell| {
        let wide = &mut *cell.borrow_mut();
        for r0 in (0..n_rows).step_by(rows_per_pass) {
            let n_here = rows_per_pass.min(n_rows - r0);
            wide.clear();
            for row in w_rows[r0 * row_bytes..(r0 + n_here) * row_bytes].chunks_exact(row_bytes) {
                for b in 0..n_blocks {
                    let at = b * kind.block_bytes();
                    prefetch_ahead(row, at);
                    let wb = &row[at..at + kind.block_bytes()];
                    // SAFETY: the CPU features per the caller's contract; a whole block.
                    wide.push(unsafe {
                        match kind {
                            Kind::Q4K => widen_q4_k::<false>(wb),
                            Kind::Q5K => widen_q4_k::<true>(wb),
                            Kind::Q6K => widen_q6_k(wb),
                        }
                    });
                }
            }
            for g0 in (0..acts.n_tokens).step_by(GROUP) {
                let args = (&wide[..], acts, g0);
                // SAFETY: the caller's contract; token `g0 + t` of row `r0 + r` goes to
                // `out[(g0 + t)·stride + r0 + r]`.
                unsafe {
                    let out = out_ptr.add(g0 * out_stride + r0);
                    match (kind, GROUP.min(acts.n_tokens - g0)) {
                        (Kind::Q4K, n) => counts::<{ Kind::Q4K as u8 }>(n, args, out, out_stride),
                        (Kind::Q5K, n) => counts::<{ Kind::Q5K as u8 }>(n, args, out, out_stride),
                        (Kind::Q6K, n) => counts::<{ Kind::Q6K as u8 }>(n, args, out, out_stride),
                    }
                }
            }
        }
    });
}

/// [`run`] for one group of tokens (a batched decode step, a draft verification): each
/// row read once, so each super-block is regrouped in registers as the tokens need it.
/// (Widened through memory, one row at a time, Q4_K / Q6_K 2048×640 took 61 / 54 µs for
/// two tokens instead of 34 / 37: `benches/batched`, `NX_TIER=avx2`.)
///
/// # Safety
/// As [`run`], with `acts.n_tokens() <= GROUP`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_stored(
    kind: Kind,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &KGroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    let args = (w_rows, row_bytes, acts, 0);
    macro_rules! counts {
        ($kernel:ident $(, $kind:tt)?) => {
            // SAFETY: the caller's contract; token `t` of row `r` goes to
            // `out[t·stride + r]`.
            unsafe {
                match acts.n_tokens {
                    1 => $kernel::<1 $(, $kind)?>(args, out_ptr, out_stride),
                    2 => $kernel::<2 $(, $kind)?>(args, out_ptr, out_stride),
                    3 => $kernel::<3 $(, $kind)?>(args, out_ptr, out_stride),
                    4 => $kernel::<4 $(, $kind)?>(args, out_ptr, out_stride),
                    5 => $kernel::<5 $(, $kind)?>(args, out_ptr, out_stride),
                    6 => $kernel::<6 $(, $kind)?>(args, out_ptr, out_stride),
                    7 => $kernel::<7 $(, $kind)?>(args, out_ptr, out_stride),
                    _ => $kernel::<8 $(, $kind)?>(args, out_ptr, out_stride),
                }
            }
        };
    }
    match kind {
        Kind::Q4K => counts!(q4_k_stored, { Kind::Q4K as u8 }),
        Kind::Q5K => counts!(q4_k_stored, { Kind::Q5K as u8 }),
        Kind::Q6K => counts!(q6_k_stored),
    }
}

/// [`group`] for `count` tokens.
///
/// # Safety
/// As [`group`].
#[inline(always)]
unsafe fn counts<const KIND: u8>(
    count: usize,
    args: GroupArgs<'_>,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        match count {
            1 => group::<1, KIND>(args, out, out_stride),
            2 => group::<2, KIND>(args, out, out_stride),
            3 => group::<3, KIND>(args, out, out_stride),
            4 => group::<4, KIND>(args, out, out_stride),
            5 => group::<5, KIND>(args, out, out_stride),
            6 => group::<6, KIND>(args, out, out_stride),
            7 => group::<7, KIND>(args, out, out_stride),
            _ => group::<8, KIND>(args, out, out_stride),
        }
    }
}

/// What every group kernel takes: the widened rows (whole rows of the activations'
/// super-block count), the activations and the group's first token.
type GroupArgs<'a> = (&'a [WideBlock], &'a KGroupActs, usize);

/// `weight_scale·d_x` for tokens `g0..g0 + N` of block `b` (same products as a scalar
/// multiply per token), stored for broadcast loads.
///
/// # Safety
/// The CPU has AVX2; `b·n + g0 + N <= dx.len()`, `N <= GROUP`.
#[inline(always)]
unsafe fn scale_products<const N: usize>(weight_scale: __m256, dx: &[f32], out: &mut [f32; GROUP]) {
    let mut lanes = [0.0f32; GROUP];
    lanes[..N].copy_from_slice(&dx[..N]);
    // SAFETY: AVX2 by the contract; `lanes` and `out` hold eight f32.
    unsafe {
        let products = _mm256_mul_ps(weight_scale, _mm256_loadu_ps(lanes.as_ptr()));
        _mm256_storeu_ps(out.as_mut_ptr(), products);
    }
}

/// The float chains of one weight row against a group's `N` tokens, as the single-token
/// K kernels keep them: eight lanes per token (`d_w·d_x` times the super-block's lane
/// integers), and Q4_K's four min lanes or Q5_K's one min chain (`−d_x·dmin_w` times the
/// mins against the token's sub-block sums); Q6_K has no min term, its `−32` offset is
/// taken off the lane integers.
struct RowChains<const N: usize> {
    acc: [__m256; N],
    acc_min: [__m128; N],
    summs: [f32; N],
}

impl<const N: usize> RowChains<N> {
    /// Every chain at `+0`.
    ///
    /// # Safety
    /// The CPU has AVX2 (only inlined into functions enabling it).
    #[inline(always)]
    unsafe fn new() -> Self {
        // SAFETY: AVX2 by the contract.
        unsafe {
            RowChains {
                acc: [_mm256_setzero_ps(); N],
                acc_min: [_mm_setzero_ps(); N],
                summs: [0.0; N],
            }
        }
    }

    /// Adds one super-block of `KIND`: the tokens' lane integers `sumi`, their slots from
    /// `x0`, `extra` the weight's Q6_K scales as words (for the bsums offset) or Q4_K /
    /// Q5_K mins as words in the low half, `d` and `neg_dmin` the tokens' `d_w·d_x` and
    /// `−d_x·dmin_w` ([`scale_products`]).
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA (only inlined into functions enabling them); `x0` is
    /// valid for `N` slots.
    #[inline(always)]
    unsafe fn add_block<const KIND: u8>(
        &mut self,
        sumi: &[__m256i; N],
        x0: *const u8,
        extra: __m256i,
        (d, neg_dmin): (&[f32; GROUP], &[f32; GROUP]),
    ) {
        for t in 0..N {
            // SAFETY (both loads): token t's slot lies at `x0 + t·SLOT` (the contract).
            let lanes = if KIND == Kind::Q6K as u8 {
                let bsums =
                    unsafe { _mm256_loadu_si256(x0.add(t * SLOT + SLOT_BSUMS) as *const __m256i) };
                let offset = _mm256_slli_epi32::<5>(_mm256_madd_epi16(bsums, extra));
                _mm256_sub_epi32(sumi[t], offset)
            } else {
                let sub_sums =
                    unsafe { _mm_loadu_si128(x0.add(t * SLOT + SLOT_SUB_SUMS) as *const __m128i) };
                let min_lanes = _mm_madd_epi16(sub_sums, _mm256_castsi256_si128(extra));
                if KIND == Kind::Q5K as u8 {
                    self.summs[t] =
                        neg_dmin[t].mul_add(hsum_epi32(min_lanes) as f32, self.summs[t]);
                } else {
                    self.acc_min[t] = _mm_fmadd_ps(
                        _mm_broadcast_ss(&neg_dmin[t]),
                        _mm_cvtepi32_ps(min_lanes),
                        self.acc_min[t],
                    );
                }
                sumi[t]
            };
            self.acc[t] = _mm256_fmadd_ps(
                _mm256_broadcast_ss(&d[t]),
                _mm256_cvtepi32_ps(lanes),
                self.acc[t],
            );
        }
    }

    /// Writes each token's output of row `r` to `out[t·out_stride + r]`: the lanes
    /// summed, plus the min term, as the single-token kernels finish.
    ///
    /// # Safety
    /// The CPU has AVX2 (only inlined into functions enabling it); `out` is valid for
    /// those writes.
    #[inline(always)]
    unsafe fn store<const KIND: u8>(&self, out: *mut f32, out_stride: usize, r: usize) {
        for t in 0..N {
            // SAFETY: AVX2 by the contract.
            let lanes = unsafe { hsum_ps(self.acc[t]) };
            let y = match KIND {
                k if k == Kind::Q4K as u8 => lanes + unsafe { hsum4_ps(self.acc_min[t]) },
                k if k == Kind::Q5K as u8 => lanes + self.summs[t],
                _ => lanes,
            };
            // SAFETY: the caller's contract on `out`.
            unsafe { *out.add(t * out_stride + r) = y };
        }
    }
}

/// `d_w·d_x` into `d` and, but for Q6_K, `−d_x·dmin_w` into `neg_dmin` for the `N` token
/// scales `dx` ([`scale_products`]), passed on through [`std::hint::black_box`] so the
/// products stay in memory for broadcast loads (else LLVM rebuilds each broadcast from
/// the register with shuffles).
///
/// # Safety
/// The CPU has AVX2 (only inlined into functions enabling it); `dx` holds `N <= GROUP`
/// scales.
#[inline(always)]
unsafe fn block_scales<'a, const N: usize, const KIND: u8>(
    (d_w, neg_dmin_w): (__m256, __m256),
    dx: &[f32],
    d: &'a mut [f32; GROUP],
    neg_dmin: &'a mut [f32; GROUP],
) -> (&'a [f32; GROUP], &'a [f32; GROUP]) {
    // SAFETY: the contract.
    unsafe {
        scale_products::<N>(d_w, dx, d);
        if KIND != Kind::Q6K as u8 {
            scale_products::<N>(neg_dmin_w, dx, neg_dmin);
        }
    }
    (std::hint::black_box(d), std::hint::black_box(neg_dmin))
}

/// What the stored-row kernels take: the weight rows as stored, their bytes per row, the
/// activations and the group's first token.
type StoredArgs<'a> = (&'a [u8], usize, &'a KGroupActs, usize);

/// Checks the layout against the weight rows and returns `(n_tokens, n_blocks)`.
fn checked_shape<const N: usize>(
    (w, row_bytes, acts, g0): StoredArgs<'_>,
    block_bytes: usize,
) -> (usize, usize) {
    let (n, n_blocks) = (acts.n_tokens, acts.n_blocks);
    assert!(g0 + N <= n && row_bytes >= n_blocks * block_bytes && w.len() >= row_bytes);
    assert!(acts.slots.len() >= n_blocks * n * SLOT && acts.dx.len() >= n_blocks * n);
    (n, n_blocks)
}

/// Q4_K rows (Q5_K when `KIND` is Q5_K's) against tokens `g0..g0 + N`: row `r`, token `g0 + t` to
/// `out[t·out_stride + r]`. Same integers and float chains as `avx2::q4_k_impl` (and
/// `avx2::q5_k_impl`, whose min term is one scalar chain instead of four lanes).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` is valid for those writes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k_stored<const N: usize, const KIND: u8>(
    args: StoredArgs<'_>,
    out: *mut f32,
    out_stride: usize,
) {
    let (w, row_bytes, acts, g0) = args;
    let five = KIND == Kind::Q5K as u8;
    let block_bytes = if five { Q5_K_BYTES } else { Q4_K_BYTES };
    let quants = if five { q4_k::Q5_QS } else { q4_k::QS };
    let (n, n_blocks) = checked_shape::<N>(args, block_bytes);
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let slots = acts.slots.as_ptr();
    let mut d = [0.0f32; GROUP];
    let mut neg_dmin = [0.0f32; GROUP];
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        // SAFETY: AVX2 (this function's features).
        let mut chains = unsafe { RowChains::<N>::new() };
        for b in 0..n_blocks {
            prefetch_ahead(row, b * block_bytes);
            let wb = &row[b * block_bytes..(b + 1) * block_bytes];
            let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
            let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
            // Dword `c`: the scale pair of sub-blocks 2c, 2c+1.
            let scales = _mm256_set_m128i(sc16, sc16);
            let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
            // The fifth bits (Q5_K): bits 2c, 2c+1 of each byte for chunk c.
            // SAFETY: qh is bytes 16..48 of 176.
            let mut qh = if five {
                unsafe { load32(wb, q4_k::Q5_QH) }
            } else {
                low4
            };
            // SAFETY: slot b·n + g0 + N ≤ n_blocks·n (checked_shape).
            let x0 = unsafe { slots.add((b * n + g0) * SLOT) };
            let mut sumi = [_mm256_setzero_si256(); N];
            macro_rules! chunk {
                ($c:literal, $imm:literal) => {
                    let z = zero_after(&mut sumi);
                    // SAFETY: quants chunk is bytes 32c..32c+32 of the quants (z is 0).
                    let qs = unsafe { load32(wb, quants + 32 * $c + z) };
                    let mut lo = _mm256_and_si256(qs, low4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4);
                    if five {
                        lo =
                            _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4));
                        hi =
                            _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4));
                        qh = _mm256_srli_epi16::<2>(qh);
                    }
                    // SAFETY: AVX2 (this function's features).
                    let (wa, wb2) = unsafe { pair_vectors(lo, hi) };
                    let pair = _mm256_shuffle_epi32::<$imm>(scales);
                    // SAFETY: inside the slots (checked_shape; z is 0).
                    let xc = unsafe { x0.add(64 * $c + z) };
                    for (t, sum) in sumi.iter_mut().enumerate() {
                        // SAFETY: 64 bytes of token g0 + t's slot.
                        *sum = unsafe { pair_dot(*sum, wa, wb2, pair, xc.add(t * SLOT)) };
                    }
                };
            }
            chunk!(0, 0x00);
            chunk!(1, 0x55);
            chunk!(2, 0xAA);
            chunk!(3, 0xFF);
            let _ = qh;
            let dx = &acts.dx[b * n + g0..b * n + g0 + N];
            // −d_x·dmin_w, as the single-token kernel forms it (a negation is exact).
            let neg_dmin_w = _mm256_xor_ps(f16_splat(wb, q4_k::DMIN), _mm256_set1_ps(-0.0));
            // SAFETY: AVX2; `dx` holds N ≤ GROUP scales; N slots from `x0`.
            unsafe {
                let scales = (f16_splat(wb, 0), neg_dmin_w);
                let products = block_scales::<N, KIND>(scales, dx, &mut d, &mut neg_dmin);
                chains.add_block::<KIND>(&sumi, x0, _mm256_castsi128_si256(mins), products);
            }
        }
        // SAFETY: the caller's contract on `out`.
        unsafe { chains.store::<KIND>(out, out_stride, r) };
    }
}

/// Q6_K rows against tokens `g0..g0 + N`: row `r`, token `g0 + t` to
/// `out[t·out_stride + r]`. Same integers and float chain as `avx2::q6_k_impl`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` is valid for those writes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k_stored<const N: usize>(args: StoredArgs<'_>, out: *mut f32, out_stride: usize) {
    let (w, row_bytes, acts, g0) = args;
    let (n, n_blocks) = checked_shape::<N>(args, Q6_K_BYTES);
    // The scale pairs of 32-quant vectors k, k+1 (k even) of a half: lanes 0..4 take
    // their first 16 quants' scales (words 2k, 2k+2 of the half's eight), lanes 4..8
    // their last 16's (words 2k+1, 2k+3).
    let pair_ctrl = |k: i8| {
        let (a, b) = (4 * k, 4 * k + 4);
        let lo = [a, a + 1, b, b + 1];
        let hi = [a + 2, a + 3, b + 2, b + 3];
        _mm256_setr_epi8(
            lo[0], lo[1], lo[2], lo[3], lo[0], lo[1], lo[2], lo[3], lo[0], lo[1], lo[2], lo[3],
            lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3], hi[0], hi[1], hi[2], hi[3],
            hi[0], hi[1], hi[2], hi[3], hi[0], hi[1], hi[2], hi[3],
        )
    };
    let (ctrl0, ctrl2) = (pair_ctrl(0), pair_ctrl(2));
    let slots = acts.slots.as_ptr();
    const Q6K: u8 = Kind::Q6K as u8;
    let (mut d, mut unused) = ([0.0f32; GROUP], [0.0f32; GROUP]);
    for (r, row) in w.chunks_exact(row_bytes).enumerate() {
        // SAFETY: AVX2 (this function's features).
        let mut chains = unsafe { RowChains::<N>::new() };
        for b in 0..n_blocks {
            prefetch_ahead(row, b * Q6_K_BYTES);
            let wb = &row[b * Q6_K_BYTES..(b + 1) * Q6_K_BYTES];
            // SAFETY: scales are bytes 192..208 of 210.
            let sc16 = _mm256_cvtepi8_epi16(unsafe { load16(wb, q6_k::SCALES) });
            // SAFETY: slot b·n + g0 + N ≤ n_blocks·n (checked_shape).
            let x0 = unsafe { slots.add((b * n + g0) * SLOT) };
            let mut sumi = [_mm256_setzero_si256(); N];
            for half in 0..2 {
                let sc_both = q6_k_half_scales(sc16, half);
                // Quants 0..32, 32..64 of this half (vectors 0, 1), then 64..128 (2, 3).
                // SAFETY: a whole super-block.
                let [q0, q1, q2, q3] = unsafe { q6_k_half_levels(wb, half) };
                macro_rules! pair {
                    ($va:expr, $vb:expr, $ctrl:expr, $pair:literal) => {
                        // SAFETY: AVX2 (this function's features).
                        let (wa, wb2) = unsafe { pair_vectors($va, $vb) };
                        let scales = _mm256_shuffle_epi8(sc_both, $ctrl);
                        let z = zero_after(&mut sumi);
                        // SAFETY: inside the slots (checked_shape; z is 0).
                        let xc = unsafe { x0.add(64 * (2 * half + $pair) + z) };
                        for (t, sum) in sumi.iter_mut().enumerate() {
                            // SAFETY: 64 bytes of token g0 + t's slot.
                            *sum = unsafe { pair_dot(*sum, wa, wb2, scales, xc.add(t * SLOT)) };
                        }
                    };
                }
                pair!(q0, q1, ctrl0, 0);
                pair!(q2, q3, ctrl2, 1);
            }
            let dx = &acts.dx[b * n + g0..b * n + g0 + N];
            // SAFETY: AVX2; `dx` holds N ≤ GROUP scales; N slots from `x0`.
            unsafe {
                let scales = (f16_splat(wb, q6_k::D), _mm256_setzero_ps());
                let products = block_scales::<N, Q6K>(scales, dx, &mut d, &mut unused);
                chains.add_block::<Q6K>(&sumi, x0, sc16, products);
            }
        }
        // SAFETY: the caller's contract on `out`.
        unsafe { chains.store::<Q6K>(out, out_stride, r) };
    }
}

/// A Q4_K super-block (Q5_K when `FIVE`) widened: the quants of each 64-quant step (the
/// low nibbles its first 32, the high ones its second, Q5_K's fifth bits added) regrouped
/// by [`pair_vectors`], each step's scale pair in every dword, the mins as words.
///
/// # Safety
/// The CPU has AVX2 and F16C; `wb` is a whole block.
#[inline(always)]
unsafe fn widen_q4_k<const FIVE: bool>(wb: &[u8]) -> WideBlock {
    let quants = if FIVE { q4_k::Q5_QS } else { q4_k::QS };
    let low4 = _mm256_set1_epi8(0x0F);
    let bit4 = _mm256_set1_epi8(0x10);
    let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
    // SAFETY: the CPU features per the contract; every load lies inside the block.
    unsafe {
        let sc16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        // Dword `c`: the scale pair of sub-blocks 2c, 2c+1.
        let scales = _mm256_set_m128i(sc16, sc16);
        let mins = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
        // The fifth bits (Q5_K): bits 2c, 2c+1 of each byte for step c.
        let mut qh = if FIVE { load32(wb, q4_k::Q5_QH) } else { low4 };
        let mut steps = [[_mm256_setzero_si256(); 2]; 4];
        for (c, step) in steps.iter_mut().enumerate() {
            let qs = load32(wb, quants + 32 * c);
            let mut lo = _mm256_and_si256(qs, low4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(qs), low4);
            if FIVE {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(qh), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<3>(qh), bit4));
                qh = _mm256_srli_epi16::<2>(qh);
            }
            let (a, b) = pair_vectors(lo, hi);
            *step = [a, b];
        }
        let dmin_w = f16_splat(wb, q4_k::DMIN);
        WideBlock {
            steps,
            scales: [
                _mm256_shuffle_epi32::<0x00>(scales),
                _mm256_shuffle_epi32::<0x55>(scales),
                _mm256_shuffle_epi32::<0xAA>(scales),
                _mm256_shuffle_epi32::<0xFF>(scales),
            ],
            extra: _mm256_castsi128_si256(mins),
            d: _mm256_cvtss_f32(f16_splat(wb, 0)),
            // −dmin_w, as the single-token kernel forms it (a negation is exact).
            neg_dmin: -_mm256_cvtss_f32(dmin_w),
        }
    }
}

/// A Q6_K super-block widened: each half's quants `0..32`, `32..64` (one step) and
/// `64..96`, `96..128` (the next) regrouped by [`pair_vectors`], each step's scales (lanes
/// 0..4 its two vectors' first 16 quants' scales, lanes 4..8 their last 16's), the
/// sixteen scales as words.
///
/// # Safety
/// The CPU has AVX2 and F16C; `wb` is a whole block.
#[inline(always)]
unsafe fn widen_q6_k(wb: &[u8]) -> WideBlock {
    // The scale pairs of 32-quant vectors k, k+1 (k even) of a half: lanes 0..4 take
    // their first 16 quants' scales (words 2k, 2k+2 of the half's eight), lanes 4..8
    // their last 16's (words 2k+1, 2k+3).
    let pair_ctrl = |k: i8| {
        let (a, b) = (4 * k, 4 * k + 4);
        let lo = [a, a + 1, b, b + 1];
        let hi = [a + 2, a + 3, b + 2, b + 3];
        // SAFETY: AVX (a register constant).
        unsafe {
            _mm256_setr_epi8(
                lo[0], lo[1], lo[2], lo[3], lo[0], lo[1], lo[2], lo[3], lo[0], lo[1], lo[2], lo[3],
                lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3], hi[0], hi[1], hi[2], hi[3],
                hi[0], hi[1], hi[2], hi[3], hi[0], hi[1], hi[2], hi[3],
            )
        }
    };
    let ctrl = [pair_ctrl(0), pair_ctrl(2)];
    // SAFETY: the CPU features per the contract; every load lies inside the block.
    unsafe {
        let sc16 = _mm256_cvtepi8_epi16(load16(wb, q6_k::SCALES));
        let mut steps = [[_mm256_setzero_si256(); 2]; 4];
        let mut scales = [_mm256_setzero_si256(); 4];
        for half in 0..2 {
            let sc_both = q6_k_half_scales(sc16, half);
            // Quants 0..32, 32..64 of this half (vectors 0, 1), then 64..128 (2, 3).
            let [q0, q1, q2, q3] = q6_k_half_levels(wb, half);
            for (pair, (va, vb)) in [(q0, q1), (q2, q3)].into_iter().enumerate() {
                let (a, b) = pair_vectors(va, vb);
                steps[2 * half + pair] = [a, b];
                scales[2 * half + pair] = _mm256_shuffle_epi8(sc_both, ctrl[pair]);
            }
        }
        WideBlock {
            steps,
            scales,
            extra: sc16,
            d: _mm256_cvtss_f32(f16_splat(wb, q6_k::D)),
            neg_dmin: 0.0,
        }
    }
}

/// The lane integers of one widened super-block against the `N` token slots from `x0`:
/// the four 64-quant steps' [`pair_dot`]s.
///
/// # Safety
/// The CPU has AVX2 (only inlined into functions enabling it); `x0` is valid for `N`
/// slots.
#[inline(always)]
unsafe fn block_sums<const N: usize>(wk: &WideBlock, x0: *const u8) -> [__m256i; N] {
    let wk: *const WideBlock = wk;
    let mut sumi = [_mm256_setzero_si256(); N];
    for c in 0..4 {
        let z = zero_after(&mut sumi);
        // SAFETY: step `c` of the widened block and 64 bytes of each token's slot (z is 0).
        unsafe {
            let wk = &*(wk as *const u8).add(z).cast::<WideBlock>();
            let [wa, wb] = wk.steps[c];
            let xc = x0.add(64 * c + z);
            for (t, sum) in sumi.iter_mut().enumerate() {
                *sum = pair_dot(*sum, wa, wb, wk.scales[c], xc.add(t * SLOT));
            }
        }
    }
    sumi
}

/// Widened rows (`args.0`) against tokens `g0..g0 + N`: row `r`, token `g0 + t` to
/// `out[t·out_stride + r]`. Same integers and float chains as `avx2::q4_k_impl`,
/// `avx2::q5_k_impl` (whose min term is one scalar chain instead of four lanes) and
/// `avx2::q6_k_impl`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `out` is valid for those writes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const N: usize, const KIND: u8>(
    (wide, acts, g0): GroupArgs<'_>,
    out: *mut f32,
    out_stride: usize,
) {
    let (n, n_blocks) = (acts.n_tokens, acts.n_blocks);
    assert!(g0 + N <= n && n_blocks > 0 && wide.len().is_multiple_of(n_blocks));
    assert!(acts.slots.len() >= n_blocks * n * SLOT && acts.dx.len() >= n_blocks * n);
    let slots = acts.slots.as_ptr();
    let mut d = [0.0f32; GROUP];
    let mut neg_dmin = [0.0f32; GROUP];
    for (r, row) in wide.chunks_exact(n_blocks).enumerate() {
        // SAFETY: AVX2 (this function's features).
        let mut chains = unsafe { RowChains::<N>::new() };
        for (b, wk) in row.iter().enumerate() {
            // SAFETY: slot b·n + g0 + N ≤ n_blocks·n (asserted).
            let x0 = unsafe { slots.add((b * n + g0) * SLOT) };
            // SAFETY: the CPU features per the contract; N slots from `x0` (asserted).
            let sumi = unsafe { block_sums::<N>(wk, x0) };
            let dx = &acts.dx[b * n + g0..b * n + g0 + N];
            // SAFETY: AVX2; `dx` holds N ≤ GROUP scales; N slots from `x0`.
            unsafe {
                let scales = (_mm256_set1_ps(wk.d), _mm256_set1_ps(wk.neg_dmin));
                let products = block_scales::<N, KIND>(scales, dx, &mut d, &mut neg_dmin);
                chains.add_block::<KIND>(&sumi, x0, wk.extra, products);
            }
        }
        // SAFETY: the caller's contract on `out`.
        unsafe { chains.store::<KIND>(out, out_stride, r) };
    }
}

/// The f16 at `bytes[offset..]` splatted as f32 (F16C).
#[inline(always)]
fn f16_splat(bytes: &[u8], offset: usize) -> __m256 {
    let bits = u16::from_le_bytes([bytes[offset], bytes[offset + 1]]);
    // SAFETY: every caller is a `target_feature(enable = "avx2,fma,f16c")` function.
    unsafe { _mm256_cvtph_ps(_mm_set1_epi16(bits as i16)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_widened_super_block_is_the_size_the_pass_budget_assumes() {
        // `WIDENED_BYTES`' row counts are worked out for 448-byte blocks.
        assert_eq!(size_of::<WideBlock>(), 448);
        assert_eq!(WIDENED_BYTES / (6 * 448), 18);
        assert_eq!(WIDENED_BYTES / (35 * 448), 3);
    }

    #[test]
    fn build_pairs_each_sixty_four_quants_by_words() {
        if !available() {
            return;
        }
        // Two tokens of one block: token t's quant k is (t·7 + k) as i8, d_x = t + 1.
        let mut rows = vec![0u8; 2 * Q8_K_BYTES];
        for t in 0..2 {
            let xb = &mut rows[t * Q8_K_BYTES..(t + 1) * Q8_K_BYTES];
            xb[..4].copy_from_slice(&(t as f32 + 1.0).to_le_bytes());
            for k in 0..256 {
                xb[q8_k::QS + k] = (t * 7 + k) as u8;
            }
            for j in 0..16 {
                let s: i16 = (0..16)
                    .map(|i| xb[q8_k::QS + 16 * j + i] as i8 as i16)
                    .sum();
                xb[q8_k::BSUMS + 2 * j..q8_k::BSUMS + 2 * j + 2].copy_from_slice(&s.to_le_bytes());
            }
        }
        let mut g = KGroupActs::default();
        g.build(&rows, 2, Q8_K_BYTES);
        assert_eq!((g.n_tokens(), g.n_blocks), (2, 1));
        assert_eq!(g.dx, vec![1.0, 2.0]);
        let q = |t: usize, k: usize| (t * 7 + k) as u8;
        // Token 1 (slot 1), chunk 2 (quants 128..192): dword 3 of the first register is
        // quants 140, 141 | 172, 173; of the second 142, 143 | 174, 175.
        let s = &g.slots[SLOT + 128..SLOT + 192];
        assert_eq!(s[12..16], [q(1, 140), q(1, 141), q(1, 172), q(1, 173)]);
        assert_eq!(s[44..48], [q(1, 142), q(1, 143), q(1, 174), q(1, 175)]);
        // The 32-quant sums are the bsum pairs.
        let sums = &g.slots[SLOT + SLOT_SUB_SUMS..2 * SLOT];
        let bsum = |j: usize| {
            i16::from_le_bytes([
                rows[Q8_K_BYTES + q8_k::BSUMS + 2 * j],
                rows[Q8_K_BYTES + q8_k::BSUMS + 2 * j + 1],
            ])
        };
        assert_eq!(i16::from_le_bytes([sums[6], sums[7]]), bsum(6) + bsum(7));
        g.build(&rows, 1, Q8_K_BYTES);
        assert_eq!(g.n_tokens(), 0, "one token takes the single-token kernel");
    }
}
