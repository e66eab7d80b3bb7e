//! AMX-INT8 tiles for the Q4_K and Q6_K prefill matmul, each output still bit-identical
//! to the single-token kernel.
//!
//! A K-format lane integer is `Σ_g sc_g·Σ_k q·x` over the 32 quants of lane `l` in the
//! eight 32-quant groups `g` of a super-block (positions `32g + 4l + k`). With the scale
//! folded into the weight, `w = q·sc`, it is one plain dot product of 32 bytes —
//! except that `w` needs more than eight bits (Q4_K: 0..945, Q6_K: −8064..8001). So `w`
//! is split exactly into `lo = w & 255` (unsigned) and `hi = w >> 8` (signed) and the
//! lane is `Σ lo·x + 256·Σ hi·x`, two int8 tile products: `tdpbusd` and `tdpbssd` of
//! sixteen weight rows (one lane's 32 bytes each) with sixteen tokens (the same lane's
//! quants, which the Q8_K tiles of [`crate::tiled`] already hold in tile-row order).
//! Integer sums are exact, so each 16 × 16 block of lane integers equals the per-output
//! kernel's; the float chain (one FMA per lane and super-block, the final lane sum) is
//! then run sixteen tokens per register as in [`crate::tiled`].
//!
//! Requires the CPU's AMX-TILE and AMX-INT8 and the kernel's permission for the tile
//! data (`nx_syscalls::request_amx_tile_data`); `NX_AMX=0` turns it off.

use std::arch::asm;
use std::arch::x86_64::*;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

use nx_gguf::GgmlType;

use crate::act_tiles::{ACTK_BLOCK, ACTK_BSUMS, ACTK_DX, ACTK_MINS};
use crate::formats::{q4_k, q6_k, read_f16, scales_mins_k4_packed, Q4_K_BYTES, Q6_K_BYTES};

/// Layout of a block of [`ROWS`] unpacked weight rows of `n_sb` super-blocks: first the
/// lane bytes, `[super-block][lane][row]` records of [`LANE_RECORD`] bytes (32 `lo`
/// bytes, then 32 `hi`), so the sixteen rows of one (super-block, lane) tile are 1 KiB
/// in a row; then the per-(super-block, row) scalars, [`SCALAR_RECORD`] bytes each:
/// `d_w` and `−dmin_w` (f32), the four min pairs (Q4_K), the eight bsum-scale pairs
/// (Q6_K).
const LANE_RECORD: usize = 64;
const SB_LANE_BYTES: usize = 8 * ROWS * LANE_RECORD;
const SCALAR_RECORD: usize = 64;
const W_D: usize = 0;
const W_MINS: usize = 8;
const W_BSUMS: usize = 24;

/// Weight rows per tile (and per unpacked block of rows).
pub(crate) const ROWS: usize = 16;

/// True when the AMX path can run: AVX-512 VNNI tier features, AMX-TILE and AMX-INT8 in
/// CPUID, tile data permitted by the kernel, and `NX_AMX` not `0`/`off`.
pub(crate) fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        if matches!(std::env::var("NX_AMX").as_deref(), Ok("0" | "off")) {
            return false;
        }
        if !crate::avx512::available() {
            return false;
        }
        // CPUID leaf 7, sub-leaf 0: EDX bit 24 AMX-TILE, bit 25 AMX-INT8.
        let leaf = __cpuid_count(7, 0);
        if leaf.edx & (1 << 24) == 0 || leaf.edx & (1 << 25) == 0 {
            return false;
        }
        nx_syscalls::request_amx_tile_data()
    })
}

/// Weight types the AMX path handles.
pub(crate) fn has_kernel(weight_type: GgmlType) -> bool {
    matches!(weight_type, GgmlType::Q4_K | GgmlType::Q6_K)
}

