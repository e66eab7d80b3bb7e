//! GELU through an f16 lookup table, reproducing how ggml's CPU backend evaluates GELU.
//!
//! ggml (built with its default `GGML_GELU_FP16`) does not evaluate the tanh formula
//! per element for f32 GELU / GeGLU: for `-10 < x < 10` it rounds `x` to f16, looks up
//! `f16(gelu_tanh(f32(that f16)))` in a 65 536-entry table and widens the result; for
//! `x <= -10` it returns 0 and for `x >= 10` it returns `x`. The result differs from
//! [`crate::gelu_tanh`] by up to f16 precision. This module reproduces it so a forward
//! pass can choose to follow the reference engine bit for bit in this op.

use std::sync::OnceLock;

use half::f16;

use crate::scalar;

/// The 65 536-entry f16 GELU table (128 KiB), indexed by the bits of an f16 input
/// (plus one entry of padding).
#[derive(Clone)]
pub struct GeluTable {
    table: Box<[f16]>,
}

impl std::fmt::Debug for GeluTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeluTable")
            .field("entries", &self.table.len())
            .finish()
    }
}

impl Default for GeluTable {
    fn default() -> Self {
        GeluTable::new()
    }
}

impl GeluTable {
    /// Builds the table (65 536 tanh evaluations, about a millisecond).
    pub fn new() -> GeluTable {
        let table = (0..=u16::MAX)
            .map(|bits| f16::from_f32(scalar::gelu_tanh(f16::from_bits(bits).to_f32())))
            // One entry of padding: the vector lookups read 32 bits at each entry.
            .chain(std::iter::once(f16::ZERO))
            .collect::<Vec<f16>>()
            .into_boxed_slice();
        GeluTable { table }
    }

