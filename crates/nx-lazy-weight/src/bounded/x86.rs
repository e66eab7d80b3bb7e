//! The bound pass on AVX-512 VNNI: up to eight tokens, one row per 32-bit lane of a
//! 512-bit register, sixteen rows' blocks transposed in registers and each token's quads
//! broadcast to them ([`lane_row_sums`]: the work follows the tokens); above eight, one
//! token per 32-bit lane, each weight quad broadcast from the row as `vpdpbusd`'s memory
//! operand. The AVX2 tier runs the one-token-per-lane pass with AVX-VNNI's VEX `vpdpbusd`
//! where the CPU has it: up to four tokens with a token's quads in two lanes, each pair of
//! a row's quads broadcast to all of them ([`paired_row_sums`]), eight tokens per 256-bit
//! register, above eight on a pair of them ([`Pair`]), so that sixteen tokens read the
//! rows once.
//!
//! On Zen 4 a 256-bit and a 512-bit `vpdpbusd` both take a cycle (`benches/pipes`), so
//! nine to sixteen tokens cost what eight do; on the Xeons with AMX here the two widths
//! run at the same rate too (about 0.17 ns each, in a loop of independent ones), which
//! is why eight tokens take 512-bit registers in pairs rather than 256-bit ones.

use std::arch::x86_64::*;
use std::marker::PhantomData;

use super::{
    half_term, margin_factor, BlockSum, BoundedKernel, BoundedScratch, LANE_ROWS,
    MAX_EXTRA_CANDIDATES, MAX_TOKENS, Q8_0_BLOCK,
};
use crate::formats::read_f16;
use crate::transpose::{transpose_lanes4, transpose_quads};
use crate::LazyWeight;
use nx_syscalls::ThreadPool;

mod amx;

/// Added to every margin: covers the absolute rounding errors of subnormal values (far
/// below any output that is not itself negligible).
const TINY: f32 = 7.5e-37;
/// Rows per chunk of the pass.
const CHUNK_ROWS: usize = 512;
/// Rows per group of the pass (their accumulators and the block's registers fit).
const ROWS: usize = 4;
/// Fields of a block in the layout, each one register: eight of quads (lane `t` holds
/// token `t`'s quants `4j..4j+4`, plus 128 as unsigned bytes; in pairs and signed for
/// [`paired_row_sums`], signed for [`lane_row_sums`]), the scales `d_x`, the bound
/// weights `128·Σ|x|` and (paired only, two registers) each token's `−64·Σx` in both its
/// lanes, or (row lanes only) each token's `−128·Σx` in its lane.
const FIELDS: usize = 12;
/// The field where the paired and row-lane passes' accumulators start: the paired
/// layout's `−64·Σx` lanes (two registers), the row-lane layout's `−128·Σx`.
const START_FIELD: usize = 10;

/// How [`lay_out`] arranges a block's quads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Arrangement {
    /// Lane `t` of field `j`: token `t`'s quad `j`, xor the flip.
    Plain(u8),
    /// For [`paired_row_sums`]: a token's quads in two lanes, signed, and `−64·Σx`.
    Paired,
    /// For [`lane_row_sums`]: as `Plain(0)`, and each token's `−128·Σx`.
    RowLanes,
}

/// A head's tables (see `BoundedHead`).
pub(super) struct Tables<'a> {
    pub(super) corrections: &'a [BlockSum],
    pub(super) row_max: &'a [f32],
    pub(super) lane_scales: &'a [u16],
    pub(super) n_blocks: usize,
}

/// A run of a head's rows and their tables: whole rows of `n_blocks` Q8_0 blocks,
/// `row_bytes` apart; `n_blocks` block terms per row (or none); each row's largest
/// `|d_w|`; the lane scales of the run's whole groups of [`LANE_ROWS`] rows (or none).
#[derive(Clone, Copy)]
struct Rows<'a> {
    w: &'a [u8],
    row_bytes: usize,
    corr: &'a [BlockSum],
    row_max: &'a [f32],
    lane_scales: &'a [u16],
}

/// Per-thread results of the pass. For each lane (token) with its count `top`: the
/// largest lower ends seen (ascending, at most `top`) and the bar — the `top`-th largest
/// (−∞ until there are that many); a sum that turns NaN when the lane saw a non-finite
/// value; and the rows that may still be among the top — each row whose upper end
/// reached the thread's bar so far, with its upper ends. The bar only rises and never
/// passes the final one (the `top`-th largest lower end of all rows), so every row whose
/// upper end reaches that is among them (rows are few: records of a running top).
#[derive(Clone)]
struct PassState {
    lows: Vec<Vec<f32>>,
    bar: [f32; MAX_TOKENS],
    check: [f32; MAX_TOKENS],
    maybe: Vec<(u32, [f32; MAX_TOKENS])>,
}

impl PassState {
    /// Files lane `t`'s lower end `lo` of a row, keeping the lane's `top` largest.
    fn file_lower(&mut self, t: usize, lo: f32, top: usize) {
        let lows = &mut self.lows[t];
        if lows.len() == top {
            if lo <= lows[0] {
                return;
            }
            lows.remove(0);
        }
        let at = lows.partition_point(|&x| x < lo);
        lows.insert(at, lo);
        if lows.len() == top {
            self.bar[t] = lows[0];
        }
    }
}