/// The 8 × 8 dword transpose `[g][l] → [l][g]`: input `g2[i]` holds groups `2i, 2i+1`
/// (dword `8·(g%2) + l` of `g2[g/2]` is `(g, l)`); output `t[j]` holds lanes `2j, 2j+1`
/// (dword `8·(l%2) + g` of `t[l/2]`).
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose_groups_to_lanes(g2: [__m512i; 4]) -> [__m512i; 4] {
    // Stage A: p[a][b], dword 4l' + g' = (g = 4a + g', l = 4b + l').
    let idx_a = |b: i32| {
        let mut v = [0i32; 16];
        for (i, e) in v.iter_mut().enumerate() {
            let (lp, gp) = (i as i32 / 4, i as i32 % 4);
            *e = (gp / 2) * 16 + 8 * (gp % 2) + 4 * b + lp;
        }
        // SAFETY: reading 16 i32 from a 16-element array.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let (ia0, ia1) = (idx_a(0), idx_a(1));
    let p = [
        [
            _mm512_permutex2var_epi32(g2[0], ia0, g2[1]),
            _mm512_permutex2var_epi32(g2[0], ia1, g2[1]),
        ],
        [
            _mm512_permutex2var_epi32(g2[2], ia0, g2[3]),
            _mm512_permutex2var_epi32(g2[2], ia1, g2[3]),
        ],
    ];
    // Stage B: t[j], dword 8m + g = (g, l = 2j + m), from p[g/4][j/2] dword 4l' + g%4
    // with l' = 2(j%2) + m.
    let idx_b = |jj: i32| {
        let mut v = [0i32; 16];
        for (i, e) in v.iter_mut().enumerate() {
            let (m, g) = (i as i32 / 8, i as i32 % 8);
            *e = (g / 4) * 16 + 4 * (2 * jj + m) + g % 4;
        }
        // SAFETY: as above.
        unsafe { _mm512_loadu_si512(v.as_ptr() as *const _) }
    };
    let (ib0, ib1) = (idx_b(0), idx_b(1));
    [
        _mm512_permutex2var_epi32(p[0][0], ib0, p[1][0]),
        _mm512_permutex2var_epi32(p[0][0], ib1, p[1][0]),
        _mm512_permutex2var_epi32(p[0][1], ib0, p[1][1]),
        _mm512_permutex2var_epi32(p[0][1], ib1, p[1][1]),
    ]
}

/// Writes lane-ordered quants `t` (see [`transpose_groups_to_lanes`]) times the
/// per-(lane, group) scales as `lo`/`hi` byte records, lane `l`'s at `lane_stride·l`.
/// `scales(l)` is the 32 words `sc(g)` for `g = 0..8`, each repeated four times.
///
/// # Safety
/// `out` holds at least `7·lane_stride + 64` bytes.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn put_lanes(
    t: [__m512i; 4],
    scales: impl Fn(usize) -> __m512i,
    out: &mut [u8],
    lane_stride: usize,
) {
    assert!(out.len() >= 7 * lane_stride + 64);
    for l in 0..8 {
        let half = if l % 2 == 0 {
            _mm512_castsi512_si256(t[l / 2])
        } else {
            _mm512_extracti64x4_epi64::<1>(t[l / 2])
        };
        let w = _mm512_mullo_epi16(_mm512_cvtepu8_epi16(half), scales(l));
        // Each 128-bit lane's eight low bytes, then its eight high bytes (a word's high
        // byte is `w >> 8`, arithmetic); then the lanes' low halves before their high ones:
        // the record's 32 `lo` bytes and 32 `hi` bytes in one store.
        let split = _mm512_shuffle_epi8(w, low_then_high_bytes());
        let record = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7), split);
        // SAFETY: lane_stride·l + 64 <= out.len() (asserted).
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().add(lane_stride * l) as *mut _, record) };
    }
}

/// `vpshufb` indices taking, in each 128-bit lane, the low bytes of its eight words and
/// then their high bytes.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn low_then_high_bytes() -> __m512i {
    let lane = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
    _mm512_broadcast_i32x4(lane)
}

/// 32 words, `v(g)` four times for `g = 0..8` (the layout of one lane's bytes), where
/// `v(g)` is byte `at(g)` of `bytes`' 128-bit lanes (all alike), zero- or (`SIGNED`)
/// sign-extended: one `vpshufb` (a byte index with bit 7 set writes zero).
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
fn group_words<const SIGNED: bool>(bytes: __m512i, at: impl Fn(usize) -> u8) -> __m512i {
    // Signed: the byte into the word's high half, then an arithmetic shift down.
    let word = |g: usize| {
        let b = u64::from(at(g));
        if SIGNED {
            b << 8 | 0x80
        } else {
            0x8000 | b
        }
    };
    let qword = |g: usize| (word(g) * 0x0001_0001_0001_0001) as i64;
    let pick = _mm512_setr_epi64(
        qword(0),
        qword(1),
        qword(2),
        qword(3),
        qword(4),
        qword(5),
        qword(6),
        qword(7),
    );
    let words = _mm512_shuffle_epi8(bytes, pick);
    if SIGNED {
        _mm512_srai_epi16::<8>(words)
    } else {
        words
    }
}