    /// The process-wide table, built on first use.
    pub fn shared() -> &'static GeluTable {
        static TABLE: OnceLock<GeluTable> = OnceLock::new();
        TABLE.get_or_init(GeluTable::new)
    }

    /// GELU of `x` the way ggml's f32 GELU computes it (see the module docs).
    #[inline]
    pub fn gelu(&self, x: f32) -> f32 {
        if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x
        } else {
            let bits = f16::from_f32(x).to_bits();
            self.table[usize::from(bits)].to_f32()
        }
    }

    /// `gate[i] = gelu(gate[i])·up[i]` (the common length): [`GeluTable::gelu`] then one
    /// multiplication, sixteen or eight at a time where the CPU has AVX-512 or AVX2 with
    /// F16C (the rounding to f16, the lookup and the widening are the same operations,
    /// so the bits are too).
    pub fn gelu_mul_in_place(&self, gate: &mut [f32], up: &[f32]) {
        let n = gate.len().min(up.len());
        let (gate, up) = (&mut gate[..n], &up[..n]);
        #[cfg(target_arch = "x86_64")]
        let done = if crate::use_avx512() {
            // SAFETY: use_avx512 verified AVX-512 F (and F16C, AVX2) on this CPU.
            unsafe { self.gelu_mul_avx512(gate, up) }
        } else if crate::use_avx2_fma() && std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2 and F16C verified just above.
            unsafe { self.gelu_mul_avx2(gate, up) }
        } else {
            0
        };
        #[cfg(not(target_arch = "x86_64"))]
        let done = 0;
        for (g, &u) in gate[done..].iter_mut().zip(&up[done..]) {
            *g = self.gelu(*g) * u;
        }
    }

    /// [`GeluTable::gelu_mul_in_place`] on whole groups of sixteen; returns how many
    /// values it did.
    ///
    /// # Safety
    /// The CPU has AVX-512 F and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn gelu_mul_avx512(&self, gate: &mut [f32], up: &[f32]) -> usize {
        use std::arch::x86_64::*;
        let whole = gate.len().min(up.len()) / 16 * 16;
        let base = self.table.as_ptr() as *const u8;
        let (lo, hi) = (_mm512_set1_ps(-10.0), _mm512_set1_ps(10.0));
        for i in (0..whole).step_by(16) {
            // SAFETY: i + 16 <= whole, inside both slices; every gathered index is an
            // f16's bits (< 65 536) and the table has one entry more, so each 32-bit
            // read at 2·index lies inside it.
            unsafe {
                let x = _mm512_loadu_ps(gate.as_ptr().add(i));
                let u = _mm512_loadu_ps(up.as_ptr().add(i));
                let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
                let idx = _mm512_cvtepu16_epi32(h);
                let entries = _mm512_i32gather_epi32::<2>(idx, base as *const _);
                let y = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(entries));
                // Below −10 the GELU is 0, from 10 up it is x (then times up).
                let y = _mm512_mask_blend_ps(
                    _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, hi),
                    _mm512_maskz_mov_ps(!_mm512_cmp_ps_mask::<_CMP_LE_OQ>(x, lo), y),
                    x,
                );
                _mm512_storeu_ps(gate.as_mut_ptr().add(i), _mm512_mul_ps(y, u));
            }
        }
        whole
    }

    /// [`GeluTable::gelu_mul_in_place`] on whole groups of eight (AVX2); returns how
    /// many values it did.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn gelu_mul_avx2(&self, gate: &mut [f32], up: &[f32]) -> usize {
        use std::arch::x86_64::*;
        let whole = gate.len().min(up.len()) / 8 * 8;
        let base = self.table.as_ptr() as *const i32;
        let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
        // Bytes 0-1, 4-5, 8-9, 12-13 of each 128-bit half: the entries' low 16 bits.
        let low_halves = _mm256_setr_epi8(
            0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5, 8, 9, 12, 13, -1,
            -1, -1, -1, -1, -1, -1, -1,
        );
        for i in (0..whole).step_by(8) {
            // SAFETY: as in gelu_mul_avx512.
            unsafe {
                let x = _mm256_loadu_ps(gate.as_ptr().add(i));
                let u = _mm256_loadu_ps(up.as_ptr().add(i));
                let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
                let idx = _mm256_cvtepu16_epi32(h);
                let entries = _mm256_i32gather_epi32::<2>(base, idx);
                let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_shuffle_epi8(
                    entries, low_halves,
                ));
                let y = _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
                let y = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(x, lo), y);
                let y = _mm256_blendv_ps(y, x, _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi));
                _mm256_storeu_ps(gate.as_mut_ptr().add(i), _mm256_mul_ps(y, u));
            }
        }
        whole
    }

    /// `out[i] = gelu(gate[i])·up[i]` with the table GELU, like ggml's `geglu` op
    /// (for `gate >= 10` it is `gate·up`).
    pub fn geglu(&self, out: &mut [f32], gate: &[f32], up: &[f32]) {
        debug_assert_eq!(out.len(), gate.len(), "geglu: out/gate length mismatch");
        debug_assert_eq!(out.len(), up.len(), "geglu: out/up length mismatch");
        for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
            // ggml writes a plain 0 below −10 (not 0·up), so keep that branch separate.
            *o = if g <= -10.0 { 0.0 } else { self.gelu(g) * u };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 value as an input (so every table entry is read), the edges of the
    /// table's range, infinities and NaN, times factors of either sign.
    fn inputs() -> (Vec<f32>, Vec<f32>) {
        let mut gate: Vec<f32> = (0..=u16::MAX).map(|b| f16::from_bits(b).to_f32()).collect();
        gate.extend([-10.0, 10.0, -10.000001, 9.999999, 1e30, -1e30, 1.0000001]);
        gate.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -0.0, 0.0]);
        let up = (0..gate.len())
            .map(|i| match i % 5 {
                0 => 1.0,
                1 => -0.75,
                2 => 3.5e-3,
                3 => -1e4,
                _ => 0.0,
            })
            .collect();
        (gate, up)
    }

    fn scalar(table: &GeluTable, gate: &[f32], up: &[f32]) -> Vec<u32> {
        let y = gate.iter().zip(up).map(|(&g, &u)| table.gelu(g) * u);
        y.map(f32::to_bits).collect()
    }

    /// Names the first element whose bits differ (the vectors are long to print).
    fn same_bits(got: &[f32], want: &[u32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i]) {
            panic!(
                "{what}: element {i}: {:#x}, want {:#x}",
                got[i].to_bits(),
                want[i]
            );
        }
    }

    #[test]
    fn gelu_mul_in_place_is_the_scalar_lookup() {
        let table = GeluTable::shared();
        let (gate, up) = inputs();
        for len in [0, 1, 7, 8, 9, 15, 16, 17, 31, gate.len()] {
            let mut got = gate[..len].to_vec();
            table.gelu_mul_in_place(&mut got, &up[..len]);
            same_bits(
                &got,
                &scalar(table, &gate[..len], &up[..len]),
                &format!("len {len}"),
            );
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn gelu_mul_simd_tiers_are_the_scalar_lookup() {
        let table = GeluTable::shared();
        let (gate, up) = inputs();
        let want = scalar(table, &gate, &up);
        let check = |f: &dyn Fn(&mut [f32], &[f32]) -> usize, tier: &str| {
            let mut got = gate.clone();
            let done = f(&mut got, &up);
            assert!(done > gate.len() - 16, "{tier} did {done}");
            same_bits(&got[..done], &want[..done], tier);
        };
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: AVX2 and F16C detected.
            check(&|g, u| unsafe { table.gelu_mul_avx2(g, u) }, "avx2");
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("f16c")
        {
            // SAFETY: AVX-512 F and F16C detected.
            check(&|g, u| unsafe { table.gelu_mul_avx512(g, u) }, "avx512");
        }
    }
}
