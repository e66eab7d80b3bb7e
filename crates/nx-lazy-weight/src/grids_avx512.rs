//! AVX-512 VBMI kernels of the grid formats: a block's table lookups done as byte
//! permutes in registers instead of one scalar load and insert per eight weights.
//!
//! ggml's AVX2 IQ2_XXS kernel (what nx's AVX2 tier copies) builds each group of 32
//! weights from four 8-byte grid rows and four 8-byte sign rows fetched one by one: about
//! forty operations a group, so decode runs far below the memory's rate. Here a whole
//! super-block is decoded at once. The 256 grid rows are kept as their 16-bit level codes
//! (two bits a weight, 512 bytes: four 128-byte `vpermi2b` tables), so one permute per
//! table looks up the codes of all 32 octets and two blends pick by the index's top bits;
//! `vpmultishiftqb` spreads a code's 2-bit fields to bytes and one `vpermb` maps them to
//! levels. The sign bytes (7-bit index and parity) are one 128-entry `vpermi2b`, turned
//! into mask registers by a `vptestmb`, and the activations are negated under the mask.
//!
//! The integers are ggml's: a `vpdpbusd` forms the quad sums `maddubs` pairs would (no
//! pair can saturate: 2·43·128 < 2¹⁵), a `vpdpwssd` multiplies each quad by its group's
//! `2·ls + 1` (a quad fits a word: 4·43·128 < 2¹⁵), and the two 256-bit halves (even and
//! odd groups) fold into ggml's eight lanes. The float part, per super-block one FMA of
//! `d_w·d_x` into eight lanes and the final `hsum_float_8` times 1/8, is unchanged, so
//! the bits are the scalar twin's (`formats::iq2_xxs::dot`).

use std::arch::x86_64::*;

use crate::avx2::hsum_ps;
use crate::formats::grid_tables::IQ2XXS_CODES;
use crate::formats::iq2_xxs::{BYTES, POST_SCALE, QS};
use crate::formats::{q8_k::QS as Q8_K_QS, read_f16, read_f32, Q8_K_BYTES};

/// True when the CPU has what these kernels use: the AVX-512 VNNI tier's features and
/// AVX512_VBMI (Ice Lake and later Intel cores, AMD Zen 4 and later).
pub(crate) fn available() -> bool {
    crate::avx512::available() && std::arch::is_x86_feature_detected!("avx512vbmi")
}

/// 64 bytes, aligned for a vector load.
#[repr(C, align(64))]
struct Bytes64([u8; 64]);

impl Bytes64 {
    #[inline(always)]
    fn load(&self) -> __m512i {
        // SAFETY: 64 readable, aligned bytes (AVX-512 F, which every caller enables).
        unsafe { _mm512_load_si512(self.0.as_ptr() as *const _) }
    }
}

/// The constant vectors of the IQ2_XXS kernel, built once.
struct Consts {
    /// Byte `2j + h` takes octet `j`'s grid-index byte (at `8·(j/4) + j%4` of the block's
    /// group words).
    dup_index: Bytes64,
    /// Bytes alternately 0 and 1: which byte of a 16-bit code.
    code_byte: Bytes64,
    /// The code tables: 128 bytes per 64 grid rows, byte `2e + h` byte `h` of row
    /// `64c + e`'s code.
    codes: [Bytes64; 8],
    /// Per output register `k` (weights `64k..64k+64`): qword `o` gets octet `8k + o`'s
    /// code in its low two bytes.
    spread: [Bytes64; 4],
    /// `vpmultishiftqb` control: byte `e` of each qword starts at bit `2e`.
    fields2: Bytes64,
    /// Level of a 2-bit code (indexed by a byte's low six bits).
    levels: Bytes64,
    /// `vpmultishiftqb` control: bytes 0..4 of each qword the 7-bit sign indices in its
    /// high dword (bits 32, 39, 46, 53).
    sign_fields: Bytes64,
    /// The 128 sign bytes (index plus parity), as two `vpermi2b` halves.
    sign_table: [Bytes64; 2],
    /// Per output register `k`: byte `b` takes the sign byte of octet `8k + b/8`.
    sign_spread: [Bytes64; 4],
    /// Byte `b` is `1 << (b % 8)`.
    bit_of_byte: Bytes64,
    /// Per output register `k`: dword `j` takes the multiplier of group `2k + j/8`.
    multiplier_index: [Bytes64; 4],
}