fn put_f32(out: &mut [u8], at: usize, v: f32) {
    out[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_pair(out: &mut [u8], at: usize, lo: i16, hi: i16) {
    out[at..at + 2].copy_from_slice(&lo.to_le_bytes());
    out[at + 2..at + 4].copy_from_slice(&hi.to_le_bytes());
}

/// One Q4_K super-block into the unpacked layout.
///
/// # Safety
/// The CPU has AVX-512 F/BW; `wb` is one 144-byte block; `lanes` holds the row's lane
/// records of this super-block at `lane_stride`, `scalars` its scalar record.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_q4_k(wb: &[u8], lanes: &mut [u8], lane_stride: usize, scalars: &mut [u8]) {
    assert!(wb.len() >= Q4_K_BYTES && scalars.len() >= SCALAR_RECORD);
    let low4 = _mm512_set1_epi8(0x0F);
    // SAFETY: qs is bytes 16..144 of the block.
    let (z0, z1) = unsafe {
        (
            _mm512_loadu_si512(wb.as_ptr().add(q4_k::QS) as *const _),
            _mm512_loadu_si512(wb.as_ptr().add(q4_k::QS + 64) as *const _),
        )
    };
    // Chunk c of qs: low nibbles are group 2c, high nibbles group 2c + 1.
    let (lo0, hi0) = (
        _mm512_and_si512(z0, low4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(z0), low4),
    );
    let (lo1, hi1) = (
        _mm512_and_si512(z1, low4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(z1), low4),
    );
    let g2 = [
        _mm512_shuffle_i64x2::<0b01_00_01_00>(lo0, hi0),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(lo0, hi0),
        _mm512_shuffle_i64x2::<0b01_00_01_00>(lo1, hi1),
        _mm512_shuffle_i64x2::<0b11_10_11_10>(lo1, hi1),
    ];
    let (sc, mn) = scales_mins_k4_packed(&wb[q4_k::SCALES..q4_k::SCALES + 12]);
    let byte = |v: u64, j: usize| ((v >> (8 * j)) & 0xFF) as i16;
    // The eight scales in the low eight bytes of every 128-bit lane.
    let scales = group_words::<false>(_mm512_set1_epi64(sc as i64), |g| g as u8);
    // SAFETY: the caller's contract on `lanes`.
    unsafe {
        put_lanes(
            transpose_groups_to_lanes(g2),
            |_| scales,
            lanes,
            lane_stride,
        )
    };
    put_f32(scalars, W_D, read_f16(wb, 0));
    put_f32(scalars, W_D + 4, -read_f16(wb, q4_k::DMIN));
    for m in 0..4 {
        put_pair(
            scalars,
            W_MINS + 4 * m,
            byte(mn, 2 * m),
            byte(mn, 2 * m + 1),
        );
    }
}

/// One Q6_K super-block into the unpacked layout (quants unsigned, 0..63).
///
/// # Safety
/// As [`unpack_q4_k`], for one 210-byte Q6_K block.
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn unpack_q6_k(wb: &[u8], lanes: &mut [u8], lane_stride: usize, scalars: &mut [u8]) {
    assert!(wb.len() >= Q6_K_BYTES && scalars.len() >= SCALAR_RECORD);
    let low4 = _mm512_set1_epi8(0x0F);
    let two_bits = _mm512_set1_epi32(0x0303_0303);
    let mut g2 = [_mm512_setzero_si512(); 4];
    for h in 0..2 {
        // SAFETY: ql half h is bytes 64h..64h+64, qh half h bytes 128+32h..160+32h.
        let (ql, qh) = unsafe {
            (
                _mm512_loadu_si512(wb.as_ptr().add(q6_k::QL + 64 * h) as *const _),
                _mm512_broadcast_i64x4(_mm256_loadu_si256(
                    wb.as_ptr().add(q6_k::QH + 32 * h) as *const __m256i
                )),
            )
        };
        // Group 4h + k takes nibble (k / 2) of ql bytes 32·(k % 2).. and bits 2k, 2k+1 of qh.
        let top = |shift_lo: i32, shift_hi: i32| {
            let shifts =
                _mm512_inserti64x4::<1>(_mm512_set1_epi32(shift_lo), _mm256_set1_epi32(shift_hi));
            _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srlv_epi32(qh, shifts), two_bits))
        };
        let low = _mm512_and_si512(ql, low4);
        let high = _mm512_and_si512(_mm512_srli_epi16::<4>(ql), low4);
        g2[2 * h] = _mm512_or_si512(low, top(0, 2));
        g2[2 * h + 1] = _mm512_or_si512(high, top(4, 6));
    }
    let sc: [i16; 16] = std::array::from_fn(|j| wb[q6_k::SCALES + j] as i8 as i16);
    // SAFETY: the sixteen scales are bytes SCALES..SCALES+16 of the block.
    let scale_bytes = _mm512_broadcast_i32x4(unsafe {
        _mm_loadu_si128(wb.as_ptr().add(q6_k::SCALES) as *const __m128i)
    });
    // Lane l of group g has the scale of sub-block 2g + l/4.
    let first = group_words::<true>(scale_bytes, |g| 2 * g as u8);
    let second = group_words::<true>(scale_bytes, |g| 2 * g as u8 + 1);
    // SAFETY: the caller's contract on `lanes`.
    unsafe {
        put_lanes(
            transpose_groups_to_lanes(g2),
            |l| if l < 4 { first } else { second },
            lanes,
            lane_stride,
        )
    };
    put_f32(scalars, W_D, read_f16(wb, q6_k::D));
    for l in 0..8 {
        put_pair(
            scalars,
            W_BSUMS + 4 * l,
            -32 * sc[2 * l],
            -32 * sc[2 * l + 1],
        );
    }
}

