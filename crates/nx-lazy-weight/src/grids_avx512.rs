//! AVX-512 VBMI kernels of the grid formats with up to 512 entries (IQ2_XXS, IQ2_XS,
//! IQ3_XXS, IQ3_S): a block's table lookups done as byte permutes in registers instead
//! of one scalar load and insert per four or eight weights.
//!
//! ggml's AVX2 kernels (what nx's AVX2 tier copies) build each group of 32 weights from
//! grid rows and 8-byte sign rows fetched one by one: about forty operations a group, so
//! decode runs far below the memory's rate. Here a whole super-block is decoded at once.
//! The grid rows are kept as their 16-bit level codes (two or three bits a weight) in
//! 128-byte `vpermi2b` tables of 64 entries, so one permute per table looks up the codes
//! of 32 indices and blends pick by the index's bits 6, 7 (and 8, for 512 entries);
//! `vpmultishiftqb` spreads a code's fields to bytes and one `vpermb` maps them to
//! levels. The sign bytes (7-bit index and parity) are one 128-entry `vpermi2b` (IQ3_S
//! stores its sign bits as they are), turned into mask registers by a `vptestmb`, and the
//! activations are negated under the mask. (Gathering the grid rows with `vpgatherqq`
//! instead was about 15 % faster on a Sapphire Rapids Xeon, but gathers are slow on AMD
//! and on Intel cores with the Downfall microcode fix: not kept.)
//!
//! The integers are ggml's: a `vpdpbusd` forms the quad sums `maddubs` pairs would (no
//! pair can saturate: 2·62·128 < 2¹⁵), a `vpdpwssd` multiplies each quad by its 16 or 32
//! weights' `2·ls + 1` (a quad fits a word: 4·62·128 < 2¹⁵), and the two 256-bit halves
//! (even and odd groups) fold into ggml's eight lanes. The float part, per super-block
//! one FMA of `d_w·d_x` into eight lanes and the final `hsum_float_8` times the format's
//! constant, is unchanged, so the bits are the scalar twins' (`formats::iq2_xxs::dot` and
//! the others'; `tests/simd_twins_formats.rs`).

use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::avx2::hsum_ps;
use crate::formats::grid_tables::{IQ2XS_CODES, IQ2XXS_CODES, IQ3S_CODES, IQ3XXS_CODES};
use crate::formats::{iq2_xs, iq2_xxs, iq3_s, iq3_xxs};
use crate::formats::{q8_k::QS as Q8_K_QS, read_f16, read_f32, Q8_K_BYTES};

/// True when the CPU has what these kernels use: the AVX-512 VNNI tier's features and
/// AVX512_VBMI (Ice Lake and later Intel cores, AMD Zen 4 and later).
pub(crate) fn available() -> bool {
    crate::tier::has_avx512_vnni_features() && std::arch::is_x86_feature_detected!("avx512vbmi")
}

/// 64 bytes, aligned for a vector load.
#[repr(C, align(64))]
struct Bytes64([u8; 64]);

impl Bytes64 {
    fn of(f: impl Fn(usize) -> u8) -> Bytes64 {
        Bytes64(std::array::from_fn(f))
    }

    /// Dword `j` is `f(j)`.
    fn of_dwords(f: impl Fn(usize) -> u32) -> Bytes64 {
        Bytes64::of(|b| (f(b / 4) >> (8 * (b % 4))) as u8)
    }

    #[inline(always)]
    fn load(&self) -> __m512i {
        // SAFETY: 64 readable, aligned bytes (AVX-512 F, which every caller enables).
        unsafe { _mm512_load_si512(self.0.as_ptr() as *const _) }
    }
}

/// A grid's 16-bit level codes as `T / 2` 128-byte `vpermi2b` tables (64 entries each;
/// `T` is 8 for 256 entries, 16 for 512): byte `2e + h` of table `c` is byte `h` of entry
/// `64c + e`'s code.
struct CodeTables<const T: usize>([Bytes64; T]);

impl<const T: usize> CodeTables<T> {
    fn new(codes: &[u16]) -> CodeTables<T> {
        assert_eq!(codes.len(), 32 * T);
        CodeTables(std::array::from_fn(|t| {
            Bytes64::of(|b| {
                let at = 64 * (t % 2) + b;
                (codes[64 * (t / 2) + at / 2] >> (8 * (at % 2))) as u8
            })
        }))
    }