/// Row candidates of tokens `t0..t0 + nt` of `scratch.acts` (already quantized), token
/// `t0 + t` asking for its `top[t]` largest outputs, by `kernel`'s pass; `corrections`
/// and `row_max` being the weight's tables.
pub(super) fn candidates(
    w: &LazyWeight<'_>,
    (tables, kernel, avx2): (Tables<'_>, BoundedKernel, bool),
    scratch: &mut BoundedScratch,
    (t0, top): (usize, &[usize]),
    pool: &ThreadPool,
) -> Vec<Option<Vec<u32>>> {
    let nt = top.len();
    let amx = kernel == BoundedKernel::Amx;
    // The AMX pass's activation tile is always sixteen tokens wide, of signed quants.
    // Above eight tokens the AVX2 tier's pass (AVX-VNNI) takes a pair of registers.
    // Up to eight tokens under AVX-512 the row-lane pass (`lane_row_sums`), up to four
    // under AVX2 the quads in pairs (`paired_row_sums`): signed there, the weights taking
    // the unsigned side.
    let row_lanes = !amx && !avx2 && nt <= 8;
    let paired = !amx && avx2 && nt <= PairsY::<VexPaired>::TOKENS;
    let lanes = if amx || nt > 8 { 16 } else { 8 };
    // Signed quants for AMX's `tdpbssd` and the paired and row-lane passes, `x + 128`
    // for the others.
    let arrangement = match (row_lanes, paired, amx) {
        (true, _, _) => Arrangement::RowLanes,
        (_, true, _) => Arrangement::Paired,
        (_, _, true) => Arrangement::Plain(0),
        _ => Arrangement::Plain(0x80),
    };
    let shape = (tables.n_blocks, lanes, arrangement);
    lay_out(&scratch.acts, (t0, nt), shape, &mut scratch.layout);
    let init = PassState {
        lows: vec![Vec::new(); MAX_TOKENS],
        bar: [f32::NEG_INFINITY; MAX_TOKENS],
        check: [0.0; MAX_TOKENS],
        maybe: Vec::new(),
    };
    let mut states = vec![init; pool.n_threads().max(1)];
    let layout = &scratch.layout[..];
    let totals = token_totals(layout, (tables.n_blocks, lanes));
    let sweep = (layout, &totals, top);
    match kernel {
        BoundedKernel::Vnni => {
            let pass = match (avx2, lanes) {
                (true, 8) if paired => VnniPass::Paired,
                (true, 8) => VnniPass::Ymm,
                (true, _) => VnniPass::YmmPair,
                (false, 8) => VnniPass::RowLanes,
                _ => VnniPass::Zmm,
            };
            vnni_sweep(w, &tables, pass, sweep, &mut states, pool);
        }
        BoundedKernel::Amx => amx_sweep(w, &tables, sweep, &mut states, pool),
    }
    rows_per_token(&states, top)
}

/// Which VNNI pass a sweep runs (the register width, and how the layout holds a token).
#[derive(Clone, Copy)]
enum VnniPass {
    /// AVX-VNNI, up to four tokens with their quads in pairs.
    Paired,
    /// AVX-VNNI, eight tokens a 256-bit register.
    Ymm,
    /// AVX-VNNI, sixteen tokens in a pair of 256-bit registers.
    YmmPair,
    /// AVX-512, up to eight tokens, a row per 32-bit lane.
    RowLanes,
    /// AVX-512, sixteen tokens a 512-bit register.
    Zmm,
}

/// The VNNI pass over every row of `w`, in chunks on `pool`, into `states` (one per
/// thread).
fn vnni_sweep(
    w: &LazyWeight<'_>,
    tables: &Tables<'_>,
    pass: VnniPass,
    (layout, totals, top): (&[u8], &[f32; MAX_TOKENS], &[usize]),
    states: &mut [PassState],
    pool: &ThreadPool,
) {
    let Tables {
        corrections,
        row_max,
        lane_scales,
        n_blocks,
    } = *tables;
    let (bytes, row_bytes) = (w.bytes(), w.row_bytes());
    let c = margin_factor(n_blocks);
    // Chunks start at whole groups of `LANE_ROWS` rows.
    const _: () = assert!(CHUNK_ROWS.is_multiple_of(LANE_ROWS));
    pool.parallel_for_with(w.n_rows(), CHUNK_ROWS, states, |state, rows| {
        let per_group = n_blocks * LANE_ROWS;
        let groups = |r: usize| (r / LANE_ROWS * per_group).min(lane_scales.len());
        let w_rows = Rows {
            w: &bytes[rows.start * row_bytes..rows.end * row_bytes],
            row_bytes,
            corr: &corrections[rows.start * n_blocks..rows.end * n_blocks],
            row_max: &row_max[rows.start..rows.end],
            lane_scales: &lane_scales[groups(rows.start)..groups(rows.end)],
        };
        let args = (layout, n_blocks, c, totals);
        let at = (rows.start, top);
        // SAFETY: `has_bounded_kernel` checked the features (AVX-VNNI for the 256-bit
        // widths, AVX-512 VNNI for the others); `w_rows` holds whole rows of `n_blocks`
        // Q8_0 blocks and `corr` their terms, the layout arranged for the width's pass.
        unsafe {
            match pass {
                VnniPass::Paired => pass_avx2::<Y<VexPaired>>(w_rows, args, at, state),
                VnniPass::Ymm => pass_avx2::<Y<Vex>>(w_rows, args, at, state),
                VnniPass::YmmPair => pass_avx2::<Pair<Y<Vex>>>(w_rows, args, at, state),
                VnniPass::RowLanes => pass_avx512::<Y<EvexRowLanes>>(w_rows, args, at, state),
                VnniPass::Zmm => pass_avx512::<Z>(w_rows, args, at, state),
            }
        }
    });
}

/// The AMX pass over every row of `w`, in chunks on `pool`, into `states` (one per
/// thread).
fn amx_sweep(
    w: &LazyWeight<'_>,
    tables: &Tables<'_>,
    (layout, totals, top): (&[u8], &[f32; MAX_TOKENS], &[usize]),
    states: &mut [PassState],
    pool: &ThreadPool,
) {
    let (bytes, row_bytes, n_blocks) = (w.bytes(), w.row_bytes(), tables.n_blocks);
    let c = margin_factor(n_blocks);
    pool.parallel_for_with(w.n_rows(), CHUNK_ROWS, states, |state, rows| {
        let w_rows = &bytes[rows.start * row_bytes..rows.end * row_bytes];
        let row_max = &tables.row_max[rows.start..rows.end];
        // SAFETY: `BoundedKernel::Amx.available` held when the head was built (AMX
        // permitted, AVX-512 VNNI tier features); `w_rows` holds whole rows of
        // `n_blocks` Q8_0 blocks and `row_max` their table, the layout sixteen lanes of
        // signed quants.
        unsafe {
            amx::pass(
                (w_rows, row_bytes, row_max),
                (layout, n_blocks, c, totals),
                (rows.start, top),
                state,
            );
        }
    });
}

/// From the threads' pass states, each token's rows that may be among its `top[t]`
/// largest outputs; `None` where the pass saw a non-finite value or more than
/// [`MAX_EXTRA_CANDIDATES`] extra rows.
fn rows_per_token(states: &[PassState], top: &[usize]) -> Vec<Option<Vec<u32>>> {
    let mut maybe: Vec<&(u32, [f32; MAX_TOKENS])> = states.iter().flat_map(|s| &s.maybe).collect();
    maybe.sort_unstable_by_key(|m| m.0);
    (0..top.len())
        .map(|t| {
            let finite = states.iter().all(|s| s.check[t] == 0.0);
            // The `top`-th largest lower end of all rows: the threads' own tops hold it.
            let mut lows: Vec<f32> = states.iter().flat_map(|s| &s.lows[t]).copied().collect();
            lows.sort_unstable_by(|a, b| b.total_cmp(a));
            let bar = *lows.get(top[t] - 1)?;
            let most = top[t] + MAX_EXTRA_CANDIDATES;
            let rows: Vec<u32> = maybe
                .iter()
                .filter(|m| m.1[t] >= bar)
                .map(|m| m.0)
                .take(most + 1)
                .collect();
            (finite && bar.is_finite() && rows.len() <= most).then_some(rows)
        })
        .collect()
}

/// Lays out tokens `t0..t0 + nt` as the pass reads them: per block, [`FIELDS`]
/// registers of `lanes` lanes, the quants xor the flip (`0x80`: unsigned `x + 128`, for
/// `vpdpbusd`'s unsigned side; `0`: signed, for `tdpbssd` and for the paired and
/// row-lane passes, whose weights take the unsigned side). Padding lanes hold `x = 0`
/// (scale 0): their outputs are 0.
fn lay_out(
    acts: &crate::QuantizedActs,
    (t0, nt): (usize, usize),
    (n_blocks, lanes, arrangement): (usize, usize, Arrangement),
    out: &mut Vec<u8>,
) {
    let paired = arrangement == Arrangement::Paired;
    let flip = match arrangement {
        Arrangement::Plain(flip) => flip,
        _ => 0,
    };
    let reg = 4 * lanes;
    out.clear();
    out.resize(n_blocks * FIELDS * reg, 0);
    for block in out.chunks_exact_mut(FIELDS * reg) {
        block[..8 * reg].fill(flip);
    }
    for t in 0..nt.min(lanes) {
        let Some(row) = acts.get_row(t0 + t) else {
            continue;
        };
        for (b, xb) in row.chunks_exact(Q8_0_BLOCK).take(n_blocks).enumerate() {
            let blk = &mut out[b * FIELDS * reg..(b + 1) * FIELDS * reg];
            let qs = &xb[2..];
            for j in 0..8 {
                for i in 0..4 {
                    let at = if paired {
                        2 * reg * (j / 2) + 4 * (2 * t + j % 2)
                    } else {
                        reg * j + 4 * t
                    };
                    blk[at + i] = qs[4 * j + i] ^ flip;
                }
            }
            let abs: i32 = qs.iter().map(|&q| (q as i8 as i32).abs()).sum();
            if paired {
                // Both lanes of the token start at −64·Σx: with the weights as `w + 128`
                // the pair's products sum to `Σw·x + 128·Σx`.
                let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
                let at = START_FIELD * reg + 8 * t;
                blk[at..at + 4].copy_from_slice(&(-64 * sum).to_le_bytes());
                blk[at + 4..at + 8].copy_from_slice(&(-64 * sum).to_le_bytes());
            }
            if arrangement == Arrangement::RowLanes {
                // The weights as `w + 128`: every row's products sum to
                // `Σw·x + 128·Σx`.
                let sum: i32 = qs.iter().map(|&q| q as i8 as i32).sum();
                let at = START_FIELD * reg + 4 * t;
                blk[at..at + 4].copy_from_slice(&(-128 * sum).to_le_bytes());
            }
            let d = read_f16(xb, 0);
            blk[8 * reg + 4 * t..8 * reg + 4 * t + 4].copy_from_slice(&d.to_le_bytes());
            blk[9 * reg + 4 * t..9 * reg + 4 * t + 4]
                .copy_from_slice(&((128 * abs) as f32).to_le_bytes());
        }
    }
}

/// Per token (lane) of the layout, `X = Σ_b d_x·128·Σ|x_b|` (one chain, each product
/// rounded): times a row's largest `|d_w|`, the row's `T` (see the module docs).
fn token_totals(layout: &[u8], (n_blocks, lanes): (usize, usize)) -> [f32; MAX_TOKENS] {
    let reg = 4 * lanes;
    let field = |b: usize, f: usize, t: usize| {
        let at = b * FIELDS * reg + f * reg + 4 * t;
        f32::from_le_bytes(layout[at..at + 4].try_into().expect("four bytes"))
    };
    std::array::from_fn(|t| {
        if t < lanes {
            (0..n_blocks).fold(0f32, |x, b| x + field(b, 8, t) * field(b, 9, t))
        } else {
            0.0
        }
    })
}

/// One register width of the pass: its integer and float vectors and the operations the
/// pass takes. Every method is an intrinsic of AVX-512 F/BW/VL/VNNI or F16C.
///
/// # Safety
/// The methods may only be called where those features are enabled.
trait Width {
    /// Lanes (tokens) per register.
    const LANES: usize;
    /// Rows per group of the pass: 4, or 2 where a register is a pair (their
    /// accumulators and the block's registers then fill the sixteen of AVX2).
    const GROUP_ROWS: usize = ROWS;
    type I: Copy;
    type F: Copy;
    unsafe fn zero_i() -> Self::I;
    unsafe fn zero_f() -> Self::F;
    unsafe fn splat_i(v: i32) -> Self::I;
    unsafe fn splat_f(v: f32) -> Self::F;
    /// Every lane the f16 `bits` as f32.
    unsafe fn splat_f16(bits: i16) -> Self::F;
    unsafe fn load_i(p: *const u8) -> Self::I;
    unsafe fn load_f(p: *const u8) -> Self::F;
    unsafe fn store_f(p: *mut f32, v: Self::F);
    /// `acc + Σ a·b` per lane (`a` unsigned, `b` signed bytes).
    unsafe fn dpbusd(acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c`, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c − a·b`, one rounding.
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Bit `l` set where lane `l` of `a` is at least that of `b` (ordered).
    unsafe fn ge_mask(a: Self::F, b: Self::F) -> u32;
    /// Whether the pass takes whole groups of [`LANE_ROWS`] rows by [`lane_row_sums`].
    const ROW_LANES: bool = false;
    /// [`lane_row_sums`] for this width (only where [`Self::ROW_LANES`]).
    ///
    /// # Safety
    /// As [`lane_row_sums`].
    #[inline(always)]
    unsafe fn lane_row_sums(
        _rows: (&[u8], usize, &[u16]),
        _layout: (&[u8], usize, usize),
        _sums: &mut [Self::F; LANE_ROWS],
    ) {
        unreachable!("a width without row lanes")
    }
    /// [`row_sums`] for this width.
    #[inline(always)]
    unsafe fn row_sums<const R: usize>(
        rows: (&[u8], usize, &[BlockSum]),
        layout: (&[u8], usize),
        sums: &mut [Self::F; ROWS],
    ) where
        Self: Sized,
    {
        // SAFETY: the caller's contract.
        unsafe { row_sums::<Self, R>(rows, layout, sums) }
    }
}

/// 256-bit registers: eight tokens, `vpdpbusd` as `D` encodes it.
struct Y<D>(PhantomData<D>);
/// The EVEX `vpdpbusd` of AVX-512 VNNI (with VL): the 256-bit pass the paired and then
/// the row-lane passes replaced up to eight tokens, kept as their twin in the tests.
struct Evex;
/// The VEX `vpdpbusd` of AVX-VNNI, for the AVX2 tier.
struct Vex;

/// One encoding of the 256-bit `vpdpbusd`.
trait Dpbusd256 {
    /// How the pass takes the layout's quads: one per 256-bit `vpdpbusd` ([`row_sums`]),
    /// or in pairs ([`paired_row_sums`] on 512-bit registers, [`paired_row_sums`] on
    /// 256-bit ones for up to four tokens).
    const QUADS: Quads = Quads::One;
    /// `acc + Σ a·b` per lane (`a` unsigned, `b` signed bytes).
    ///
    /// # Safety
    /// The CPU has the encoding's features and they are enabled where this is inlined.
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

impl Dpbusd256 for Evex {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (AVX-512 VNNI and VL).
        unsafe { _mm256_dpbusd_epi32(acc, a, b) }
    }
}

/// How a pass of [`Y`] takes the layout's quads ([`Dpbusd256::QUADS`]).
#[derive(PartialEq, Eq)]
enum Quads {
    One,
    PairsYmm,
    /// [`lane_row_sums`] for every group of [`LANE_ROWS`] rows (a last, partial one
    /// copied out with zero rows after it).
    RowLanes,
}

/// [`Evex`] on 512-bit registers, a row per lane ([`lane_row_sums`]).
struct EvexRowLanes;

impl Dpbusd256 for EvexRowLanes {
    const QUADS: Quads = Quads::RowLanes;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract.
        unsafe { Evex::dpbusd(acc, a, b) }
    }
}

impl Dpbusd256 for Vex {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (AVX-VNNI).
        unsafe { _mm256_dpbusd_avx_epi32(acc, a, b) }
    }
}

