//! Token groups for the AVX2 tier: up to eight Q8_0 tokens against each Q4_0 / Q5_0 /
//! Q8_0 weight block, for batched decode steps, draft verification and prefill.
//!
//! The single-token AVX2 kernel forms a block's eight lane integers (lane `l`: quants
//! `4l..4l+4`) and feeds them to one float chain. Most of its work is on the weight
//! side (decoding nibbles, widening to i16, the `hadd` and permute that put the pair
//! sums in lane order), and with several tokens that work is the same for all of them.
//! Here the weight block is decoded and widened once into two i16 registers — pairs
//! `(4l, 4l+1)` in one, `(4l+2, 4l+3)` in the other — and every token's activations
//! are laid out the same way once per step ([`GroupActs::build`]), so a token costs two
//! `madd`s and an add for its lane integers (exact: a product of two bytes and a sum of
//! two fit i32 for every byte value, −128 included), then the single-token kernel's own
//! `d_w·d_x`, FMA and final lane sum. Every output keeps the single-token kernel's bits.
//!
//! Where the CPU has AVX-VNNI (the VEX `vpdpbusd`) a token's lane integers are instead
//! one `vpdpbusd` of its quants as unsigned bytes (`x + 128`) and the block's signed
//! quants, started at the block's `−128·Σw` ([`group_vnni`]): the same integers from
//! half the activation bytes and a third of the integer work, and no widened copy of the
//! rows (`benches/batched` and `benches/prefill`, `NX_TIER=avx2`, Intel Xeon family 6
//! model 207: Q8_0 / Q5_0 640×2048 at 8 tokens 0.233 / 0.283 → 0.170 / 0.198 ms, at 16
//! 0.444 / 0.621 → 0.331 / 0.343; Q4_0 / Q5_0 / Q8_0 at 64 tokens 3.94 / 3.06 / 3.31 →
//! 2.34 / 2.60 / 2.29 ms).

use std::arch::x86_64::*;
use std::cell::{Cell, RefCell};

use nx_gguf::GgmlType;

use crate::avx2::{hsum_ps, prefetch_ahead};
use crate::block32_x86::{block_bytes, format_code, signed_quants, Q4_0, Q5_0, Q8_0};
use crate::formats::{f16_to_f32, Q8_0_BYTES};

/// Most tokens one pass over the weight rows takes (the accumulators of eight tokens
/// and the two weight registers fit the sixteen AVX2 registers).
pub(crate) const GROUP: usize = 8;

/// Bytes of one token's block: 32 i16.
const TOKEN_BLOCK: usize = 64;

/// Q8_0 activations widened to i16 in the lane-pair order of the module docs, and their
/// scales as f32, each at its token's and block's [`slot`].
#[derive(Debug, Clone, Default)]
pub(crate) struct GroupActs {
    quads: Vec<i16>,
    /// The same quants as unsigned bytes `x + 128` in their stored order, 32 per slot:
    /// what [`group_vnni`] reads (built where the CPU has AVX-VNNI).
    unsigned: Vec<u8>,
    dx: Vec<f32>,
    n_tokens: usize,
    n_blocks: usize,
}

impl GroupActs {
    /// Tokens held (0 when empty).
    pub(crate) fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    /// Forgets the contents (keeps the buffers).
    pub(crate) fn clear(&mut self) {
        self.n_tokens = 0;
        self.n_blocks = 0;
    }

    /// Lays out the `n` Q8_0 activation rows of `rows` (`row_bytes` each) for this CPU's
    /// group kernel; leaves nothing unless there are at least two whole rows of whole
    /// blocks.
    pub(crate) fn build(&mut self, rows: &[u8], n: usize, row_bytes: usize) {
        self.build_for(rows, (n, row_bytes), vnni_available());
    }