    /// The codes of 32 indices: `index` holds index `j`'s low byte in bytes `2j` and
    /// `2j + 1`, `bit8` its ninth bit in mask bits `2j` and `2j + 1` (512 entries only);
    /// word `j` of the result is its code.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VBMI.
    #[inline(always)]
    unsafe fn lookup(&self, index: __m512i, bit8: __mmask64, code_byte: __m512i) -> __m512i {
        // SAFETY (features): the caller's contract.
        unsafe {
            // Byte 2j + h: 2·(index & 63) + h, the code byte's place in a 128-byte table.
            let at = _mm512_ternarylogic_epi32::<0xEA>(
                _mm512_add_epi8(index, index),
                _mm512_set1_epi8(0x7e),
                code_byte,
            );
            let bit6 = _mm512_test_epi8_mask(index, _mm512_set1_epi8(0x40));
            let bit7 = _mm512_test_epi8_mask(index, _mm512_set1_epi8(-0x80));
            let low = self.lookup_256(0, at, bit6, bit7);
            if T == 8 {
                low
            } else {
                _mm512_mask_blend_epi8(bit8, low, self.lookup_256(1, at, bit6, bit7))
            }
        }
    }

    /// Entries `256q..256q + 256` at the table places `at`, picked by index bits 6, 7.
    ///
    /// # Safety
    /// As [`CodeTables::lookup`].
    #[inline(always)]
    unsafe fn lookup_256(
        &self,
        q: usize,
        at: __m512i,
        bit6: __mmask64,
        bit7: __mmask64,
    ) -> __m512i {
        let t = &self.0[8 * q..8 * q + 8];
        // SAFETY (features): the caller's contract.
        unsafe {
            let rows_0 = _mm512_permutex2var_epi8(t[0].load(), at, t[1].load());
            let rows_1 = _mm512_permutex2var_epi8(t[2].load(), at, t[3].load());
            let rows_2 = _mm512_permutex2var_epi8(t[4].load(), at, t[5].load());
            let rows_3 = _mm512_permutex2var_epi8(t[6].load(), at, t[7].load());
            _mm512_mask_blend_epi8(
                bit7,
                _mm512_mask_blend_epi8(bit6, rows_0, rows_1),
                _mm512_mask_blend_epi8(bit6, rows_2, rows_3),
            )
        }
    }
}

/// The constant vectors both kernels use.
struct Common {
    /// Bytes alternately 0 and 1: which byte of a 16-bit code.
    code_byte: Bytes64,
    /// The 128 sign bytes (index plus parity), as two `vpermi2b` halves.
    sign_table: [Bytes64; 2],
    /// Per output register `k`: byte `b` takes the sign byte of octet `8k + b/8`, which
    /// lies at byte `(b/8) % 4` of group `2k + b/32`'s qword.
    sign_spread: [Bytes64; 4],
    /// Byte `b` is `1 << (b % 8)`.
    bit_of_byte: Bytes64,
    /// Per output register `k`: dword `j` takes the low dword of group `2k + j/8`'s qword.
    multiplier_index: [Bytes64; 4],
}

impl Common {
    fn new() -> Common {
        Common {
            code_byte: Bytes64::of(|b| (b % 2) as u8),
            sign_table: std::array::from_fn(|h| {
                Bytes64::of(|b| crate::formats::grids::parity_signs((64 * h + b) as u32))
            }),
            sign_spread: std::array::from_fn(|k| {
                Bytes64::of(|b| (8 * (2 * k + b / 32) + (b / 8) % 4) as u8)
            }),
            bit_of_byte: Bytes64::of(|b| 1 << (b % 8)),
            multiplier_index: std::array::from_fn(|k| {
                Bytes64::of_dwords(|j| (2 * (2 * k + j / 8)) as u32)
            }),
        }
    }
}

/// Codes to magnitudes for the IQ2 grids (one index per eight weights, 2-bit fields).
struct OctetLevels {
    /// Per output register `k` (weights `64k..64k+64`): qword `o` gets octet `8k + o`'s
    /// code in its low bytes.
    spread: [Bytes64; 4],
    /// Byte `e` of each qword starts at bit `2e`.
    fields: Bytes64,
    /// The level of a 2-bit code (indexed by a byte's low six bits).
    levels: Bytes64,
}

