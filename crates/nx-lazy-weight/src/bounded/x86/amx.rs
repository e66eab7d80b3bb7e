//! The bound pass on AMX-INT8: one `tdpbssd` gives sixteen weight rows' integer dot
//! products with sixteen tokens for one block (the weight tile read straight from the
//! rows, 32 quants each; the activation tile the layout's eight quad registers of signed
//! quants), so the vector units only turn each row's products into its float chain:
//! a conversion, the block's scale `d_w·d_x` and one FMA per row and block.
//!
//! The products of block `b` are stored while the chains take those of block `b − 1`
//! (two tile sets in turn: tmm2/tmm4 → tmm0 and tmm3/tmm7 → tmm1 of
//! [`crate::amx`]'s tile configuration).

use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;

use super::{Judge, PassState, Width, FIELDS, Z};
use crate::bounded::{MAX_TOKENS, Q8_0_BLOCK};

/// Weight rows per tile.
const GROUP: usize = crate::amx::ROWS;
/// Groups ahead whose rows are prefetched (into L2).
const AHEAD: usize = 3;
/// Bytes of one layout register: sixteen lanes.
const REG: usize = 4 * MAX_TOKENS;

/// One tile of i32 products, `[row][token]`, aligned for `tilestored`.
#[repr(C, align(64))]
struct Products([i32; GROUP * MAX_TOKENS]);

/// Every row of `w` (`row_bytes` each, the first row `first` of the weight; `row_max`
/// each row's largest `|d_w|`) against the
/// layout's first `top.len()` tokens (`totals`: their `X`): the lower ends, the finiteness
/// check and the rows that may be among the top into `state`.
///
/// # Safety
/// [`crate::amx::available`] is true (AMX-TILE/INT8 permitted; AVX-512 F/BW/VL/VNNI and
/// F16C); the layout is sixteen lanes of signed quants.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn pass(
    (w, row_bytes, row_max): (&[u8], usize, &[f32]),
    (layout, n_blocks, c, totals): (&[u8], usize, f32, &[f32; MAX_TOKENS]),
    (first, top): (usize, &[usize]),
    state: &mut PassState,
) {
    let rows = w.len() / row_bytes;
    assert!(n_blocks > 0 && row_bytes >= n_blocks * Q8_0_BLOCK);
    assert!(row_max.len() >= rows);
    assert!(layout.len() >= n_blocks * FIELDS * REG);
    let mut products = MaybeUninit::<[Products; 2]>::uninit();
    let products = products.as_mut_ptr() as *mut Products;
    let mut tail = Vec::new();
    // SAFETY (every block): the features and tile permission per this function's
    // contract; the tile configuration loaded here is released below.
    unsafe {
        crate::amx::tiles_begin();
        let mut judge = Judge::<Z>::new(state, c, top.len());
        let x_total = Z::load_f(totals.as_ptr() as *const u8);
        let mut approx = [_mm512_setzero_ps(); GROUP];
        let mut r = 0;
        while r < rows {
            let n = (rows - r).min(GROUP);
            let group = if n == GROUP {
                &w[r * row_bytes..(r + GROUP) * row_bytes]
            } else {
                // The last rows, padded with zero rows to a whole tile.
                tail.clear();
                tail.resize(GROUP * row_bytes, 0);
                tail[..n * row_bytes].copy_from_slice(&w[r * row_bytes..(r + n) * row_bytes]);
                &tail[..]
            };
            // The next group's rows, to stream in meanwhile: a tile load of sixteen rows
            // that miss the cache waits on sixteen lines, which the hardware prefetchers,
            // seeing sixteen strided streams, do not fetch early enough.
            let next = w.as_ptr().wrapping_add((r + AHEAD * GROUP) * row_bytes);
            let next_len = (rows.saturating_sub(r + AHEAD * GROUP)).min(GROUP) * row_bytes;
            group_sums(
                group,
                row_bytes,
                (layout, n_blocks),
                products,
                (next, next_len),
                &mut approx,
            );
            for (i, &a) in approx.iter().enumerate().take(n) {
                let total = Z::mul(Z::splat_f(row_max[r + i]), x_total);
                judge.row((a, total), first + r + i, top, state);
            }
            r += n;
        }
        judge.finish(state);
        crate::amx::tiles_end();
    }
}