/// Unpacks up to [`ROWS`] weight rows of `row_bytes` from `w_rows` into `out` in the
/// block layout (see [`LANE_RECORD`]); rows past the last are zero. Returns `n_sb`.
///
/// # Safety
/// [`available`] is true and `weight_type` is Q4_K or Q6_K.
pub(crate) unsafe fn unpack_block(
    weight_type: GgmlType,
    w_rows: &[u8],
    row_bytes: usize,
    out: &mut nx_syscalls::AlignedBytes,
) -> usize {
    let src = if weight_type == GgmlType::Q4_K {
        Q4_K_BYTES
    } else {
        Q6_K_BYTES
    };
    let n_sb = row_bytes / src;
    let lanes_len = n_sb * SB_LANE_BYTES;
    out.resize(lanes_len + n_sb * ROWS * SCALAR_RECORD);
    let n_rows = (w_rows.len() / row_bytes).min(ROWS);
    // Unpacked rows overwrite every byte a kernel reads; only a last, partial block
    // needs zeros for its padding rows.
    if n_rows < ROWS {
        out.fill(0);
    }
    let (lanes, scalars) = out.split_at_mut(lanes_len);
    let lane_stride = ROWS * LANE_RECORD;
    for (r, row) in w_rows.chunks_exact(row_bytes).take(ROWS).enumerate() {
        for (s, wb) in row.chunks_exact(src).enumerate() {
            let lane_at = s * SB_LANE_BYTES + r * LANE_RECORD;
            let lane_end = lane_at + 7 * lane_stride + LANE_RECORD;
            let scalar_at = (s * ROWS + r) * SCALAR_RECORD;
            let (l, sc) = (
                &mut lanes[lane_at..lane_end],
                &mut scalars[scalar_at..scalar_at + SCALAR_RECORD],
            );
            // SAFETY: the caller guarantees the features; whole blocks; the records are
            // inside `out` (sized above).
            unsafe {
                if weight_type == GgmlType::Q4_K {
                    unpack_q4_k(wb, l, lane_stride, sc)
                } else {
                    unpack_q6_k(wb, l, lane_stride, sc)
                }
            }
        }
    }
    n_sb
}

/// The tile shapes: tmm0/tmm1 (and tmm5/tmm6 for a second token group) the lo/hi
/// products (16 rows × 16 tokens of i32), tmm2/tmm3 the lo/hi weights (16 rows × 32
/// bytes), tmm4 (tmm7) the activations (8 × 64 bytes).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

fn tile_config() -> TileConfig {
    let mut c = [0u8; 64];
    c[0] = 1; // palette 1
    let mut set = |t: usize, rows: u8, colsb: u16| {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        c[48 + t] = rows;
    };
    set(0, 16, 64);
    set(1, 16, 64);
    set(2, 16, 32);
    set(3, 16, 32);
    set(4, 8, 64);
    set(5, 16, 64);
    set(6, 16, 64);
    set(7, 8, 64);
    TileConfig(c)
}