impl OctetLevels {
    fn new() -> OctetLevels {
        OctetLevels {
            spread: std::array::from_fn(|k| Bytes64::of(|b| (2 * (8 * k + b / 8) + b % 2) as u8)),
            fields: Bytes64::of(|b| (2 * (b % 8)) as u8),
            levels: Bytes64::of(|b| [0x08, 0x19, 0x2b, 0][b % 4]),
        }
    }

    /// The 256 magnitudes from the codes of 32 octets (word `j`: octet `j`'s).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VBMI.
    #[inline(always)]
    unsafe fn magnitudes(&self, codes: __m512i) -> [__m512i; 4] {
        let mut magnitudes = [codes; 4];
        // SAFETY (features): the caller's contract. Plain loops, not `array::from_fn`:
        // a closure's body is not compiled with the caller's target features, so its
        // intrinsics stayed calls.
        unsafe {
            for (k, m) in magnitudes.iter_mut().enumerate() {
                let spread = _mm512_permutexvar_epi8(self.spread[k].load(), codes);
                let fields = _mm512_multishift_epi64_epi8(self.fields.load(), spread);
                *m = _mm512_permutexvar_epi8(fields, self.levels.load());
            }
        }
        magnitudes
    }
}

/// Indices and codes to magnitudes for the IQ3 grids (64 index bytes, one per four
/// weights, 3-bit fields).
struct QuadLevels {
    /// Per half `h`: byte `2j + e` takes index `32h + j`.
    dup_index: [Bytes64; 2],
    /// Per output register `k`: qword `o` gets the codes of indices `16k + 2o` and
    /// `16k + 2o + 1` in its bytes 0..2 and 4..6 (from half `k / 2`'s codes).
    spread: [Bytes64; 2],
    /// Bytes 0..4 of each qword start at bits `3e`, bytes 4..8 at bits `32 + 3e`.
    fields: Bytes64,
    /// The level of a 3-bit code (indexed by a byte's low six bits).
    levels: Bytes64,
}

impl QuadLevels {
    fn new(levels: [u8; 8]) -> QuadLevels {
        QuadLevels {
            dup_index: std::array::from_fn(|h| Bytes64::of(|b| (32 * h + b / 2) as u8)),
            spread: std::array::from_fn(|half| {
                Bytes64::of(|b| {
                    let (o, r) = (b / 8, b % 8);
                    let index = 16 * half + 2 * o + r / 4;
                    (2 * index + r % 2) as u8
                })
            }),
            fields: Bytes64::of(|b| [0, 3, 6, 9, 32, 35, 38, 41][b % 8]),
            levels: Bytes64::of(|b| levels[b % 8]),
        }
    }

    /// Half `h` of the 64 index bytes `q`, each in two bytes (as [`CodeTables::lookup`]
    /// takes them).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VBMI.
    #[inline(always)]
    unsafe fn index_half(&self, q: __m512i, h: usize) -> __m512i {
        // SAFETY (features): the caller's contract.
        unsafe { _mm512_permutexvar_epi8(self.dup_index[h].load(), q) }
    }

    /// The 256 magnitudes from the codes of the two halves' indices.
    ///
    /// # Safety
    /// As [`QuadLevels::index_half`].
    #[inline(always)]
    unsafe fn magnitudes(&self, codes: [__m512i; 2]) -> [__m512i; 4] {
        let mut magnitudes = [codes[0]; 4];
        // SAFETY (features): the caller's contract.
        unsafe {
            for (k, m) in magnitudes.iter_mut().enumerate() {
                let spread = _mm512_permutexvar_epi8(self.spread[k % 2].load(), codes[k / 2]);
                let fields = _mm512_multishift_epi64_epi8(self.fields.load(), spread);
                *m = _mm512_permutexvar_epi8(fields, self.levels.load());
            }
        }
        magnitudes
    }
}

/// The decoded weights of one super-block: magnitudes (64 weights a register),
/// negative-weight masks, and each quad's multiplier (`2·ls + 1` in a dword's low word).
struct Decoded {
    magnitudes: [__m512i; 4],
    negative: [__mmask64; 4],
    multipliers: [__m512i; 4],
}