    /// [`GroupActs::build`] as unsigned bytes for [`group_vnni`] (`unsigned`) or widened
    /// for [`group`]: each kernel reads only its own layout.
    fn build_for(&mut self, rows: &[u8], (n, row_bytes): (usize, usize), unsigned: bool) {
        self.clear();
        if n < 2
            || row_bytes == 0
            || !row_bytes.is_multiple_of(Q8_0_BYTES)
            || rows.len() < n * row_bytes
        {
            return;
        }
        let n_blocks = row_bytes / Q8_0_BYTES;
        self.dx.clear();
        self.dx.resize(n_blocks * n, 0.0);
        self.quads.clear();
        self.unsigned.clear();
        if unsigned {
            self.unsigned.resize(n_blocks * n * 32, 0);
        } else {
            self.quads.resize(n_blocks * n * TOKEN_BLOCK / 2, 0);
        }
        for t in 0..n {
            for b in 0..n_blocks {
                let at = t * row_bytes + b * Q8_0_BYTES;
                let xb = &rows[at..at + Q8_0_BYTES];
                let slot = slot(n, n_blocks, t, b);
                self.dx[slot] = f16_to_f32(u16::from_le_bytes([xb[0], xb[1]]));
                if unsigned {
                    let out = &mut self.unsigned[slot * 32..slot * 32 + 32];
                    for (u, &q) in out.iter_mut().zip(&xb[2..]) {
                        *u = q ^ 0x80;
                    }
                    continue;
                }
                let out = &mut self.quads[slot * 32..slot * 32 + 32];
                for l in 0..8 {
                    let q = |k: usize| xb[2 + 4 * l + k] as i8 as i16;
                    out[2 * l] = q(0);
                    out[2 * l + 1] = q(1);
                    out[16 + 2 * l] = q(2);
                    out[16 + 2 * l + 1] = q(3);
                }
            }
        }
        self.n_tokens = n;
        self.n_blocks = n_blocks;
    }
}

/// Where token `t`'s block `b` of `n` tokens of `n_blocks` blocks lies in [`GroupActs`]:
/// group by group (the [`GROUP`] tokens one pass of [`group`] takes), then block by
/// block, then token by token, so that a pass reads one contiguous run. Laid out block by
/// block over all the tokens, a group's consecutive blocks lay `64·n` bytes apart (4 KiB
/// for 64 tokens, in the same L1 sets), and the passes over widened rows took 10 to 15 %
/// longer (`benches/prefill` Q4_0 / Q5_0 / Q8_0, `NX_TIER=avx2`, AMD EPYC family 25
/// model 17: 2.84 / 2.36 / 2.32 ms against 2.46 / 2.16 / 2.13).
fn slot(n: usize, n_blocks: usize, t: usize, b: usize) -> usize {
    let g0 = t / GROUP * GROUP;
    let count = GROUP.min(n - g0);
    g0 * n_blocks + b * count + (t - g0)
}

/// Weight types the group kernels take (with Q8_0 activations).
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    matches!(
        weight_type,
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0
    )
}

/// True when this CPU has the group kernels' features.
pub(crate) fn available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// True when this CPU also has AVX-VNNI (the VEX `vpdpbusd`: Intel's cores since Alder
/// Lake and Sapphire Rapids, AMD's since Zen 5): the groups then take [`group_vnni`].
pub(crate) fn vnni_available() -> bool {
    available() && std::arch::is_x86_feature_detected!("avxvnni")
}

/// For every token of `acts` and every row of `w_rows` (`row_bytes` each, of
/// `weight_type`), the dot product with the single-token kernel's bits, written for
/// row `r`, token `t` to `out_ptr[t·out_stride + r]`.
///
/// # Safety
/// [`available`] and [`has_kernel`] must be true, `acts` built from Q8_0 activations
/// of the weight's row length; `out_ptr` must be valid for writes at every such index,
/// with no other thread accessing them during the call.
pub(crate) unsafe fn run(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    acts: &GroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if acts.n_tokens == 0 || row_bytes == 0 || w_rows.len() < row_bytes {
        return;
    }
    // SAFETY (each arm): the caller's contract, the format matched.
    unsafe {
        match format_code(weight_type) {
            Some(Q8_0) => run_format::<Q8_0>(w_rows, row_bytes, acts, out_ptr, out_stride),
            Some(Q4_0) => run_format::<Q4_0>(w_rows, row_bytes, acts, out_ptr, out_stride),
            Some(Q5_0) => run_format::<Q5_0>(w_rows, row_bytes, acts, out_ptr, out_stride),
            _ => {}
        }
    }
}