/// Loads the tile configuration on this thread.
///
/// # Safety
/// [`available`] is true.
pub(crate) unsafe fn tiles_begin() {
    let cfg = tile_config();
    // SAFETY: AMX is available and permitted; the config is a valid palette-1 layout.
    unsafe { asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly)) };
}

/// Releases the tile state on this thread.
///
/// # Safety
/// [`available`] is true.
pub(crate) unsafe fn tiles_end() {
    // SAFETY: AMX is available.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// One 16 × 16 block of i32 tile products, aligned for `tilestored`.
#[repr(C, align(64))]
#[allow(dead_code)] // only ever written by `tilestored` and read through pointers
struct Products([i32; 256]);

/// Loads lane `l`'s weight tiles (lo, hi: 16 records at `w_stride` from `wsb + 1024·l`) and
/// `G` activation tiles (8 rows at 512 bytes from `xt[i] + 64l`) and starts the
/// products: tmm0/tmm1 (group 0 lo/hi), tmm5/tmm6 (group 1).
///
/// # Safety
/// [`tiles_begin`] ran on this thread; the addresses are readable for the tile shapes.
#[inline(always)]
unsafe fn start_products<const G: usize>(
    wsb: *const u8,
    w_stride: usize,
    xt: [*const u8; G],
    l: usize,
) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tileloadd tmm2, [{alo} + {ws}*1]",
            "tileloadd tmm3, [{ahi} + {ws}*1]",
            "tileloadd tmm4, [{b0} + {xs}*1]",
            "tilezero tmm0",
            "tilezero tmm1",
            "tdpbusd tmm0, tmm2, tmm4",
            "tdpbssd tmm1, tmm3, tmm4",
            alo = in(reg) wsb.add(ROWS * LANE_RECORD * l),
            ahi = in(reg) wsb.add(ROWS * LANE_RECORD * l + 32),
            ws = in(reg) w_stride,
            b0 = in(reg) xt[0].add(64 * l),
            xs = in(reg) 512usize,
            options(nostack, readonly),
        );
        if G == 2 {
            asm!(
                "tileloadd tmm7, [{b1} + {xs}*1]",
                "tilezero tmm5",
                "tilezero tmm6",
                "tdpbusd tmm5, tmm2, tmm7",
                "tdpbssd tmm6, tmm3, tmm7",
                b1 = in(reg) xt[G - 1].add(64 * l),
                xs = in(reg) 512usize,
                options(nostack, readonly),
            );
        }
    }
}

/// Steps of [`k_tile`] between a step's tiles being asked into L1 and loaded: a
/// `tileloadd` waits on its lines, and the activations of every token group stream from
/// L2 (or further) once per block of weight rows.
const PREFETCH_STEPS: usize = 2;

/// Asks for the lines of one step's tiles: the weights' 1 KiB (sixteen records) at `wl`,
/// each group's eight 64-byte activation rows, 512 bytes apart, at `xl[i]`.
#[inline(always)]
fn prefetch_step<const G: usize>(wl: *const u8, xl: [*const u8; G]) {
    for line in 0..ROWS * LANE_RECORD / 64 {
        // SAFETY: prefetch is a hint that reads nothing and cannot fault (SSE, baseline on
        // x86_64).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(wl.wrapping_add(64 * line) as *const i8) };
    }
    for x in xl {
        for row in 0..8 {
            // SAFETY: as above.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(512 * row) as *const i8) };
        }
    }
}

/// Stores the products started by [`start_products`] to `lo[i]` / `hi[i]` (256 i32
/// each, 16 rows of 64 bytes).
///
/// # Safety
/// As [`start_products`], which ran before; the pointers are valid for those writes.
#[inline(always)]
unsafe fn store_products<const G: usize>(lo: [*mut i32; 2], hi: [*mut i32; 2]) {
    // SAFETY: the caller's contract.
    unsafe {
        asm!(
            "tilestored [{clo} + {cs}*1], tmm0",
            "tilestored [{chi} + {cs}*1], tmm1",
            clo = in(reg) lo[0],
            chi = in(reg) hi[0],
            cs = in(reg) 64usize,
            options(nostack),
        );
        if G == 2 {
            asm!(
                "tilestored [{clo} + {cs}*1], tmm5",
                "tilestored [{chi} + {cs}*1], tmm6",
                clo = in(reg) lo[1],
                chi = in(reg) hi[1],
                cs = in(reg) 64usize,
                options(nostack),
            );
        }
    }
}