/// [`Vex`] for up to four tokens, two quads per `vpdpbusd` ([`paired_row_sums`]).
struct VexPaired;

impl Dpbusd256 for VexPaired {
    const QUADS: Quads = Quads::PairsYmm;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract.
        unsafe { Vex::dpbusd(acc, a, b) }
    }
}
/// 512-bit registers: sixteen tokens.
struct Z;

impl<D: Dpbusd256> Width for Y<D> {
    const LANES: usize = 8;
    const ROW_LANES: bool = matches!(D::QUADS, Quads::RowLanes);
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn lane_row_sums(
        rows: (&[u8], usize, &[u16]),
        (layout, n_blocks, n_tokens): (&[u8], usize, usize),
        sums: &mut [__m256; LANE_ROWS],
    ) {
        let layout = (layout, n_blocks);
        // SAFETY: the caller's contract (`RowLanes` only for `EvexRowLanes`, under
        // AVX-512). The pass's cost is the tokens'.
        unsafe {
            match n_tokens {
                1 => lane_row_sums::<1>(rows, layout, sums),
                2 => lane_row_sums::<2>(rows, layout, sums),
                3 => lane_row_sums::<3>(rows, layout, sums),
                4 => lane_row_sums::<4>(rows, layout, sums),
                5 => lane_row_sums::<5>(rows, layout, sums),
                6 => lane_row_sums::<6>(rows, layout, sums),
                7 => lane_row_sums::<7>(rows, layout, sums),
                _ => lane_row_sums::<8>(rows, layout, sums),
            }
        }
    }
    #[inline(always)]
    unsafe fn row_sums<const R: usize>(
        rows: (&[u8], usize, &[BlockSum]),
        layout: (&[u8], usize),
        sums: &mut [__m256; ROWS],
    ) {
        // SAFETY: the caller's contract (`PairsYmm` only for `VexPaired` under AVX-VNNI,
        // or in tests for `EvexPairedY` under AVX-512, at most four tokens).
        unsafe {
            match D::QUADS {
                Quads::One => row_sums::<Self, R>(rows, layout, sums),
                // `pass` takes every row of this width in groups.
                Quads::RowLanes => unreachable!("row lanes take groups of rows"),
                Quads::PairsYmm => paired_row_sums::<PairsY<D>, R>(rows, layout, sums),
            }
        }
    }
    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        _mm256_setzero_si256()
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m256i {
        _mm256_set1_epi32(v)
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m256 {
        _mm256_set1_ps(v)
    }
    #[inline(always)]
    unsafe fn splat_f16(bits: i16) -> __m256 {
        // SAFETY: the trait's contract (F16C).
        unsafe { _mm256_cvtph_ps(_mm_set1_epi16(bits)) }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> __m256i {
        // SAFETY: the caller's pointer covers 32 bytes.
        unsafe { _mm256_loadu_si256(p as *const _) }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const u8) -> __m256 {
        // SAFETY: the caller's pointer covers 32 bytes.
        unsafe { _mm256_loadu_ps(p as *const f32) }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m256) {
        // SAFETY: the caller's pointer covers eight f32.
        unsafe { _mm256_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the trait's contract (the encoding's features).
        unsafe { D::dpbusd(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(a, b)
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        _mm256_cvtepi32_ps(a)
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        _mm256_mul_ps(a, b)
    }
    #[inline(always)]
    unsafe fn add(a: __m256, b: __m256) -> __m256 {
        _mm256_add_ps(a, b)
    }
    #[inline(always)]
    unsafe fn sub(a: __m256, b: __m256) -> __m256 {
        _mm256_sub_ps(a, b)
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: the trait's contract (FMA via AVX-512 F).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: as `fmadd`.
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn ge_mask(a: __m256, b: __m256) -> u32 {
        // AVX's compare and sign-bit mask: both tiers have them.
        _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(a, b)) as u32
    }
}

/// Two registers of `W` as one of twice the lanes: the AVX2 tier's sixteen tokens in one
/// sweep of the rows (two eight-token sweeps read the head twice), each weight quad
/// broadcast once for both.
struct Pair<W>(PhantomData<W>);

impl<W: Width> Width for Pair<W> {
    const LANES: usize = 2 * W::LANES;
    const GROUP_ROWS: usize = 2;
    type I = [W::I; 2];
    type F = [W::F; 2];
    #[inline(always)]
    unsafe fn zero_i() -> Self::I {
        // SAFETY (every method): the trait's contract, passed on to `W`'s; pointers cover
        // both halves (`LANES` lanes), the second half `W::LANES` lanes on.
        unsafe { [W::zero_i(); 2] }
    }
    #[inline(always)]
    unsafe fn zero_f() -> Self::F {
        unsafe { [W::zero_f(); 2] }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> Self::I {
        unsafe { [W::splat_i(v); 2] }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> Self::F {
        unsafe { [W::splat_f(v); 2] }
    }
    #[inline(always)]
    unsafe fn splat_f16(bits: i16) -> Self::F {
        unsafe { [W::splat_f16(bits); 2] }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> Self::I {
        unsafe { [W::load_i(p), W::load_i(p.add(4 * W::LANES))] }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const u8) -> Self::F {
        unsafe { [W::load_f(p), W::load_f(p.add(4 * W::LANES))] }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: Self::F) {
        unsafe {
            W::store_f(p, v[0]);
            W::store_f(p.add(W::LANES), v[1]);
        }
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: Self::I, a: Self::I, b: Self::I) -> Self::I {
        unsafe { [W::dpbusd(acc[0], a[0], b[0]), W::dpbusd(acc[1], a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn add_i(a: Self::I, b: Self::I) -> Self::I {
        unsafe { [W::add_i(a[0], b[0]), W::add_i(a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn cvt(a: Self::I) -> Self::F {
        unsafe { [W::cvt(a[0]), W::cvt(a[1])] }
    }
    #[inline(always)]
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F {
        unsafe { [W::mul(a[0], b[0]), W::mul(a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn add(a: Self::F, b: Self::F) -> Self::F {
        unsafe { [W::add(a[0], b[0]), W::add(a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn sub(a: Self::F, b: Self::F) -> Self::F {
        unsafe { [W::sub(a[0], b[0]), W::sub(a[1], b[1])] }
    }
    #[inline(always)]
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        unsafe { [W::fmadd(a[0], b[0], c[0]), W::fmadd(a[1], b[1], c[1])] }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F {
        unsafe { [W::fnmadd(a[0], b[0], c[0]), W::fnmadd(a[1], b[1], c[1])] }
    }
    #[inline(always)]
    unsafe fn ge_mask(a: Self::F, b: Self::F) -> u32 {
        unsafe { W::ge_mask(a[0], b[0]) | W::ge_mask(a[1], b[1]) << W::LANES }
    }
}

impl Width for Z {
    const LANES: usize = 16;
    type I = __m512i;
    type F = __m512;
    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        // SAFETY: the trait's contract (AVX-512 F).
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    unsafe fn zero_f() -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat_i(v: i32) -> __m512i {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    unsafe fn splat_f(v: f32) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    unsafe fn splat_f16(bits: i16) -> __m512 {
        // SAFETY: as `zero_i` (the conversion is AVX-512 F).
        unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(bits)) }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> __m512i {
        // SAFETY: the caller's pointer covers 64 bytes.
        unsafe { _mm512_loadu_si512(p as *const _) }
    }
    #[inline(always)]
    unsafe fn load_f(p: *const u8) -> __m512 {
        // SAFETY: the caller's pointer covers 64 bytes.
        unsafe { _mm512_loadu_ps(p as *const f32) }
    }
    #[inline(always)]
    unsafe fn store_f(p: *mut f32, v: __m512) {
        // SAFETY: the caller's pointer covers sixteen f32.
        unsafe { _mm512_storeu_ps(p, v) }
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: the trait's contract (AVX-512 VNNI).
        unsafe { _mm512_dpbusd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn add_i(a: __m512i, b: __m512i) -> __m512i {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m512i) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn add(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn sub(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn ge_mask(a: __m512, b: __m512) -> u32 {
        // SAFETY: as `zero_i`.
        unsafe { _mm512_cmp_ps_mask::<_CMP_GE_OQ>(a, b) as u32 }
    }
}

/// A thread's running judgement of its rows, in registers: each lane's bar (the
/// `top`-th largest lower end so far) and the finiteness check; the margin factor.
struct Judge<W: Width> {
    bar: W::F,
    check: W::F,
    cv: W::F,
    tiny: W::F,
    /// Lanes that are tokens (padding lanes reach their own lower end on every row).
    tokens: u32,
}

impl<W: Width> Judge<W> {
    /// Starts from `state`'s bars and check, for `nt` tokens and margin factor `c`.
    ///
    /// # Safety
    /// As [`Width`]'s methods.
    #[inline(always)]
    unsafe fn new(state: &PassState, c: f32, nt: usize) -> Self {
        assert!(W::LANES <= MAX_TOKENS);
        // SAFETY: the caller's contract; loads within `state`'s arrays of MAX_TOKENS ≥
        // W::LANES floats.
        unsafe {
            Judge {
                bar: W::load_f(state.bar.as_ptr() as *const u8),
                check: W::load_f(state.check.as_ptr() as *const u8),
                cv: W::splat_f(c),
                tiny: W::splat_f(TINY),
                tokens: (1u32 << nt.min(W::LANES)) - 1,
            }
        }
    }

    /// Files weight row `row` with approximations `approx` and bound sums `total`.
    ///
    /// # Safety
    /// As [`Width`]'s methods.
    #[inline(always)]
    unsafe fn row(
        &mut self,
        (approx, total): (W::F, W::F),
        row: usize,
        top: &[usize],
        state: &mut PassState,
    ) {
        // SAFETY: the caller's contract; stores and loads within arrays of MAX_TOKENS ≥
        // W::LANES floats.
        unsafe {
            let hi = W::add(W::fmadd(total, self.cv, approx), self.tiny);
            let lo = W::sub(W::fnmadd(total, self.cv, approx), self.tiny);
            let span = W::sub(hi, lo);
            self.check = W::add(self.check, W::sub(span, span));
            if W::ge_mask(hi, self.bar) & self.tokens != 0 {
                let mut ends = [f32::NEG_INFINITY; MAX_TOKENS];
                let mut lows = [f32::NEG_INFINITY; MAX_TOKENS];
                W::store_f(ends.as_mut_ptr(), hi);
                W::store_f(lows.as_mut_ptr(), lo);
                state.maybe.push((row as u32, ends));
                // A row below a lane's bar stays below it (`lo ≤ hi`): only rows that
                // reached it can raise it.
                for (t, &k) in top.iter().enumerate() {
                    if lows[t] > state.bar[t] {
                        state.file_lower(t, lows[t], k);
                    }
                }
                self.bar = W::load_f(state.bar.as_ptr() as *const u8);
            }
        }
    }

    /// Leaves the check in `state`.
    ///
    /// # Safety
    /// As [`Width`]'s methods.
    #[inline(always)]
    unsafe fn finish(self, state: &mut PassState) {
        // SAFETY: the caller's contract; MAX_TOKENS ≥ W::LANES floats.
        unsafe { W::store_f(state.check.as_mut_ptr(), self.check) }
    }
}

/// Every row of `w` (`row_bytes` each, block terms in `corr`, largest `|d_w|` in
/// `row_max`; the first is row `first` of the weight) against the layout's first
/// `top.len()` tokens (`totals`: their `X`): the lower ends, the finiteness check and the
/// rows that may be among the top into `state`.
///
/// # Safety
/// Inlined where `W`'s features are enabled (see [`pass_avx512`], [`pass_avx2`]); `w`
/// holds whole rows of `n_blocks` Q8_0 blocks and `corr` `n_blocks` terms per row; the
/// layout `W::LANES` lanes.
#[inline(always)]
unsafe fn pass<W: Width>(
    Rows {
        w,
        row_bytes,
        corr,
        row_max,
        lane_scales,
    }: Rows<'_>,
    (layout, n_blocks, c, totals): (&[u8], usize, f32, &[f32; MAX_TOKENS]),
    (first, top): (usize, &[usize]),
    state: &mut PassState,
) {
    let rows = w.len() / row_bytes;
    assert!(row_bytes >= n_blocks * Q8_0_BLOCK);
    assert!(row_max.len() >= rows);
    // The row-lane pass reads no block terms.
    assert!(corr.len() >= rows * n_blocks || W::ROW_LANES);
    assert!(layout.len() >= n_blocks * FIELDS * 4 * W::LANES);
    // The row-lane pass takes the groups that have lane scales.
    let lane_groups = match W::ROW_LANES {
        true => (lane_scales.len() / (n_blocks * LANE_ROWS).max(1)).min(rows / LANE_ROWS),
        false => 0,
    };
    // SAFETY (every block): the features per this function's contract.
    unsafe {
        let mut judge = Judge::<W>::new(state, c, top.len());
        let x_total = W::load_f(totals.as_ptr() as *const u8);
        let mut r = 0;
        while r < rows {
            let mut sums = [W::zero_f(); LANE_ROWS];
            let first4 = sums.first_chunk_mut::<ROWS>().expect("ROWS ≤ LANE_ROWS");
            let block = (
                &w[r * row_bytes..],
                row_bytes,
                corr.get(r * n_blocks..).unwrap_or(&[]),
            );
            // Whole rows from `r` on.
            let k = if W::ROW_LANES && r / LANE_ROWS < lane_groups {
                let scales = &lane_scales[r / LANE_ROWS * n_blocks * LANE_ROWS..];
                let layout = (layout, n_blocks, top.len());
                W::lane_row_sums((block.0, row_bytes, scales), layout, &mut sums);
                LANE_ROWS
            } else if W::ROW_LANES {
                // The last rows, fewer than a group (once per pass at most).
                let (group, scales) = padded_group(&w[r * row_bytes..], row_bytes, n_blocks);
                let layout = (layout, n_blocks, top.len());
                W::lane_row_sums((&group, row_bytes, &scales), layout, &mut sums);
                rows - r
            } else if W::GROUP_ROWS == 2 && rows - r >= 2 {
                W::row_sums::<2>(block, (layout, n_blocks), first4);
                2
            } else if W::GROUP_ROWS == ROWS && rows - r >= ROWS {
                W::row_sums::<ROWS>(block, (layout, n_blocks), first4);
                ROWS
            } else {
                W::row_sums::<1>(block, (layout, n_blocks), first4);
                1
            };
            for (i, &approx) in sums.iter().enumerate().take(k) {
                let total = W::mul(W::splat_f(row_max[r + i]), x_total);
                judge.row((approx, total), first + r + i, top, state);
            }
            r += k;
        }
        judge.finish(state);
    }
}

/// [`pass`] with AVX-512 F/BW/VL/VNNI (for [`Y<EvexRowLanes>`] and [`Z`]).
///
/// # Safety
/// The CPU has those features and F16C; otherwise as [`pass`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pass_avx512<W: Width>(
    rows: Rows<'_>,
    layout: (&[u8], usize, f32, &[f32; MAX_TOKENS]),
    at: (usize, &[usize]),
    state: &mut PassState,
) {
    // SAFETY: the caller's contract.
    unsafe { pass::<W>(rows, layout, at, state) }
}

/// [`pass`] with AVX2 and AVX-VNNI (for [`Y<Vex>`], [`Y<VexPaired>`] and [`Pair`]).
///
/// # Safety
/// The CPU has AVX2, FMA, F16C and AVX-VNNI; otherwise as [`pass`].
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn pass_avx2<W: Width>(
    rows: Rows<'_>,
    layout: (&[u8], usize, f32, &[f32; MAX_TOKENS]),
    at: (usize, &[usize]),
    state: &mut PassState,
) {
    // SAFETY: the caller's contract.
    unsafe { pass::<W>(rows, layout, at, state) }
}

/// Whether the CPU has AVX-VNNI (the VEX `vpdpbusd`).
pub(super) fn has_avx_vnni() -> bool {
    std::arch::is_x86_feature_detected!("avxvnni")
}

/// `R` consecutive rows (from the start of `w`, `row_bytes` apart; their block terms from
/// the start of `corr`) against the layout: for row `k`, the approximation
/// `Σ_b s_b·Σ w·x` (one FMA chain) into `sums[k]`.
///
/// # Safety
/// As [`pass`], with `R` whole rows in `w` and their terms in `corr`.
#[inline(always)]
unsafe fn row_sums<W: Width, const R: usize>(
    (w, row_bytes, corr): (&[u8], usize, &[BlockSum]),
    (layout, n_blocks): (&[u8], usize),
    sums: &mut [W::F; ROWS],
) {
    assert!(w.len() >= (R - 1) * row_bytes + n_blocks * Q8_0_BLOCK);
    assert!(corr.len() >= R * n_blocks);
    let reg = 4 * W::LANES;
    assert!(layout.len() >= n_blocks * FIELDS * reg);
    // SAFETY (every block): the features per the caller's contract; loads inside the
    // layout's block `b`, the rows' block `b` and their terms (asserted above).
    unsafe {
        let mut approx = [W::zero_f(); R];
        for b in 0..n_blocks {
            let xb = layout.as_ptr().add(b * FIELDS * reg);
            // Two independent chains of four quads per row (one chain of eight
            // `vpdpbusd` would wait on its own latency); integer sums, so their order is
            // free. Σ(w)·(x+128) − 128·Σw = Σ w·x: each starts at half the block's term.
            let mut acc = [[W::zero_i(); 2]; R];
            for (k, acc) in acc.iter_mut().enumerate() {
                let half = W::splat_i(half_term(*corr.get_unchecked(k * n_blocks + b)));
                *acc = [half, half];
                // Every row is read once per step: stream ahead, as decoding does.
                let row = &w[k * row_bytes..(k + 1) * row_bytes];
                crate::avx2::prefetch_block(row, b * Q8_0_BLOCK, Q8_0_BLOCK, R);
            }
            for j in 0..8 {
                let xu = W::load_i(xb.add(reg * j));
                for (k, acc) in acc.iter_mut().enumerate() {
                    let wq = w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK + 2 + 4 * j);
                    let wv = W::splat_i((wq as *const i32).read_unaligned());
                    acc[j % 2] = W::dpbusd(acc[j % 2], xu, wv);
                }
            }
            let dx = W::load_f(xb.add(8 * reg));
            for k in 0..R {
                let d_bits =
                    (w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK) as *const i16).read_unaligned();
                let s = W::mul(W::splat_f16(d_bits), dx);
                let sum = W::add_i(acc[k][0], acc[k][1]);
                approx[k] = W::fmadd(W::cvt(sum), s, approx[k]);
            }
        }
        sums[..R].copy_from_slice(&approx);
    }
}

/// [`row_sums`] with a token's quads in two lanes: lane `2t + e` of a block's quad
/// register `i` holds token `t`'s quad `2i + e`, so one 64-bit broadcast of a row's quads
/// `2i, 2i + 1` meets every token — four `vpdpbusd` per row and block instead of eight,
/// for four tokens on 256-bit registers ([`PairsY`], the AVX2 tier). The
/// activations are the signed side and each broadcast of weight quads the unsigned one
/// (`w + 128`, one xor), so both lanes of a token start at `−64·Σx` from the layout, the
/// same for every row: the pass reads no per-row block terms, whose 2 bytes a block were
/// 6 % of what it streams. A pair of rows' lanes then fold, exactly (integer sums), into
/// one register holding both rows' tokens, whose scales and FMA run at once. Every token's float steps are [`row_sums`]'s (the same `d_w·d_x`, the same
/// chain, the same exact integers), so the sums are its bits.
///
/// # Safety
/// As [`row_sums`], under `P`'s features, the layout paired ([`lay_out`]), eight lanes,
/// at most [`PairedWidth::TOKENS`] tokens in it.
#[inline(always)]
unsafe fn paired_row_sums<P: PairedWidth, const R: usize>(
    (w, row_bytes, _): (&[u8], usize, &[BlockSum]),
    (layout, n_blocks): (&[u8], usize),
    sums: &mut [__m256; ROWS],
) {
    const REG: usize = 32;
    assert!((1..=ROWS).contains(&R));
    assert!(w.len() >= (R - 1) * row_bytes + n_blocks * Q8_0_BLOCK);
    assert!(layout.len() >= n_blocks * FIELDS * REG);
    // SAFETY (every block): the features per the caller's contract; loads inside the
    // layout's block `b` and the rows' block `b` (asserted above).
    unsafe {
        let pairs = R.div_ceil(2);
        let partner = |p: usize| (2 * p, (2 * p + 1).min(R - 1));
        let mut approx = [P::zero_f(); ROWS / 2];
        for b in 0..n_blocks {
            let xb = layout.as_ptr().add(b * FIELDS * REG);
            let mut acc = [P::load_i(xb.add(START_FIELD * REG)); R];
            for k in 0..R {
                let row = &w[k * row_bytes..(k + 1) * row_bytes];
                crate::avx2::prefetch_block(row, b * Q8_0_BLOCK, Q8_0_BLOCK, R);
            }
            for i in 0..4 {
                let xs = P::load_i(xb.add(2 * REG * i));
                for (k, acc) in acc.iter_mut().enumerate() {
                    let wq = w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK + 2 + 8 * i);
                    *acc = P::dpbusd(*acc, P::splat_quads_unsigned(wq), xs);
                }
            }
            let dx = P::spread_dx(_mm256_loadu_ps(xb.add(8 * REG) as *const f32));
            for (p, approx) in approx.iter_mut().enumerate().take(pairs) {
                let (ra, rb) = partner(p);
                let d = |k: usize| {
                    let at = w.as_ptr().add(k * row_bytes + b * Q8_0_BLOCK);
                    (at as *const u16).read_unaligned()
                };
                let s = P::mul(P::scales(d(ra), d(rb)), dx);
                *approx = P::fmadd(P::cvt(P::fold(acc[ra], acc[rb])), s, *approx);
            }
        }
        for (p, &approx) in approx.iter().enumerate().take(pairs) {
            let (ra, rb) = partner(p);
            let (a, b) = P::split(approx);
            sums[ra] = a;
            if rb != ra {
                sums[rb] = b;
            }
        }
    }
}

/// [`row_sums`] for [`LANE_ROWS`] rows at once, one row per 32-bit lane: each block of
/// the sixteen rows is transposed in registers (sixteen 32-byte loads, twenty-four
/// shuffles) into eight registers, register `j` holding every row's quad `j`, flipped to
/// `w + 128` (the unsigned side); each token's quad `j` meets them all as `vpdpbusd`'s
/// broadcast memory operand, starting from the token's `−128·Σx`, so a row's whole block
/// sum lands in its lane with no folding, and one scale register (`scales`, the head's
/// lane table) serves the group. Eight `vpdpbusd` per token and sixteen rows: half the
/// vector instructions of [`paired_row_sums`] at eight tokens. Every token's float steps
/// are [`row_sums`]'s (the same `d_w·d_x`, the same chain, the same exact integers), so
/// the sums are its bits; they leave as `sums[row]` with token `t` in lane `t`.
///
/// # Safety
/// As [`row_sums`] under AVX-512 F/BW/VL/VNNI and F16C, with [`LANE_ROWS`] whole rows in
/// `w`, their lane scales (`[n_blocks, LANE_ROWS]`) from the start of `scales`, the
/// layout [`Arrangement::RowLanes`] of eight lanes.
#[inline(never)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn lane_row_sums<const NT: usize>(
    (w, row_bytes, scales): (&[u8], usize, &[u16]),
    (layout, n_blocks): (&[u8], usize),
    sums: &mut [__m256; LANE_ROWS],
) {
    assert!(NT <= 8);
    const REG: usize = 32;
    // At least one block: the first is loaded before the loop.
    assert!(n_blocks >= 1 && w.len() >= (LANE_ROWS - 1) * row_bytes + n_blocks * Q8_0_BLOCK);
    assert!(scales.len() >= n_blocks * LANE_ROWS);
    assert!(layout.len() >= n_blocks * FIELDS * REG);
    // SAFETY (every block): the features per the caller's contract; loads inside the
    // rows' block `b`, the scales' block `b` and the layout's block `b` (asserted above).
    unsafe {
        let flip = crate::avx512::opaque_512(_mm512_set1_epi8(-128));
        let mut approx = [_mm512_setzero_ps(); NT];
        // Each block's sixteen rows are loaded and transposed one block ahead of their
        // products: the rows come from L2 or farther, and loaded at the top of their own
        // block (as before) the products waited on them — about 170 instructions a
        // block leave the next block's loads too late in the reorder window
        // (`benches/batched` `bounded-cached/…/8`: 355 → 337 µs; in the registers
        // alone, `benches/pipes` `lane_block`, a block takes 5.5 cycles a row against
        // 7.6 read from L2 or L3 before this).
        let mut next = transpose_quads(w.as_ptr().add(2), row_bytes);
        for b in 0..n_blocks {
            let xb = layout.as_ptr().add(b * FIELDS * REG);
            // The group after next, one line per row and block (`prefetch_block`'s
            // distance for rows read side by side: 12 KiB ahead ran as fast, 8 KiB at
            // half the speed, `benches/batched`).
            for k in 0..LANE_ROWS {
                let row = &w[k * row_bytes..(k + 1) * row_bytes];
                crate::avx2::prefetch_block(row, b * Q8_0_BLOCK, Q8_0_BLOCK, LANE_ROWS);
            }
            let mut quads = next;
            // The last block loads itself again (no branch; already in L1).
            let ahead = (b + 1).min(n_blocks - 1);
            next = transpose_quads(w.as_ptr().add(ahead * Q8_0_BLOCK + 2), row_bytes);
            for q in &mut quads {
                *q = _mm512_xor_si512(*q, flip);
            }
            let d_w = _mm512_cvtph_ps(_mm256_loadu_si256(
                scales.as_ptr().add(b * LANE_ROWS) as *const _
            ));
            let lane = |field: usize, t: usize| {
                (xb.add(field * REG + 4 * t) as *const i32).read_unaligned()
            };
            // Only the layout's tokens: the padding lanes' sums stay 0.
            for (t, approx) in approx.iter_mut().enumerate() {
                let mut acc = _mm512_set1_epi32(lane(START_FIELD, t));
                for (j, &q) in quads.iter().enumerate() {
                    acc = _mm512_dpbusd_epi32(acc, q, _mm512_set1_epi32(lane(j, t)));
                }
                let dx = _mm512_set1_ps(f32::from_bits(lane(8, t) as u32));
                let s = _mm512_mul_ps(d_w, dx);
                *approx = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, *approx);
            }
        }
        let mut all = [_mm512_setzero_ps(); 8];
        all[..NT].copy_from_slice(&approx);
        *sums = transpose_sums(all);
    }
}

/// `rows` (fewer than [`LANE_ROWS`] whole rows of `n_blocks` Q8_0 blocks, `row_bytes`
/// apart) followed by zero rows (scale 0: sums 0) to a group, and the group's lane scales.
fn padded_group(rows: &[u8], row_bytes: usize, n_blocks: usize) -> (Vec<u8>, Vec<u16>) {
    let mut group = vec![0u8; LANE_ROWS * row_bytes];
    group[..rows.len()].copy_from_slice(rows);
    let mut scales = vec![0u16; n_blocks * LANE_ROWS];
    super::group_scales(&group, row_bytes, &mut scales);
    (group, scales)
}

/// Eight tokens' registers of [`LANE_ROWS`] rows (lane `k`: row `k`) as each row's
/// register of eight tokens (lane `t`: token `t`).
///
/// # Safety
/// AVX-512 F enabled.
#[inline(always)]
unsafe fn transpose_sums(a: [__m512; 8]) -> [__m256; LANE_ROWS] {
    // SAFETY: the caller's contract.
    unsafe {
        let pd = _mm512_castps_pd;
        // The same 4×4 transposes as the quads' (bits moved, not computed; once a group).
        let u = transpose_lanes4(a.map(|v| _mm512_castps_si512(v))).map(|v| _mm512_castsi512_ps(v));
        // `u[i]`'s 128-bit lane `l`: tokens 0–3 of row `4l + i`; `u[4 + i]`: tokens 4–7.
        let low = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
        let high = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
        let mut out = [_mm256_setzero_ps(); LANE_ROWS];
        for i in 0..4 {
            for (l, idx) in [(0, low), (2, high)] {
                let v = _mm512_permutex2var_ps(u[i], idx, u[i + 4]);
                out[4 * l + i] = _mm512_castps512_ps256(v);
                out[4 * (l + 1) + i] = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(pd(v)));
            }
        }
        out
    }
}

/// A register width of [`paired_row_sums`]: where a folded pair of rows keeps each
/// token, and the operations the pass takes.
///
/// # Safety
/// The methods may only be called where the width's features are enabled.
trait PairedWidth {
    /// Tokens a register holds (two lanes each).
    const TOKENS: usize;
    type I: Copy;
    type F: Copy;
    unsafe fn zero_f() -> Self::F;
    /// A quad register of the paired layout at `p`.
    unsafe fn load_i(p: *const u8) -> Self::I;
    /// The eight bytes at `p` plus 128 (as unsigned bytes: xor `0x80`) in every 64-bit
    /// lane.
    unsafe fn splat_quads_unsigned(p: *const u8) -> Self::I;
    /// `acc + Σ a·b` per lane (`a` unsigned, `b` signed bytes).
    unsafe fn dpbusd(acc: Self::I, a: Self::I, b: Self::I) -> Self::I;
    /// Token lanes' sums of rows `a` and `b` into one register.
    unsafe fn fold(a: Self::I, b: Self::I) -> Self::I;
    /// The tokens' scales `d_x` (lane `t`) where [`Self::fold`] keeps token `t`.
    unsafe fn spread_dx(dx: __m256) -> Self::F;
    /// The f16 scales `da` of row `a` and `db` of row `b` where [`Self::fold`] keeps them.
    unsafe fn scales(da: u16, db: u16) -> Self::F;
    unsafe fn cvt(a: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    /// `a·b + c`, one rounding.
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Rows `a` and `b` of a folded register, token `t` in lane `t` (the other lanes
    /// finite).
    unsafe fn split(v: Self::F) -> (__m256, __m256);
}

/// Four tokens on 256-bit registers (AVX2, AVX-VNNI, FMA, F16C): one `vphaddd` folds a
/// pair of rows into `[a₀ a₁ b₀ b₁ | a₂ a₃ b₂ b₃]`.
/// `D` gives the `vpdpbusd` encoding: VEX (AVX-VNNI) in the pass, EVEX (AVX-512 VL) in
/// a test, so that the width's layout and folding are checked on CPUs without AVX-VNNI.
struct PairsY<D>(PhantomData<D>);

impl<D: Dpbusd256> PairedWidth for PairsY<D> {
    const TOKENS: usize = 4;
    type I = __m256i;
    type F = __m256;
    #[inline(always)]
    unsafe fn zero_f() -> __m256 {
        // SAFETY (every method): the trait's contract; pointers cover what they load.
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn load_i(p: *const u8) -> __m256i {
        unsafe { _mm256_loadu_si256(p as *const _) }
    }
    #[inline(always)]
    unsafe fn splat_quads_unsigned(p: *const u8) -> __m256i {
        unsafe {
            // The bias opaque: else LLVM xors the 8 bytes first and broadcasts them
            // by a shuffle, where a broadcast load needs no vector pipe.
            let quads = _mm256_set1_epi64x((p as *const i64).read_unaligned());
            _mm256_xor_si256(quads, crate::avx512::opaque_256(_mm256_set1_epi8(-128)))
        }
    }
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        unsafe { D::dpbusd(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn fold(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_hadd_epi32(a, b) }
    }
    #[inline(always)]
    unsafe fn spread_dx(dx: __m256) -> __m256 {
        unsafe { _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3)) }
    }
    #[inline(always)]
    unsafe fn scales(da: u16, db: u16) -> __m256 {
        let (da, db) = (da as u64, db as u64);
        let bits = da | da << 16 | db << 32 | db << 48;
        unsafe { _mm256_cvtph_ps(_mm_set1_epi64x(bits as i64)) }
    }
    #[inline(always)]
    unsafe fn cvt(a: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(a) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn split(v: __m256) -> (__m256, __m256) {
        unsafe {
            let a = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
            let b = _mm256_permutevar8x32_ps(v, _mm256_setr_epi32(2, 3, 6, 7, 0, 1, 4, 5));
            (a, b)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::block_sum;
    use crate::QuantizedActs;

    /// `n_rows` random Q8_0 rows of `n_blocks` blocks (quants over their whole range,
    /// −128 included, scales of either sign), their block terms, and `nt` random tokens'
    /// activations quantized for them.
    fn fixture(
        bits: &mut crate::test_bits::Bits,
        (n_blocks, n_rows, nt): (usize, usize, usize),
    ) -> (Vec<u8>, Vec<BlockSum>, QuantizedActs) {
        let mut w = vec![0u8; n_rows * n_blocks * Q8_0_BLOCK];
        for block in w.chunks_exact_mut(Q8_0_BLOCK) {
            let d = half::f16::from_f32((bits.next() % 2000) as f32 / 1000.0 - 1.0);
            block[..2].copy_from_slice(&d.to_bits().to_le_bytes());
            block[2..].iter_mut().for_each(|q| *q = bits.next() as u8);
        }
        let terms: Vec<BlockSum> = w.chunks_exact(Q8_0_BLOCK).map(block_sum).collect();
        let x: Vec<f32> = (0..nt * n_blocks * 32)
            .map(|_| (bits.next() % 20001) as f32 / 1000.0 - 10.0)
            .collect();
        let mut acts = QuantizedActs::new();
        acts.quantize_for(&q8_0_weight(&w, (n_blocks, n_rows)), &x, nt)
            .unwrap();
        (w, terms, acts)
    }

    /// The `nt` tokens of `acts` laid out in eight lanes for the one-quad pass and as
    /// `other`.
    fn plain_and(
        other: Arrangement,
        acts: &QuantizedActs,
        (n_blocks, nt): (usize, usize),
    ) -> (Vec<u8>, Vec<u8>) {
        let (mut plain, mut out) = (Vec::new(), Vec::new());
        lay_out(
            acts,
            (0, nt),
            (n_blocks, 8, Arrangement::Plain(0x80)),
            &mut plain,
        );
        lay_out(acts, (0, nt), (n_blocks, 8, other), &mut out);
        (plain, out)
    }

    /// `w` as a Q8_0 weight of `n_rows` rows of `n_blocks` blocks.
    fn q8_0_weight(w: &[u8], (n_blocks, n_rows): (usize, usize)) -> LazyWeight<'_> {
        let shape = [(n_blocks * 32) as u64, n_rows as u64];
        LazyWeight::from_parts(nx_gguf::GgmlType::Q8_0, &shape, w).unwrap()
    }

    /// Sums by two passes of eight lanes, as `[row][lane]` bits: `R` rows by pass `A` on
    /// the plain layout and by pass `B` on the paired one.
    ///
    /// # Safety
    /// Inlined where both passes' features are enabled; as [`row_sums`] otherwise.
    #[inline(always)]
    unsafe fn twin<A, B, const R: usize>(
        rows: (&[u8], usize, &[BlockSum]),
        (plain, paired, n_blocks): (&[u8], &[u8], usize),
    ) -> [[[u32; 8]; ROWS]; 2]
    where
        A: Width<F = __m256>,
        B: Width<F = __m256>,
    {
        let mut sums = [[_mm256_setzero_ps(); ROWS]; 2];
        // SAFETY: the caller's contract; the callees assert that the rows, terms and
        // layouts are whole.
        unsafe {
            A::row_sums::<R>(rows, (plain, n_blocks), &mut sums[0]);
            B::row_sums::<R>(rows, (paired, n_blocks), &mut sums[1]);
        }
        // SAFETY: a 256-bit register is eight f32 (any bits are valid u32).
        sums.map(|rows| rows.map(|r| unsafe { std::mem::transmute::<__m256, [u32; 8]>(r) }))
    }

    /// [`PairsY`] with AVX-512's EVEX `vpdpbusd` (the same products as AVX-VNNI's).
    struct EvexPairedY;

    impl Dpbusd256 for EvexPairedY {
        const QUADS: Quads = Quads::PairsYmm;
        #[inline(always)]
        unsafe fn dpbusd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
            // SAFETY: the trait's contract.
            unsafe { Evex::dpbusd(acc, a, b) }
        }
    }

    /// [`twin`] of the 256-bit one-quad pass and the 256-bit paired one, both EVEX.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn both_y<const R: usize>(
        rows: (&[u8], usize, &[BlockSum]),
        layouts: (&[u8], &[u8], usize),
    ) -> [[[u32; 8]; ROWS]; 2] {
        // SAFETY: as `both`.
        unsafe { twin::<Y<Evex>, Y<EvexPairedY>, R>(rows, layouts) }
    }

    /// [`twin`] of AVX-VNNI's one-quad pass and its 256-bit paired one.
    #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
    unsafe fn both_vex<const R: usize>(
        rows: (&[u8], usize, &[BlockSum]),
        layouts: (&[u8], &[u8], usize),
    ) -> [[[u32; 8]; ROWS]; 2] {
        // SAFETY: as `both`.
        unsafe { twin::<Y<Vex>, Y<VexPaired>, R>(rows, layouts) }
    }

    /// The paired passes' approximations are the one-quad passes' bits, lane for lane:
    /// one to four tokens on 256-bit registers (AVX-VNNI, and the same width with
    /// AVX-512's encoding), groups of four rows and single rows,
    /// quants over their whole range (−128 included), scales of either sign.
    #[test]
    fn the_paired_pass_gives_the_256_bit_pass_bits() {
        let (zmm, ymm) = (crate::avx512::available(), has_avx_vnni());
        let (n_blocks, n_rows) = (5, 4);
        let row_bytes = n_blocks * Q8_0_BLOCK;
        let mut bits = crate::test_bits::Bits(0x2545_f491_4f6c_dd1d);
        for case in 0..24 {
            let nt = 1 + case % 4;
            let (w, terms, acts) = fixture(&mut bits, (n_blocks, n_rows, nt));
            let (plain, paired) = plain_and(Arrangement::Paired, &acts, (n_blocks, nt));
            let layouts = (&plain[..], &paired[..], n_blocks);
            let (all, last) = (
                (&w[..], row_bytes, &terms[..]),
                (&w[row_bytes..], row_bytes, &terms[n_blocks..]),
            );
            // Lanes of real tokens (the 256-bit paired pass fills the rest with another
            // row's), of `rows` rows.
            let check = |[a, b]: [[[u32; 8]; ROWS]; 2], rows: usize, lanes: usize, tag: &str| {
                for r in 0..rows {
                    assert_eq!(a[r][..lanes], b[r][..lanes], "row {r}, {nt} tokens, {tag}");
                }
            };
            if zmm {
                // SAFETY: the features were checked above.
                let (four, one) =
                    unsafe { (both_y::<4>(all, layouts), both_y::<1>(last, layouts)) };
                check(four, 4, nt, "256-bit EVEX");
                check(one, 1, nt, "256-bit EVEX, one row");
            }
            if ymm {
                // SAFETY: the features were checked above.
                let (four, one) =
                    unsafe { (both_vex::<4>(all, layouts), both_vex::<1>(last, layouts)) };
                check(four, 4, nt, "256-bit");
                check(one, 1, nt, "256-bit, one row");
            }
        }
    }

    /// The row-lane pass of sixteen rows against the 256-bit one-quad pass, both under
    /// AVX-512, as `[row][lane]` bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn lanes_and_plain(
        (w, row_bytes, terms, scales): (&[u8], usize, &[BlockSum], &[u16]),
        (plain, lanes, n_blocks, nt): (&[u8], &[u8], usize, usize),
    ) -> [[[u32; 8]; LANE_ROWS]; 2] {
        let mut out = [[_mm256_setzero_ps(); LANE_ROWS]; 2];
        // SAFETY: the features are enabled here (the caller checked the CPU); the callees
        // assert that the rows, terms, scales and layouts are whole.
        unsafe {
            for (k, sum) in out[0].iter_mut().enumerate() {
                let mut one = [_mm256_setzero_ps(); ROWS];
                let row = (&w[k * row_bytes..], row_bytes, &terms[k * n_blocks..]);
                Y::<Evex>::row_sums::<1>(row, (plain, n_blocks), &mut one);
                *sum = one[0];
            }
            Y::<EvexRowLanes>::lane_row_sums(
                (w, row_bytes, scales),
                (lanes, n_blocks, nt),
                &mut out[1],
            );
        }
        // SAFETY: a 256-bit register is eight f32 (any bits are valid u32).
        out.map(|rows| rows.map(|r| unsafe { std::mem::transmute::<__m256, [u32; 8]>(r) }))
    }

    /// The row-lane pass's approximations are the one-quad pass's bits for every row and
    /// token: one to eight tokens, one to six blocks, quants over their whole range,
    /// scales of either sign; and the head's lane table holds each whole group's scales
    /// (none for a last, partial group).
    #[test]
    fn the_row_lane_pass_gives_the_256_bit_pass_bits() {
        if !crate::avx512::available() {
            eprintln!("skipped: no AVX-512 VNNI");
            return;
        }
        let mut bits = crate::test_bits::Bits(0x9e37_79b9_7f4a_7c15);
        for case in 0..16 {
            let (n_blocks, n_rows, nt) = (1 + case % 6, LANE_ROWS + case % 3, 1 + case % 8);
            let row_bytes = n_blocks * Q8_0_BLOCK;
            let (w, terms, acts) = fixture(&mut bits, (n_blocks, n_rows, nt));
            let weight = q8_0_weight(&w, (n_blocks, n_rows));
            let scales = crate::bounded::lane_scales(&weight, &ThreadPool::new(1), n_blocks);
            assert_eq!(scales.len(), n_blocks * LANE_ROWS, "one whole group");
            let (plain, lanes) = plain_and(Arrangement::RowLanes, &acts, (n_blocks, nt));
            // SAFETY: the features were checked above.
            let [a, b] = unsafe {
                lanes_and_plain(
                    (&w, row_bytes, &terms, &scales),
                    (&plain, &lanes, n_blocks, nt),
                )
            };
            for r in 0..LANE_ROWS {
                assert_eq!(
                    a[r][..nt],
                    b[r][..nt],
                    "row {r}, {nt} tokens, {n_blocks} blocks"
                );
            }
        }
    }
}