fn consts() -> &'static Consts {
    static C: std::sync::OnceLock<Consts> = std::sync::OnceLock::new();
    C.get_or_init(|| {
        let make = |f: &dyn Fn(usize) -> u8| Bytes64(std::array::from_fn(f));
        let dwords = |f: &dyn Fn(usize) -> u32| {
            Bytes64(std::array::from_fn(|b| (f(b / 4) >> (8 * (b % 4))) as u8))
        };
        Consts {
            dup_index: make(&|b| (8 * (b / 8) + (b / 2) % 4) as u8),
            code_byte: make(&|b| (b % 2) as u8),
            codes: std::array::from_fn(|t| {
                // Table t is bytes 64·(t % 2).. of chunk t / 2.
                make(&|b| {
                    let at = 64 * (t % 2) + b;
                    let row = 64 * (t / 2) + at / 2;
                    (IQ2XXS_CODES[row] >> (8 * (at % 2))) as u8
                })
            }),
            spread: std::array::from_fn(|k| make(&|b| (2 * (8 * k + b / 8) + b % 2) as u8)),
            fields2: make(&|b| (2 * (b % 8)) as u8),
            levels: make(&|b| [0x08, 0x19, 0x2b, 0][b % 4]),
            sign_fields: make(&|b| [32, 39, 46, 53, 0, 0, 0, 0][b % 8]),
            sign_table: std::array::from_fn(|h| {
                make(&|b| crate::formats::grids::parity_signs((64 * h + b) as u32))
            }),
            sign_spread: std::array::from_fn(|k| {
                make(&|b| (8 * (2 * k + b / 32) + (b / 8) % 4) as u8)
            }),
            bit_of_byte: make(&|b| 1 << (b % 8)),
            multiplier_index: std::array::from_fn(|k| dwords(&|j| (2 * (2 * k + j / 8)) as u32)),
        }
    })
}

/// The decoded weights of one IQ2_XXS super-block: magnitudes (64 weights a register),
/// negative-weight masks, and each quad's multiplier (`2·ls + 1` in a dword's low word).
struct Iq2xxsBlock {
    magnitudes: [__m512i; 4],
    negative: [__mmask64; 4],
    multipliers: [__m512i; 4],
}

/// Decodes the block whose 64 group-word bytes are `q`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VBMI ([`available`]).
#[inline(always)]
unsafe fn decode_iq2_xxs(q: __m512i, c: &Consts) -> Iq2xxsBlock {
    // SAFETY (features): the caller's contract.
    unsafe {
        // [32 octets × (index, index)]
        let index = _mm512_permutexvar_epi8(c.dup_index.load(), q);
        // Byte 2j + h: 2·(index & 63) + h, the code byte's place in a 128-byte table.
        let at = _mm512_ternarylogic_epi32::<0xEA>(
            _mm512_add_epi8(index, index),
            _mm512_set1_epi8(0x7e),
            c.code_byte.load(),
        );
        let t = &c.codes;
        let rows_0 = _mm512_permutex2var_epi8(t[0].load(), at, t[1].load());
        let rows_1 = _mm512_permutex2var_epi8(t[2].load(), at, t[3].load());
        let rows_2 = _mm512_permutex2var_epi8(t[4].load(), at, t[5].load());
        let rows_3 = _mm512_permutex2var_epi8(t[6].load(), at, t[7].load());
        let bit6 = _mm512_test_epi8_mask(index, _mm512_set1_epi8(0x40));
        let bit7 = _mm512_test_epi8_mask(index, _mm512_set1_epi8(-0x80));
        // [32 octets × u16 code]
        let codes = _mm512_mask_blend_epi8(
            bit7,
            _mm512_mask_blend_epi8(bit6, rows_0, rows_1),
            _mm512_mask_blend_epi8(bit6, rows_2, rows_3),
        );
        // Plain loops, not `array::from_fn`: a closure's body is not compiled with this
        // function's target features, so its intrinsics stayed calls.
        let mut magnitudes = [_mm512_setzero_si512(); 4];
        for (k, m) in magnitudes.iter_mut().enumerate() {
            let spread = _mm512_permutexvar_epi8(c.spread[k].load(), codes);
            let fields = _mm512_multishift_epi64_epi8(c.fields2.load(), spread);
            *m = _mm512_permutexvar_epi8(fields, c.levels.load());
        }
        // [8 groups × (4 sign bytes, 4 unused)]
        let sign_index = _mm512_multishift_epi64_epi8(c.sign_fields.load(), q);
        let signs =
            _mm512_permutex2var_epi8(c.sign_table[0].load(), sign_index, c.sign_table[1].load());
        let mut negative = [0; 4];
        for (k, n) in negative.iter_mut().enumerate() {
            let spread = _mm512_permutexvar_epi8(c.sign_spread[k].load(), signs);
            *n = _mm512_test_epi8_mask(spread, c.bit_of_byte.load());
        }
        // Qword g: 2·ls + 1 of group g (ls the top four bits).
        let ls = _mm512_srli_epi64::<60>(q);
        let odd = _mm512_or_si512(_mm512_add_epi64(ls, ls), _mm512_set1_epi64(1));
        let mut multipliers = [_mm512_setzero_si512(); 4];
        for (k, m) in multipliers.iter_mut().enumerate() {
            *m = _mm512_permutexvar_epi32(c.multiplier_index[k].load(), odd);
        }
        Iq2xxsBlock {
            magnitudes,
            negative,
            multipliers,
        }
    }
}