/// Most tokens that read the weight rows as stored, widening each block once per group
/// of [`GROUP`]; more take [`WIDENED_ROWS`] rows widened once for all the groups. Two
/// groups (a sixteen-sequence decode step, a long draft verification) widen each block
/// twice and still come out ahead of the stores and reloads of a widened copy
/// (`lm_head_timing`, the Gemma 3 LM head at 16 rows, one thread, `NX_TIER=avx2`, AMD
/// EPYC family 25 model 17: 73.1-74.9 ms widened, 66.4-66.8 stored; `benches/batched`
/// Q4_0 / Q5_0 / Q8_0 640×2048 at 16 tokens: 0.354 / 0.376 / 0.352 ms widened, 0.314 /
/// 0.357 / 0.306 stored); from three groups on the widened copy pays.
const STORED_ROWS_UP_TO: usize = 2 * GROUP;

/// Weight rows widened at a time when several groups of tokens share them: they stay
/// in L1 beside one group's activations (Gemma 3's 640-wide rows: 16 × 1.3 KB).
const WIDENED_ROWS: usize = 16;

thread_local! {
    /// Each thread's widened weight rows ([`WidenedRows`]).
    static WIDENED: RefCell<(Vec<__m256i>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// [`run`] for one format. Up to [`STORED_ROWS_UP_TO`] tokens (batched decode steps,
/// draft verification) widen each weight block as they go; more take [`WIDENED_ROWS`]
/// rows widened once for all the groups, since widening a block costs about as much
/// vector work as multiplying it by eight tokens.
///
/// # Safety
/// As [`run`], with `w_rows` of format `FMT`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_format<const FMT: u8>(
    w_rows: &[u8],
    row_bytes: usize,
    acts: &GroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    if !acts.unsigned.is_empty() {
        // SAFETY: the caller's contract; the unsigned quants are only built where the
        // CPU has AVX-VNNI.
        return unsafe { run_vnni::<FMT>(w_rows, row_bytes, acts, out_ptr, out_stride) };
    }
    if acts.n_tokens <= STORED_ROWS_UP_TO {
        let rows = StoredRows::<FMT> { w_rows, row_bytes };
        // SAFETY: the caller's contract.
        return unsafe { groups(&rows, acts, out_ptr, out_stride) };
    }
    let n_rows = w_rows.len() / row_bytes;
    WIDENED.with(|cell| {
        let (quads, dw) = &mut *cell.borrow_mut();
        for r0 in (0..n_rows).step_by(WIDENED_ROWS) {
            let n_here = WIDENED_ROWS.min(n_rows - r0);
            let w = &w_rows[r0 * row_bytes..(r0 + n_here) * row_bytes];
            // SAFETY: the caller's contract (the CPU features, whole rows of `FMT`).
            let rows = unsafe { WidenedRows::widen::<FMT>(w, row_bytes, acts.n_blocks, quads, dw) };
            // SAFETY: the caller's contract; rows `r0..` write from column `r0` on.
            unsafe { groups(&rows, acts, out_ptr.add(r0), out_stride) };
        }
    });
}

/// Runs `$group::<N, $param>(rows, acts, g0, out, stride)` for every group of up to
/// [`GROUP`] tokens of `acts` (`g0` its first token, `N` its size as a constant), token
/// `g0 + t` of row `r` going to `out_ptr[(g0 + t)·stride + r]`. A macro, not a function
/// taking the kernel, so that each group kernel is inlined under its own entry's target
/// features. Expands to unsafe calls: the caller's contract is the group kernel's.
macro_rules! each_group {
    ($group:ident::<$param:tt>($rows:expr, $acts:expr, ($out_ptr:expr, $stride:expr))) => {
        for g0 in (0..$acts.n_tokens).step_by(GROUP) {
            let out = $out_ptr.add(g0 * $stride);
            match GROUP.min($acts.n_tokens - g0) {
                1 => $group::<1, $param>($rows, $acts, g0, out, $stride),
                2 => $group::<2, $param>($rows, $acts, g0, out, $stride),
                3 => $group::<3, $param>($rows, $acts, g0, out, $stride),
                4 => $group::<4, $param>($rows, $acts, g0, out, $stride),
                5 => $group::<5, $param>($rows, $acts, g0, out, $stride),
                6 => $group::<6, $param>($rows, $acts, g0, out, $stride),
                7 => $group::<7, $param>($rows, $acts, g0, out, $stride),
                _ => $group::<8, $param>($rows, $acts, g0, out, $stride),
            }
        }
    };
}

/// Every group of [`GROUP`] tokens of `acts` against every row of `rows`.
///
/// # Safety
/// As [`run`], with `out_ptr` at the column of `rows`' first row.
#[inline(always)]
unsafe fn groups<W: WeightBlocks>(
    rows: &W,
    acts: &GroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { each_group!(group::<W>(rows, acts, (out_ptr, out_stride))) }
}

/// Where [`group`] gets each weight block, widened as [`weight_block`] widens it.
trait WeightBlocks {
    /// Rows held.
    fn n_rows(&self) -> usize;

    /// Blocks per row.
    fn n_blocks(&self) -> usize;

    /// Row `r`'s block `b`: its quants in lane-pair order and `d_w` splatted.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; only inlined into functions enabling them.
    unsafe fn block(&self, r: usize, b: usize) -> (__m256i, __m256i, __m256);

    /// Row `r`'s block `b`'s `d_w` alone.
    ///
    /// # Safety
    /// As [`WeightBlocks::block`].
    unsafe fn dw(&self, r: usize, b: usize) -> f32;
}

/// Weight rows as stored, each block widened when it is needed.
struct StoredRows<'a, const FMT: u8> {
    w_rows: &'a [u8],
    row_bytes: usize,
}