/// The signs and multipliers of a block whose group `g` has its 32-bit sign-and-scale
/// word (four 7-bit sign indices, `ls` in the top four bits) in qword `g` of `words`, at
/// bit `at` (`fields` the `vpmultishiftqb` control taking bits `at + 7l` to byte `l`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VBMI.
#[inline(always)]
unsafe fn signs_and_multipliers<const AT: u32>(
    words: __m512i,
    fields: __m512i,
    c: &Common,
) -> ([__mmask64; 4], [__m512i; 4]) {
    // SAFETY (features): the caller's contract.
    unsafe {
        // [8 groups × (4 sign indices, 4 unused)]; the table ignores each byte's bit 7.
        let sign_index = _mm512_multishift_epi64_epi8(fields, words);
        let signs =
            _mm512_permutex2var_epi8(c.sign_table[0].load(), sign_index, c.sign_table[1].load());
        // Qword g: 2·ls + 1 of group g (bits above the word are zero or shifted out).
        let ls = _mm512_and_si512(
            _mm512_srli_epi64::<28>(_mm512_srli_epi64::<AT>(words)),
            _mm512_set1_epi64(15),
        );
        let odd = _mm512_or_si512(_mm512_add_epi64(ls, ls), _mm512_set1_epi64(1));
        // Plain loops, not `array::from_fn`: a closure's body is not compiled with the
        // caller's target features, so its intrinsics stayed calls.
        let mut negative = [0; 4];
        let mut multipliers = [_mm512_setzero_si512(); 4];
        for k in 0..4 {
            let spread = _mm512_permutexvar_epi8(c.sign_spread[k].load(), signs);
            negative[k] = _mm512_test_epi8_mask(spread, c.bit_of_byte.load());
            multipliers[k] = _mm512_permutexvar_epi32(c.multiplier_index[k].load(), odd);
        }
        (negative, multipliers)
    }
}