/// The float side of [`k_tile`]: per (group, row), eight lane chains and (Q4_K) four min
/// chains, and the super-block's `d_w·d_x`. A chain is written first at super-block 0 (as
/// `fma(·, ·, +0)`, what a zeroed start gives), so none is zeroed up front (24 KiB per
/// call at two groups); nor is `d`, set at the start of every super-block (zeroing its
/// 2 KiB was a `memset` call per call, 2.5 % of a Qwen2.5-1.5B prefill on 2 threads).
struct KChains<const G: usize, const Q6: bool> {
    d: [[MaybeUninit<__m512>; ROWS]; G],
    acc: [[[MaybeUninit<__m512>; 8]; ROWS]; G],
    acc_min: [[[MaybeUninit<__m512>; 4]; ROWS]; G],
}

impl<const G: usize, const Q6: bool> KChains<G, Q6> {
    #[target_feature(enable = "avx512f")]
    fn new() -> Self {
        KChains {
            d: [[MaybeUninit::uninit(); ROWS]; G],
            acc: [[[MaybeUninit::uninit(); 8]; ROWS]; G],
            acc_min: [[[MaybeUninit::uninit(); 4]; ROWS]; G],
        }
    }

    /// Sets `d_w·d_x` of super-block `s` for every (group, row).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI and FMA (these helpers are inlined into
    /// [`k_tile_of`], which enables them); `xt[i]` are tile super-blocks, `wrow(r)` the
    /// rows' scalar records of `s`.
    #[inline(always)]
    unsafe fn start_super_block(&mut self, xt: [*const u8; G], wrow: impl Fn(usize) -> *const u8) {
        for i in 0..G {
            // SAFETY: inside the tile super-block (the caller's contract).
            let dx = unsafe { _mm512_loadu_ps(xt[i].add(ACTK_DX) as *const f32) };
            for r in 0..ROWS {
                // SAFETY: inside row r's scalar record.
                let dw = unsafe { std::ptr::read_unaligned(wrow(r).add(W_D) as *const f32) };
                self.d[i][r].write(_mm512_mul_ps(dx, _mm512_set1_ps(dw)));
            }
        }
    }