impl<const FMT: u8> WeightBlocks for StoredRows<'_, FMT> {
    fn n_rows(&self) -> usize {
        self.w_rows.len() / self.row_bytes
    }

    fn n_blocks(&self) -> usize {
        self.row_bytes / block_bytes(FMT)
    }

    #[inline(always)]
    unsafe fn block(&self, r: usize, b: usize) -> (__m256i, __m256i, __m256) {
        let row = &self.w_rows[r * self.row_bytes..(r + 1) * self.row_bytes];
        let at = b * block_bytes(FMT);
        // Every row is read once per group: stream ahead, as decoding does.
        prefetch_ahead(row, at);
        // SAFETY: the caller's contract; `weight_block` asserts the block's length.
        unsafe { weight_block::<FMT>(&row[at..]) }
    }

    #[inline(always)]
    unsafe fn dw(&self, r: usize, b: usize) -> f32 {
        let at = r * self.row_bytes + b * block_bytes(FMT);
        crate::avx2::f16_bits_to_f32(u16::from_le_bytes([self.w_rows[at], self.w_rows[at + 1]]))
    }
}

/// Weight rows widened once into the thread's buffers: two registers of quants and
/// `d_w` per block.
struct WidenedRows<'a> {
    quads: &'a [__m256i],
    dw: &'a [f32],
    n_blocks: usize,
}

impl<'a> WidenedRows<'a> {
    /// Widens the rows `w` (`row_bytes` each, `n_blocks` blocks of `FMT` each) into
    /// `quads` and `dw`.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C; only inlined into functions enabling them.
    #[inline(always)]
    unsafe fn widen<const FMT: u8>(
        w: &[u8],
        row_bytes: usize,
        n_blocks: usize,
        quads: &'a mut Vec<__m256i>,
        dw: &'a mut Vec<f32>,
    ) -> WidenedRows<'a> {
        quads.clear();
        dw.clear();
        let stored = StoredRows::<FMT> {
            w_rows: w,
            row_bytes,
        };
        for r in 0..stored.n_rows() {
            for b in 0..n_blocks {
                // SAFETY: the caller's contract.
                let (lo, hi, d) = unsafe { stored.block(r, b) };
                quads.extend([lo, hi]);
                dw.push(_mm256_cvtss_f32(d));
            }
        }
        WidenedRows {
            quads,
            dw,
            n_blocks,
        }
    }
}

impl WeightBlocks for WidenedRows<'_> {
    fn n_rows(&self) -> usize {
        self.dw.len() / self.n_blocks.max(1)
    }

    fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    #[inline(always)]
    unsafe fn block(&self, r: usize, b: usize) -> (__m256i, __m256i, __m256) {
        let i = r * self.n_blocks + b;
        (
            self.quads[2 * i],
            self.quads[2 * i + 1],
            _mm256_set1_ps(self.dw[i]),
        )
    }

    #[inline(always)]
    unsafe fn dw(&self, r: usize, b: usize) -> f32 {
        self.dw[r * self.n_blocks + b]
    }
}