/// ggml's eight lane integers of one decoded block against the 256 Q8_K quants at `xq`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `xq` is readable for 256 bytes.
#[inline(always)]
unsafe fn lanes(block: &Decoded, xq: *const u8) -> __m256i {
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

/// A grid format these kernels decode.
trait Grid {
    const BYTES: usize;
    const POST_SCALE: f32;
    /// Decodes super-block `b` (`BYTES` bytes).
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VL/VNNI/VBMI.
    unsafe fn decode(b: &[u8]) -> Decoded;
}

/// IQ2_XXS: per group of 32, four index bytes (one per eight weights, a 2-bit level
/// code each) and the sign-and-scale word.
struct Iq2xxs;

struct Iq2xxsConsts {
    codes: CodeTables<8>,
    /// Byte `2j + h` takes octet `j`'s index byte (at `8·(j/4) + j%4` of the groups).
    dup_index: Bytes64,
    octets: OctetLevels,
    /// Bytes 0..4 of each qword: bits 32 + 7l (the sign indices in the high dword).
    sign_fields: Bytes64,
    common: Common,
}

impl Grid for Iq2xxs {
    const BYTES: usize = iq2_xxs::BYTES;
    const POST_SCALE: f32 = iq2_xxs::POST_SCALE;

    #[inline(always)]
    unsafe fn decode(b: &[u8]) -> Decoded {
        static C: OnceLock<Iq2xxsConsts> = OnceLock::new();
        let c = C.get_or_init(|| Iq2xxsConsts {
            codes: CodeTables::new(&IQ2XXS_CODES),
            dup_index: Bytes64::of(|b| (8 * (b / 8) + (b / 2) % 4) as u8),
            octets: OctetLevels::new(),
            sign_fields: Bytes64::of(|b| [32, 39, 46, 53, 0, 0, 0, 0][b % 8]),
            common: Common::new(),
        });
        // SAFETY (features): the caller's contract; 64 bytes at QS inside the block.
        unsafe {
            let q = _mm512_loadu_si512(b[iq2_xxs::QS..iq2_xxs::QS + 64].as_ptr() as *const _);
            // [32 octets × (index, index)] → [32 octets × u16 code]
            let index = _mm512_permutexvar_epi8(c.dup_index.load(), q);
            let codes = c.codes.lookup(index, 0, c.common.code_byte.load());
            let magnitudes = c.octets.magnitudes(codes);
            let (negative, multipliers) =
                signs_and_multipliers::<32>(q, c.sign_fields.load(), &c.common);
            Decoded {
                magnitudes,
                negative,
                multipliers,
            }
        }
    }
}

/// IQ2_XS: per eight weights a word of a 9-bit index into 512 entries (a 2-bit level
/// code each) and a 7-bit sign index; a 4-bit scale per 16 weights.
struct Iq2xs;

struct Iq2xsConsts {
    codes: CodeTables<16>,
    /// Byte `2j + h` takes word `j`'s low byte (the index's low eight bits).
    dup_index: Bytes64,
    octets: OctetLevels,
    /// Per output register `k`: byte `b` takes the sign byte of octet `8k + b/8` (byte
    /// `2·(8k + b/8)` of the sign bytes).
    sign_spread: [Bytes64; 4],
    /// Byte `i` (of the first sixteen, repeated) starts at bit `4i`: scale nibble `i`.
    nibbles: Bytes64,
    /// Per output register `k`: dword `j`'s low byte takes the multiplier of the 16
    /// weights of group `2k + j/8`, half `(j % 8) / 4`.
    multiplier_spread: [Bytes64; 4],
    sign_table: [Bytes64; 2],
    bit_of_byte: Bytes64,
    code_byte: Bytes64,
}

impl Grid for Iq2xs {
    const BYTES: usize = iq2_xs::BYTES;
    const POST_SCALE: f32 = 0.125;

    #[inline(always)]
    unsafe fn decode(b: &[u8]) -> Decoded {
        static C: OnceLock<Iq2xsConsts> = OnceLock::new();
        let c = C.get_or_init(|| Iq2xsConsts {
            codes: CodeTables::new(&IQ2XS_CODES),
            dup_index: Bytes64::of(|b| (2 * (b / 2)) as u8),
            octets: OctetLevels::new(),
            sign_spread: std::array::from_fn(|k| Bytes64::of(|b| (2 * (8 * k + b / 8)) as u8)),
            nibbles: Bytes64::of(|b| (4 * (b % 16)) as u8),
            multiplier_spread: std::array::from_fn(|k| {
                Bytes64::of(|b| {
                    let j = b / 4;
                    (2 * (2 * k + j / 8) + (j % 8) / 4) as u8
                })
            }),
            sign_table: std::array::from_fn(|h| {
                Bytes64::of(|b| crate::formats::grids::parity_signs((64 * h + b) as u32))
            }),
            bit_of_byte: Bytes64::of(|b| 1 << (b % 8)),
            code_byte: Bytes64::of(|b| (b % 2) as u8),
        });
        let b = &b[..iq2_xs::BYTES];
        let scales =
            u64::from_le_bytes(b[iq2_xs::SCALES..iq2_xs::SCALES + 8].try_into().expect("8"));
        // SAFETY (features): the caller's contract; the loads lie inside the block.
        unsafe {
            // [32 octets × u16 word]
            let q = _mm512_loadu_si512(b[iq2_xs::QS..iq2_xs::QS + 64].as_ptr() as *const _);
            let index = _mm512_permutexvar_epi8(c.dup_index.load(), q);
            // Bit 0 of each word's high byte, the index's ninth bit, to both bytes.
            let high = _mm512_test_epi8_mask(q, _mm512_set1_epi16(0x0100));
            let bit8 = high | high >> 1;
            let codes = c.codes.lookup(index, bit8, c.code_byte.load());
            // Byte 2j: octet j's 7-bit sign index (the word's top seven bits).
            let sign_index = _mm512_srli_epi16::<9>(q);
            let signs = _mm512_permutex2var_epi8(
                c.sign_table[0].load(),
                sign_index,
                c.sign_table[1].load(),
            );
            // Byte i < 16: 2·nibble + 1 of scale nibble i.
            let nibbles = _mm512_and_si512(
                _mm512_multishift_epi64_epi8(c.nibbles.load(), _mm512_set1_epi64(scales as i64)),
                _mm512_set1_epi8(15),
            );
            let odd = _mm512_or_si512(_mm512_add_epi8(nibbles, nibbles), _mm512_set1_epi8(1));
            let magnitudes = c.octets.magnitudes(codes);
            let mut negative = [0; 4];
            let mut multipliers = [_mm512_setzero_si512(); 4];
            for k in 0..4 {
                let spread = _mm512_permutexvar_epi8(c.sign_spread[k].load(), signs);
                negative[k] = _mm512_test_epi8_mask(spread, c.bit_of_byte.load());
                multipliers[k] = _mm512_maskz_permutexvar_epi8(
                    0x1111_1111_1111_1111,
                    c.multiplier_spread[k].load(),
                    odd,
                );
            }
            Decoded {
                magnitudes,
                negative,
                multipliers,
            }
        }
    }
}

/// IQ3_XXS: 64 index bytes (one per four weights, a 3-bit level code each), then a
/// sign-and-scale word per group of 32.
struct Iq3xxs;

struct Iq3xxsConsts {
    codes: CodeTables<8>,
    quads: QuadLevels,
    /// Bytes 0..4 of each qword: bits 7l (the sign indices in the low dword).
    sign_fields: Bytes64,
    common: Common,
}

impl Grid for Iq3xxs {
    const BYTES: usize = iq3_xxs::BYTES;
    const POST_SCALE: f32 = iq3_xxs::POST_SCALE;

    #[inline(always)]
    unsafe fn decode(b: &[u8]) -> Decoded {
        static C: OnceLock<Iq3xxsConsts> = OnceLock::new();
        let c = C.get_or_init(|| Iq3xxsConsts {
            codes: CodeTables::new(&IQ3XXS_CODES),
            quads: QuadLevels::new([0x04, 0x0c, 0x14, 0x1c, 0x24, 0x2c, 0x34, 0x3e]),
            sign_fields: Bytes64::of(|b| [0, 7, 14, 21, 0, 0, 0, 0][b % 8]),
            common: Common::new(),
        });
        // SAFETY (features): the caller's contract; the loads lie inside the block.
        unsafe {
            let q = _mm512_loadu_si512(b[iq3_xxs::QS..iq3_xxs::QS + 64].as_ptr() as *const _);
            let words = _mm256_loadu_si256(
                b[iq3_xxs::SCALES_SIGNS..iq3_xxs::SCALES_SIGNS + 32].as_ptr() as *const _,
            );
            let code_byte = c.common.code_byte.load();
            let codes = [
                c.codes.lookup(c.quads.index_half(q, 0), 0, code_byte),
                c.codes.lookup(c.quads.index_half(q, 1), 0, code_byte),
            ];
            let magnitudes = c.quads.magnitudes(codes);
            // Qword g: group g's word.
            let words = _mm512_cvtepu32_epi64(words);
            let (negative, multipliers) =
                signs_and_multipliers::<0>(words, c.sign_fields.load(), &c.common);
            Decoded {
                magnitudes,
                negative,
                multipliers,
            }
        }
    }
}

/// IQ3_S: 64 index bytes and 64 ninth bits (one index per four weights into 512
/// entries, a 3-bit level code each), a stored sign bit per weight and a 4-bit scale per
/// group of 32.
struct Iq3s;

struct Iq3sConsts {
    codes: CodeTables<16>,
    quads: QuadLevels,
    code_byte: Bytes64,
}

/// Bits `0..32` of `bits` each doubled: bit `j` to bits `2j` and `2j + 1`.
#[inline(always)]
fn doubled_bits(bits: u32) -> u64 {
    let mut x = bits as u64;
    x = (x | x << 16) & 0x0000_ffff_0000_ffff;
    x = (x | x << 8) & 0x00ff_00ff_00ff_00ff;
    x = (x | x << 4) & 0x0f0f_0f0f_0f0f_0f0f;
    x = (x | x << 2) & 0x3333_3333_3333_3333;
    x = (x | x << 1) & 0x5555_5555_5555_5555;
    x | x << 1
}

impl Grid for Iq3s {
    const BYTES: usize = iq3_s::BYTES;
    const POST_SCALE: f32 = 1.0;

    #[inline(always)]
    unsafe fn decode(b: &[u8]) -> Decoded {
        static C: OnceLock<Iq3sConsts> = OnceLock::new();
        let c = C.get_or_init(|| Iq3sConsts {
            codes: CodeTables::new(&IQ3S_CODES),
            quads: QuadLevels::new([1, 3, 5, 7, 9, 11, 13, 15]),
            code_byte: Bytes64::of(|b| (b % 2) as u8),
        });
        let b = &b[..iq3_s::BYTES];
        // Bit i: the ninth bit of index i (byte g of `qh` holds group g's eight).
        let high = u64::from_le_bytes(b[iq3_s::QH..iq3_s::QH + 8].try_into().expect("8"));
        // SAFETY (features): the caller's contract; the loads lie inside the block.
        unsafe {
            let q = _mm512_loadu_si512(b[iq3_s::QS..iq3_s::QS + 64].as_ptr() as *const _);
            let code_byte = c.code_byte.load();
            let mut codes = [_mm512_setzero_si512(); 2];
            for (h, codes) in codes.iter_mut().enumerate() {
                let bit8 = doubled_bits((high >> (32 * h)) as u32);
                *codes = c.codes.lookup(c.quads.index_half(q, h), bit8, code_byte);
            }
            let magnitudes = c.quads.magnitudes(codes);
            let mut negative = [0; 4];
            let mut multipliers = [_mm512_setzero_si512(); 4];
            for k in 0..4 {
                // Bit 8o + e of the eight sign bytes of groups 2k, 2k + 1: weight 64k + 8o + e.
                let signs = &b[iq3_s::SIGNS + 8 * k..iq3_s::SIGNS + 8 * k + 8];
                negative[k] = u64::from_le_bytes(signs.try_into().expect("8"));
                let scales = b[iq3_s::SCALES + k] as i32;
                multipliers[k] = _mm512_mask_blend_epi32(
                    0xff00,
                    _mm512_set1_epi32(2 * (scales & 15) + 1),
                    _mm512_set1_epi32(2 * (scales >> 4) + 1),
                );
            }
            Decoded {
                magnitudes,
                negative,
                multipliers,
            }
        }
    }
}

/// A grid format × Q8_K for `N` activation rows, each weight block decoded once.
///
/// # Safety
/// [`available`] is true.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")]
unsafe fn grid_impl<G: Grid, const N: usize>(w: &[u8], xs: [&[u8]; N]) -> [f32; N] {
    let n_blocks = crate::avx2::common_blocks(w, &xs, G::BYTES, Q8_K_BYTES);
    let mut acc = [_mm256_setzero_ps(); N];
    for i in 0..n_blocks {
        let b = &w[i * G::BYTES..(i + 1) * G::BYTES];
        let xb = crate::avx2::block_of_each(&xs, i, Q8_K_BYTES);
        // SAFETY: the features are enabled here.
        let block = unsafe { G::decode(b) };
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
        *o = G::POST_SCALE * hsum_ps(a);
    }
    out
}

/// IQ2_XXS × Q8_K (a [`crate::dot_scalar::DotKernel`]).
pub(crate) fn dot_iq2_xxs_q8_k(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: handed out only by `crate::avx512::kernel` after [`available`].
    let [y] = unsafe { grid_impl::<Iq2xxs, 1>(w, [x]) };
    y
}

/// IQ2_XXS × four Q8_K rows (a [`crate::formats::DotKernel4`]).
pub(crate) fn dot4_iq2_xxs_q8_k(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    unsafe { grid_impl::<Iq2xxs, 4>(w, x) }
}

/// IQ3_XXS × Q8_K.
pub(crate) fn dot_iq3_xxs_q8_k(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    let [y] = unsafe { grid_impl::<Iq3xxs, 1>(w, [x]) };
    y
}

/// IQ3_XXS × four Q8_K rows.
pub(crate) fn dot4_iq3_xxs_q8_k(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    unsafe { grid_impl::<Iq3xxs, 4>(w, x) }
}

/// IQ3_S × Q8_K.
pub(crate) fn dot_iq3_s_q8_k(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    let [y] = unsafe { grid_impl::<Iq3s, 1>(w, [x]) };
    y
}

/// IQ3_S × four Q8_K rows.
pub(crate) fn dot4_iq3_s_q8_k(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    unsafe { grid_impl::<Iq3s, 4>(w, x) }
}

/// IQ2_XS × Q8_K.
pub(crate) fn dot_iq2_xs_q8_k(w: &[u8], x: &[u8]) -> f32 {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    let [y] = unsafe { grid_impl::<Iq2xs, 1>(w, [x]) };
    y
}

/// IQ2_XS × four Q8_K rows.
pub(crate) fn dot4_iq2_xs_q8_k(w: &[u8], x: [&[u8]; 4]) -> [f32; 4] {
    // SAFETY: as [`dot_iq2_xxs_q8_k`].
    unsafe { grid_impl::<Iq2xs, 4>(w, x) }
}