    /// Adds lane `l` of super-block `s` (tile products `lo[i]`/`hi[i]`, 16 rows of 16
    /// i32) to the lane chains.
    ///
    /// # Safety
    /// As [`KChains::start_super_block`], which ran for super-block `s`; the products were
    /// stored.
    #[inline(always)]
    unsafe fn add_lane(
        &mut self,
        (s, l): (usize, usize),
        (lo, hi): ([*const i32; G], [*const i32; G]),
        xt: [*const u8; G],
        wrow: impl Fn(usize) -> *const u8,
    ) {
        // Word pairs (256, 0): vpdpwssd by it adds 256 × the low word of each dword.
        let times_256 = _mm512_set1_epi32(256);
        for i in 0..G {
            // SAFETY: inside the tile super-block.
            let bsums = unsafe { _mm512_loadu_si512(xt[i].add(ACTK_BSUMS + 64 * l) as *const _) };
            for r in 0..ROWS {
                // SAFETY: row r of each 16 × 16 product; the unpacked row's pairs.
                unsafe {
                    let p_lo = _mm512_loadu_si512(lo[i].add(16 * r) as *const _);
                    let p_hi = _mm512_loadu_si512(hi[i].add(16 * r) as *const _);
                    let lane = if Q6 {
                        let lane = _mm512_add_epi32(p_lo, _mm512_slli_epi32::<8>(p_hi));
                        let pair =
                            std::ptr::read_unaligned(wrow(r).add(W_BSUMS + 4 * l) as *const i32);
                        _mm512_dpwssd_epi32(lane, bsums, _mm512_set1_epi32(pair))
                    } else {
                        // Q4_K: |hi product| <= 32·3·128 fits a word (its high word is the
                        // sign), so lo + 256·hi is one word multiply-add.
                        _mm512_dpwssd_epi32(p_lo, p_hi, times_256)
                    };
                    let prev = if s == 0 {
                        _mm512_setzero_ps()
                    } else {
                        self.acc[i][r][l].assume_init()
                    };
                    let d = self.d[i][r].assume_init();
                    let sum = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lane), prev);
                    self.acc[i][r][l].write(sum);
                }
            }
        }
    }

    /// Adds super-block `s`'s Q4_K min terms (`−dmin_w·d_x·Σ min·bsum`) to the min chains.
    ///
    /// # Safety
    /// As [`KChains::start_super_block`].
    #[inline(always)]
    unsafe fn add_mins(&mut self, s: usize, xt: [*const u8; G], wrow: impl Fn(usize) -> *const u8) {
        for i in 0..G {
            // SAFETY: inside the tile super-block.
            let dx = unsafe { _mm512_loadu_ps(xt[i].add(ACTK_DX) as *const f32) };
            for r in 0..ROWS {
                // SAFETY: inside the tile super-block and row r's scalar record.
                unsafe {
                    let dmin = std::ptr::read_unaligned(wrow(r).add(W_D + 4) as *const f32);
                    let neg_dmin = _mm512_mul_ps(dx, _mm512_set1_ps(dmin));
                    for m in 0..4 {
                        let sums = _mm512_loadu_si512(xt[i].add(ACTK_MINS + 64 * m) as *const _);
                        let pair =
                            std::ptr::read_unaligned(wrow(r).add(W_MINS + 4 * m) as *const i32);
                        let zero = _mm512_setzero_si512();
                        let prod = _mm512_dpwssd_epi32(zero, sums, _mm512_set1_epi32(pair));
                        let prev = if s == 0 {
                            _mm512_setzero_ps()
                        } else {
                            self.acc_min[i][r][m].assume_init()
                        };
                        let sum = _mm512_fmadd_ps(neg_dmin, _mm512_cvtepi32_ps(prod), prev);
                        self.acc_min[i][r][m].write(sum);
                    }
                }
            }
        }
    }

    /// Sums every (group, row)'s chains into `out` (the lanes in a fixed tree, then the
    /// min chains).
    ///
    /// # Safety
    /// As [`KChains::start_super_block`]; every chain was written (at least one
    /// super-block was added).
    #[inline(always)]
    unsafe fn finish(&self, out: &mut [[[f32; 16]; 16]; G]) {
        for (i, out_i) in out.iter_mut().enumerate() {
            for (r, out_r) in out_i.iter_mut().enumerate() {
                // SAFETY: the caller's contract.
                let a: [__m512; 8] =
                    std::array::from_fn(|l| unsafe { self.acc[i][r][l].assume_init() });
                let lanes = _mm512_add_ps(
                    _mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                    _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])),
                );
                let total = if Q6 {
                    lanes
                } else {
                    // SAFETY: as above (Q4_K writes the min chains at every super-block).
                    let m: [__m512; 4] =
                        std::array::from_fn(|k| unsafe { self.acc_min[i][r][k].assume_init() });
                    _mm512_add_ps(
                        lanes,
                        _mm512_add_ps(_mm512_add_ps(m[0], m[2]), _mm512_add_ps(m[1], m[3])),
                    )
                };
                // SAFETY: out[i][r] is sixteen f32.
                unsafe { _mm512_storeu_ps(out_r.as_mut_ptr(), total) };
            }
        }
    }
}

/// A block of sixteen unpacked weight rows (`w`, [`unpack_block`]'s layout, `n_sb`
/// super-blocks) against
/// `G` Q8_K token groups `xs` (raw quants, [`crate::tiled`] layout): `out[i][r]` gets
/// row `r`'s sixteen outputs for group `i`. Two groups share each weight tile load.
/// The tile products of one (super-block, lane) step are computed while the previous
/// step's are turned into float ([`KChains`]), so the tile unit and the vector units
/// overlap.
///
/// # Safety
/// [`available`] is true, [`tiles_begin`] ran on this thread, `weight_type` is Q4_K or
/// Q6_K, `w` holds a block of `n_sb` unpacked super-blocks, and every `xs`
/// holds `n_sb` tile super-blocks of raw quants. `G` is 1 or 2.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
pub(crate) unsafe fn k_tile<const G: usize>(
    weight_type: GgmlType,
    w: &[u8],
    xs: [&[u8]; G],
    n_sb: usize,
    out: &mut [[[f32; 16]; 16]; G],
) {
    // SAFETY: the caller's contract.
    unsafe {
        if weight_type == GgmlType::Q6_K {
            k_tile_of::<G, true>(w, xs, n_sb, out)
        } else {
            k_tile_of::<G, false>(w, xs, n_sb, out)
        }
    }
}