/// A weight block's 32 signed quants widened to i16 in lane-pair order (the first
/// register pairs `(4l, 4l+1)`, the second `(4l+2, 4l+3)`), and `d_w` splatted.
///
/// # Safety
/// The CPU has AVX2 and F16C; `wb` holds a whole block of `FMT`.
#[inline(always)]
unsafe fn weight_block<const FMT: u8>(wb: &[u8]) -> (__m256i, __m256i, __m256) {
    // SAFETY: the contract (`signed_quants` asserts the block length).
    unsafe {
        let (q, dw) = signed_quants::<FMT>(wb);
        let dw = _mm256_set1_ps(dw);
        // Per 128-bit half: pairs (4l, 4l+1) in the low eight bytes, (4l+2, 4l+3) in
        // the high eight; then the low eights of both halves together, and the highs.
        let order = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3,
            6, 7, 10, 11, 14, 15,
        );
        let split = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(q, order));
        (
            _mm256_cvtepi8_epi16(_mm256_castsi256_si128(split)),
            _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(split)),
            dw,
        )
    }
}

/// Groups of at least this many tokens take every token's `d_w·d_x` from a table of
/// the row's products ([`row_scales`]); smaller ones multiply per token (the table
/// costs more than it saves there).
const SCALE_TABLE_FROM: usize = 4;

thread_local! {
    /// Each thread's table of one row's `d_w·d_x` ([`row_scales`]).
    static SCALES: Cell<Vec<[f32; GROUP]>> = const { Cell::new(Vec::new()) };
}

/// Every block's `d_w·d_x` of row `r` for each token of the group starting at `g0`
/// (the lanes `lane_mask` sets), into `table[b]`: one vector multiply a block instead
/// of a scalar multiply and a register broadcast per token, both on the vector ALUs
/// the `madd`s and FMAs need (same products either way). Written before the row's
/// blocks are multiplied, so the broadcast loads that read them back find them in L1
/// rather than waiting on a store just issued (as a table written block by block did).
///
/// # Safety
/// The CPU has AVX2 and F16C; `lane_mask` sets lanes `0..N` only; `rows` holds
/// `acts`' block count of blocks per row.
#[inline(always)]
unsafe fn row_scales<const N: usize, W: WeightBlocks>(
    rows: &W,
    r: usize,
    acts: &GroupActs,
    g0: usize,
    lane_mask: __m256i,
    table: &mut [[f32; GROUP]],
) {
    let n_blocks = acts.n_blocks;
    assert!(table.len() >= n_blocks && acts.dx.len() >= (g0 + N) * n_blocks);
    for (b, out) in table[..n_blocks].iter_mut().enumerate() {
        let first = g0 * n_blocks + b * N;
        // SAFETY: the mask reads lanes 0..N of `dx[first..]`, inside `dx` (asserted: the
        // group's last slot is below (g0 + N)·n_blocks); `out` holds eight f32; the
        // features per the contract.
        unsafe {
            let dx = _mm256_maskload_ps(acts.dx.as_ptr().add(first), lane_mask);
            let dw = _mm256_set1_ps(rows.dw(r, b));
            _mm256_storeu_ps(out.as_mut_ptr(), _mm256_mul_ps(dw, dx));
        }
    }
}

/// How [`group_body`] forms a token's eight lane integers from one weight block.
trait LaneInts {
    /// What a block gives every token of the group.
    type Block: Copy;

    /// The weight rows read.
    fn rows(&self) -> &impl WeightBlocks;

    /// Row `r`'s block `b`, and its `d_w` splatted.
    ///
    /// # Safety
    /// The CPU has the kernel's features; only inlined into functions enabling them.
    unsafe fn block(&self, r: usize, b: usize) -> (Self::Block, __m256);

    /// Whether `acts` holds the quants [`LaneInts::lanes`] reads for its first `slots`
    /// slots.
    fn holds(acts: &GroupActs, slots: usize) -> bool;

    /// Token slot `slot`'s lane integers against `block`.
    ///
    /// # Safety
    /// As [`LaneInts::block`]; [`LaneInts::holds`] is true for `acts` and `slot + 1`.
    unsafe fn lanes(&self, block: Self::Block, acts: &GroupActs, slot: usize) -> __m256i;
}