/// Sixteen rows (`w`, `row_bytes` apart)
/// against the layout: each row's approximation `Σ_b s_b·Σ w·x` (one FMA chain, sixteen
/// tokens per register).
///
/// # Safety
/// As [`pass`], after [`crate::amx::tiles_begin`]; `products` points to two writable
/// [`Products`].
#[inline(always)]
unsafe fn group_sums(
    w: &[u8],
    row_bytes: usize,
    (layout, n_blocks): (&[u8], usize),
    products: *mut Products,
    (next, next_len): (*const u8, usize),
    out: &mut [__m512; GROUP],
) {
    // Lines of the next group to prefetch per block.
    let lines = next_len.div_ceil(64).div_ceil(n_blocks);
    assert!(w.len() >= (GROUP - 1) * row_bytes + n_blocks * Q8_0_BLOCK);
    assert!(layout.len() >= n_blocks * FIELDS * REG);
    // SAFETY (every block): the caller's contract; tile reads inside the rows' block `b`
    // quants (16 rows of 32 bytes) and the layout's block `b` (8 registers), as asserted.
    unsafe {
        // The chains, a local array indexed by constants only, so they stay in registers
        // (were they `out`, memory that a tile store may write as far as the compiler
        // knows, each store would spill and reload them all).
        let mut approx = [_mm512_setzero_ps(); GROUP];
        // Block `b`'s products start while block `b − 1`'s, started an iteration ago,
        // are stored and block `b − 2`'s, stored an iteration ago, join the chains: a
        // tile store waits for its products and a load waits for its store.
        for b in 0..n_blocks + 2 {
            if b < n_blocks {
                for line in b * lines..((b + 1) * lines).min(next_len.div_ceil(64)) {
                    _mm_prefetch::<_MM_HINT_T1>(next.wrapping_add(64 * line) as *const i8);
                }
                let quants = w.as_ptr().add(b * Q8_0_BLOCK + 2);
                start_products(
                    quants,
                    row_bytes,
                    layout.as_ptr().add(b * FIELDS * REG),
                    b % 2,
                );
            }
            if (1..=n_blocks).contains(&b) {
                store_products(products.add((b - 1) % 2) as *mut i32, (b - 1) % 2);
            }
            if b >= 2 {
                let b = b - 2;
                let p = products.add(b % 2) as *const i32;
                let dx =
                    _mm512_loadu_ps(layout.as_ptr().add(b * FIELDS * REG + 8 * REG) as *const f32);
                for (i, approx) in approx.iter_mut().enumerate() {
                    let d_bits = (w.as_ptr().add(i * row_bytes + b * Q8_0_BLOCK) as *const i16)
                        .read_unaligned();
                    let s = Z::mul(Z::splat_f16(d_bits), dx);
                    let sum = _mm512_load_si512(p.add(MAX_TOKENS * i) as *const _);
                    *approx = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), s, *approx);
                }
            }
        }
        *out = approx;
    }
}

/// Loads a block's weight tile (16 rows of 32 quants from `quants`, `row_bytes` apart) and
/// activation tile (8 registers from `acts`) into tile set `set` and starts their
/// products.
///
/// # Safety
/// [`crate::amx::tiles_begin`] ran on this thread; the addresses are readable for the
/// tile shapes.
#[inline(always)]
unsafe fn start_products(quants: *const u8, row_bytes: usize, acts: *const u8, set: usize) {
    // One set's instructions; tile registers are named in the instruction text.
    macro_rules! start {
        ($c:literal, $a:literal, $b:literal) => {
            asm!(
                concat!("tileloadd ", $a, ", [{w} + {ws}*1]"),
                concat!("tileloadd ", $b, ", [{x} + {xs}*1]"),
                concat!("tilezero ", $c),
                concat!("tdpbssd ", $c, ", ", $a, ", ", $b),
                w = in(reg) quants,
                ws = in(reg) row_bytes,
                x = in(reg) acts,
                xs = in(reg) REG,
                options(nostack, readonly),
            )
        };
    }
    // SAFETY: the caller's contract.
    unsafe {
        if set == 0 {
            start!("tmm0", "tmm2", "tmm4");
        } else {
            start!("tmm1", "tmm3", "tmm7");
        }
    }
}

/// Stores tile set `set`'s products (16 rows of 64 bytes) to `out`.
///
/// # Safety
/// As [`start_products`], which ran before for `set`; `out` is valid for those writes and
/// 64-byte aligned.
#[inline(always)]
unsafe fn store_products(out: *mut i32, set: usize) {
    // SAFETY: the caller's contract.
    unsafe {
        if set == 0 {
            asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) out, s = in(reg) REG, options(nostack));
        } else {
            asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) out, s = in(reg) REG, options(nostack));
        }
    }
}