/// [`k_tile`] for Q6_K (`Q6`) or Q4_K, the format's branches resolved at compile time.
///
/// # Safety
/// As [`k_tile`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,fma")]
unsafe fn k_tile_of<const G: usize, const Q6: bool>(
    w: &[u8],
    xs: [&[u8]; G],
    n_sb: usize,
    out: &mut [[[f32; 16]; 16]; G],
) {
    assert!(G == 1 || G == 2);
    assert!(w.len() >= n_sb * (SB_LANE_BYTES + ROWS * SCALAR_RECORD));
    let scalars = w[n_sb * SB_LANE_BYTES..].as_ptr();
    for x in xs {
        assert!(x.len() >= n_sb * ACTK_BLOCK);
    }
    // Tile products, [step parity][group]: written by `tilestored` before every read,
    // so left uninitialised (zeroing them cost more than the loads that read them).
    let mut lo_buf = MaybeUninit::<[[Products; 2]; 2]>::uninit();
    let mut hi_buf = MaybeUninit::<[[Products; 2]; 2]>::uninit();
    let lo = lo_buf.as_mut_ptr() as *mut i32;
    let hi = hi_buf.as_mut_ptr() as *mut i32;
    // The 256 products of (step parity, group).
    let at = |base: *mut i32, parity: usize, i: usize| base.wrapping_add(256 * (2 * parity + i));
    let xt_of =
        |s: usize| -> [*const u8; G] { std::array::from_fn(|i| xs[i][s * ACTK_BLOCK..].as_ptr()) };
    let n_steps = n_sb * 8;
    if n_steps == 0 {
        out.iter_mut()
            .for_each(|o| o.iter_mut().for_each(|r| r.fill(0.0)));
        return;
    }
    // SAFETY: step 0's tiles are inside `w` and the first tile super-blocks (asserted).
    unsafe {
        start_products::<G>(w.as_ptr(), LANE_RECORD, xt_of(0), 0);
        store_products::<G>([at(lo, 0, 0), at(lo, 0, 1)], [at(hi, 0, 0), at(hi, 0, 1)]);
    }
    let mut chains = KChains::<G, Q6>::new();
    for step in 0..n_steps {
        let (s, l) = (step / 8, step % 8);
        if step + 1 < n_steps {
            let (s1, l1) = ((step + 1) / 8, (step + 1) % 8);
            // SAFETY: inside `w` and the tile super-blocks (asserted above).
            unsafe {
                start_products::<G>(w[s1 * SB_LANE_BYTES..].as_ptr(), LANE_RECORD, xt_of(s1), l1)
            };
        }
        if step + PREFETCH_STEPS < n_steps {
            let ahead = step + PREFETCH_STEPS;
            let (s2, l2) = (ahead / 8, ahead % 8);
            let wl = w[s2 * SB_LANE_BYTES + ROWS * LANE_RECORD * l2..].as_ptr();
            prefetch_step(wl, xs.map(|x| x[s2 * ACTK_BLOCK + 64 * l2..].as_ptr()));
        }
        let xt = xt_of(s);
        let wrow = |r: usize| scalars.wrapping_add((s * ROWS + r) * SCALAR_RECORD);
        let products = (
            std::array::from_fn(|i| at(lo, step % 2, i) as *const i32),
            std::array::from_fn(|i| at(hi, step % 2, i) as *const i32),
        );
        // SAFETY: super-block s's tile super-blocks and scalar records (asserted above);
        // this step's products were stored (step 0 before the loop, the others at the end
        // of the step before).
        unsafe {
            if l == 0 {
                chains.start_super_block(xt, wrow);
            }
            chains.add_lane((s, l), products, xt, wrow);
            if !Q6 && l == 7 {
                chains.add_mins(s, xt, wrow);
            }
        }
        if step + 1 < n_steps {
            let next = (step + 1) % 2;
            // SAFETY: the products of step + 1 were started above.
            unsafe {
                store_products::<G>(
                    [at(lo, next, 0), at(lo, next, 1)],
                    [at(hi, next, 0), at(hi, next, 1)],
                )
            };
        }
    }
    // SAFETY: n_steps > 0, so every chain was written at super-block 0.
    unsafe { chains.finish(out) };
}