/// The widened quants: two `vpmaddwd` and an add per token.
struct Widened<'a, W>(&'a W);

impl<W: WeightBlocks> LaneInts for Widened<'_, W> {
    type Block = (__m256i, __m256i);

    fn rows(&self) -> &impl WeightBlocks {
        self.0
    }

    #[inline(always)]
    unsafe fn block(&self, r: usize, b: usize) -> (Self::Block, __m256) {
        // SAFETY: the caller's contract.
        let (w_lo, w_hi, dw) = unsafe { self.0.block(r, b) };
        ((w_lo, w_hi), dw)
    }

    fn holds(acts: &GroupActs, slots: usize) -> bool {
        acts.quads.len() >= slots * 32
    }

    #[inline(always)]
    unsafe fn lanes(&self, (w_lo, w_hi): Self::Block, acts: &GroupActs, slot: usize) -> __m256i {
        // SAFETY: the slot's 32 i16 are inside `quads` (the contract); AVX2 per the
        // contract.
        unsafe {
            let p = acts.quads.as_ptr().add(slot * 32);
            let (x_lo, x_hi) = (
                _mm256_loadu_si256(p as *const __m256i),
                _mm256_loadu_si256(p.add(16) as *const __m256i),
            );
            _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi))
        }
    }
}

/// The stored rows' signed bytes against the unsigned quants (`x + 128`): one AVX-VNNI
/// `vpdpbusd` per token, started at the block's `−128·Σw` (one more per block), so
/// `Σ (x + 128)·w − 128·Σ w = Σ x·w` — the same integers as [`Widened`]'s from half the
/// activation bytes.
struct Bytes<'a, 'r, const FMT: u8>(&'a StoredRows<'r, FMT>);

impl<const FMT: u8> LaneInts for Bytes<'_, '_, FMT> {
    type Block = (__m256i, __m256i);

    fn rows(&self) -> &impl WeightBlocks {
        self.0
    }

    #[inline(always)]
    unsafe fn block(&self, r: usize, b: usize) -> (Self::Block, __m256) {
        let row = &self.0.w_rows[r * self.0.row_bytes..(r + 1) * self.0.row_bytes];
        let at = b * block_bytes(FMT);
        // Every row is read once per group: stream ahead, as decoding does.
        prefetch_ahead(row, at);
        // SAFETY: the caller's contract (AVX2, F16C and AVX-VNNI); `signed_quants`
        // asserts the block's length.
        unsafe {
            let (w, dw) = signed_quants::<FMT>(&row[at..]);
            // `vpdpbusd` of the bytes 0x80 (unsigned 128) and `w`: 128·Σw per lane.
            let zero = _mm256_setzero_si256();
            let start = _mm256_sub_epi32(
                zero,
                _mm256_dpbusd_avx_epi32(zero, _mm256_set1_epi8(-128), w),
            );
            ((w, start), _mm256_set1_ps(dw))
        }
    }

    fn holds(acts: &GroupActs, slots: usize) -> bool {
        acts.unsigned.len() >= slots * 32
    }

    #[inline(always)]
    unsafe fn lanes(&self, (w, start): Self::Block, acts: &GroupActs, slot: usize) -> __m256i {
        // SAFETY: the slot's 32 bytes are inside `unsigned` (the contract); AVX-VNNI per
        // the contract.
        unsafe {
            let x = _mm256_loadu_si256(acts.unsigned.as_ptr().add(slot * 32) as *const __m256i);
            _mm256_dpbusd_avx_epi32(start, x, w)
        }
    }
}

/// The weight rows of `rows` against tokens `g0..g0 + N` of `acts`: row `r`, token
/// `g0 + t` to `out[t·out_stride + r]`, with [`Widened`] lane integers.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `rows` holds `acts`' block count of blocks per row;
/// `out` is valid for those writes.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group<const N: usize, W: WeightBlocks>(
    rows: &W,
    acts: &GroupActs,
    g0: usize,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { group_body::<N, _>(&Widened(rows), acts, g0, (out, out_stride)) }
}