/// ggml's eight lane integers of one decoded block against the 256 Q8_K quants at `xq`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `xq` is readable for 256 bytes.
#[inline(always)]
unsafe fn lanes(block: &Iq2xxsBlock, xq: *const u8) -> __m256i {
    // SAFETY: the caller's contract.
    unsafe {
        let zero = _mm512_setzero_si512();
        let mut sums = [zero; 2];
        for k in 0..4 {
            let x = _mm512_loadu_si512(xq.add(64 * k) as *const _);
            // sign_epi8's negation: −(−128) stays −128 either way.
            let signed = _mm512_mask_sub_epi8(x, block.negative[k], zero, x);
            let quads = _mm512_dpbusd_epi32(zero, block.magnitudes[k], signed);
            sums[k % 2] = _mm512_dpwssd_epi32(sums[k % 2], quads, block.multipliers[k]);
        }
        let sum = _mm512_add_epi32(sums[0], sums[1]);
        _mm256_add_epi32(
            _mm512_castsi512_si256(sum),
            _mm512_extracti64x4_epi64::<1>(sum),
        )
    }
}

/// IQ2_XXS × Q8_K for `N` activation rows, each weight block decoded once.
///
/// # Safety
/// [`available`] is true.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn iq2_xxs_impl<const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let c = consts();
    let n_blocks = crate::avx2::common_blocks(w, &xs, BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..n_blocks {
        let b = &w[i * BYTES..(i + 1) * BYTES];
        let xb = crate::avx2::block_of_each(&xs, i, Q8_K_BYTES);
        // SAFETY: 64 bytes at QS, inside the 66-byte block; the features enabled here.
        let block = unsafe { decode_iq2_xxs(_mm512_loadu_si512(b[QS..].as_ptr() as *const _), c) };
        let d_w = read_f16(b, 0);
        for t in 0..N {
            // SAFETY: 256 quants at Q8_K_QS inside the block.
            let lanes = unsafe { lanes(&block, xb[t][Q8_K_QS..Q8_K_QS + 256].as_ptr()) };
            let d = _mm256_set1_ps(d_w * read_f32(xb[t], 0));
            acc[t] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), acc[t]);
        }
    }
    let mut out = [0f32; N];
    for (o, a) in out.iter_mut().zip(acc) {
        *o = POST_SCALE * hsum_ps(a);
    }
    out
}

/// IQ2_XXS × Q8_K (a [`crate::dot_scalar::DotKernel`]).
pub(crate) fn dot_iq2_xxs_q8_k(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: handed out only by `crate::avx512::kernel` after [`available`].
    let [y] = unsafe { iq2_xxs_impl(w, [x]) };
    y
}

/// IQ2_XXS × four Q8_K rows (a [`crate::formats::DotKernel4`]).
pub(crate) fn dot4_iq2_xxs_q8_k(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    unsafe { iq2_xxs_impl(w, x) }
}