/// [`group`] with [`Bytes`] lane integers.
///
/// # Safety
/// As [`group`], the CPU having AVX-VNNI and `acts` holding its unsigned quants.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn group_vnni<const N: usize, const FMT: u8>(
    rows: &StoredRows<'_, FMT>,
    acts: &GroupActs,
    g0: usize,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: the caller's contract.
    unsafe { group_body::<N, _>(&Bytes(rows), acts, g0, (out, out_stride)) }
}

/// [`group`]'s work, inlined into each kernel's entry point: per row and block the lane
/// integers of every token, then the single-token kernel's `d_w·d_x`, FMA chain and
/// final lane sum.
///
/// # Safety
/// As [`group`], with the features `ints` needs enabled where this is inlined.
#[inline(always)]
unsafe fn group_body<const N: usize, K: LaneInts>(
    ints: &K,
    acts: &GroupActs,
    g0: usize,
    (out, out_stride): (*mut f32, usize),
) {
    let rows = ints.rows();
    let (n, n_blocks) = (acts.n_tokens, acts.n_blocks);
    assert!(g0 + N <= n && rows.n_blocks() == n_blocks);
    assert!(acts.dx.len() >= n_blocks * n && K::holds(acts, n_blocks * n));
    // Lanes 0..N set: the tokens of this group (for `row_scales`).
    let lane_mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(N as i32),
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
    );
    // Taken out of the thread-local rather than used inside its closure: a closure is
    // compiled without the target features of the kernel this body is inlined into, so
    // its intrinsics would be calls.
    let mut table = SCALES.with(|cell| cell.take());
    if N >= SCALE_TABLE_FROM && table.len() < n_blocks {
        table.resize(n_blocks, [0.0; GROUP]);
    }
    for r in 0..rows.n_rows() {
        if N >= SCALE_TABLE_FROM {
            // SAFETY: the contract; the table holds n_blocks entries (resized above).
            unsafe { row_scales::<N, _>(rows, r, acts, g0, lane_mask, &mut table) };
        }
        let mut acc = [_mm256_setzero_ps(); N];
        for b in 0..n_blocks {
            // SAFETY: the CPU features per the contract; `b` is inside the row.
            let (block, dw) = unsafe { ints.block(r, b) };
            // The group's tokens of block `b` lie side by side from here ([`slot`]).
            let first = g0 * n_blocks + b * N;
            debug_assert_eq!(first, slot(n, n_blocks, g0, b));
            for (t, acc) in acc.iter_mut().enumerate() {
                let slot = first + t;
                // SAFETY: slot < n_blocks·n, whose quants `acts` holds (asserted).
                let lanes = unsafe { ints.lanes(block, acts, slot) };
                let d = if N >= SCALE_TABLE_FROM {
                    _mm256_broadcast_ss(&table[b][t])
                } else {
                    _mm256_mul_ps(dw, _mm256_set1_ps(acts.dx[slot]))
                };
                *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), *acc);
            }
        }
        for (t, acc) in acc.iter().enumerate() {
            // SAFETY: the caller's contract on `out`.
            unsafe { *out.add(t * out_stride + r) = hsum_ps(*acc) };
        }
    }
    SCALES.with(|cell| cell.replace(table));
}

/// [`run_format`] with AVX-VNNI: every group of [`GROUP`] tokens against the rows as
/// stored, each block decoded to signed bytes once per group (a load for Q8_0, a few
/// operations for Q4_0 / Q5_0: no widened copy pays here).
///
/// # Safety
/// As [`run`], with `w_rows` of format `FMT`, the CPU having AVX-VNNI and `acts` holding
/// its unsigned quants.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn run_vnni<const FMT: u8>(
    w_rows: &[u8],
    row_bytes: usize,
    acts: &GroupActs,
    out_ptr: *mut f32,
    out_stride: usize,
) {
    let rows = StoredRows::<FMT> { w_rows, row_bytes };
    // SAFETY: the caller's contract.
    unsafe { each_group!(group_vnni::<FMT>(&rows, acts, (out_ptr, out_stride))) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_group_of_tokens_reads_one_contiguous_run() {
        for n in 1..=20 {
            for n_blocks in 1..=3 {
                let mut seen = vec![false; n * n_blocks];
                for g0 in (0..n).step_by(GROUP) {
                    let count = GROUP.min(n - g0);
                    let run: Vec<usize> = (0..n_blocks)
                        .flat_map(|b| (g0..g0 + count).map(move |t| slot(n, n_blocks, t, b)))
                        .collect();
                    let first = g0 * n_blocks;
                    let expected: Vec<usize> = (first..first + count * n_blocks).collect();
                    assert_eq!(run, expected, "n {n}, blocks {n_blocks}, group {g0}");
                    for s in run {
                        assert!(!std::mem::replace(&mut seen[s], true), "slot {s} twice");
                    }
                }
                assert!(
                    seen.iter().all(|&s| s),
                    "n {n}, blocks {n_blocks}: a slot unused"
                );
            }
        }
    }

    #[test]
    fn build_widens_each_quant_once_in_lane_pair_order() {
        // Two tokens of one block: token t's quant k is t·32 + k − 40 (as i8).
        let mut rows = vec![0u8; 2 * Q8_0_BYTES];
        for t in 0..2 {
            let xb = &mut rows[t * Q8_0_BYTES..(t + 1) * Q8_0_BYTES];
            xb[..2].copy_from_slice(&0x4000u16.to_le_bytes()); // 2.0
            for k in 0..32 {
                xb[2 + k] = (t as i32 * 32 + k as i32 - 40) as i8 as u8;
            }
        }
        let mut g = GroupActs::default();
        g.build_for(&rows, (2, Q8_0_BYTES), false);
        assert_eq!((g.n_tokens(), g.n_blocks), (2, 1));
        let q = |t: usize, k: i16| t as i16 * 32 + k - 40;
        // Token 1 of block 0 is slot 1; lane 3 holds quants 12, 13 | 14, 15.
        let s = &g.quads[32..64];
        assert_eq!(
            (s[6], s[7], s[16 + 6], s[16 + 7]),
            (q(1, 12), q(1, 13), q(1, 14), q(1, 15))
        );
        assert_eq!(g.dx, vec![2.0, 2.0]);
        g.build(&rows, 1, Q8_0_BYTES);
        assert_eq!(g.n_tokens(), 0, "one token takes the single-token kernel");
    }

    /// Random blocks of `ty` (every quant byte value, −128 included) with finite scales.
    fn random_blocks(ty: GgmlType, n_blocks: usize, seed: u64) -> Vec<u8> {
        let bytes = block_bytes(format_code(ty).expect("a group format"));
        let mut state = seed;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) as u8
        };
        let mut out: Vec<u8> = (0..n_blocks * bytes).map(|_| next()).collect();
        for block in out.chunks_exact_mut(bytes) {
            // d = ±(1 + m/1024)·2^(e − 15) for e in 5..=20: finite, normal.
            let bits = (u16::from(next()) & 0x83FF) | ((5 + u16::from(next() % 16)) << 10);
            block[..2].copy_from_slice(&bits.to_le_bytes());
        }
        out
    }

    #[test]
    fn the_vnni_groups_give_the_widened_groups_bits() {
        if !vnni_available() {
            eprintln!("skipped: this CPU has no AVX-VNNI");
            return;
        }
        let (n_rows, n_blocks) = (19, 3);
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::Q8_0] {
            let row_bytes = n_blocks * block_bytes(format_code(ty).expect("a group format"));
            let w = random_blocks(ty, n_rows * n_blocks, 7);
            for n in [2, 3, 5, 8, 9, 16, 17, 25] {
                let x = random_blocks(GgmlType::Q8_0, n * n_blocks, n as u64);
                let mut acts = GroupActs::default();
                acts.build(&x, n, n_blocks * Q8_0_BYTES);
                assert!(!acts.unsigned.is_empty());
                let mut widened = GroupActs::default();
                widened.build_for(&x, (n, n_blocks * Q8_0_BYTES), false);
                let mut got = vec![0f32; n * n_rows];
                let mut want = vec![0f32; n * n_rows];
                // SAFETY: AVX2, FMA, F16C and AVX-VNNI (checked above), a group format,
                // whole rows, outputs of n rows of `n_rows`.
                unsafe {
                    run(ty, &w, row_bytes, &acts, got.as_mut_ptr(), n_rows);
                    run(ty, &w, row_bytes, &widened, want.as_mut_ptr(), n_rows);
                }
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), e.to_bits(), "{ty:?}, {n} tokens, output {i}");
                }
            }
        }
    }
}
