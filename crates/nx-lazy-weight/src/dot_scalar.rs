//! Scalar reference dot products of one weight row with one activation row: the float
//! types' here, every quantized format's in its module of [`crate::formats`]
//! (`formats::q4_k::dot`, …), all handed out by [`dot_kernel`].
//!
//! Every quantized kernel reproduces the float order of the reference engine's x86
//! kernel (see `crate::reduce::Lanes8`): exact integer lanes per block, one fused
//! multiply-add of the block scale into each of eight f32 lanes, the lanes summed at the
//! end as ggml's `hsum_float_8`; Q4_K adds its min terms through four more lanes, Q5_K
//! (like Q4_1/Q5_1 in their modules) through one running f32 added last. The order depends
//! on the row length K alone. F32, F16 and BF16 follow ggml's AVX-512 kernels (BF16 its
//! AVX512_BF16 one).
//! The SIMD kernels (`avx2`, `avx512`) compute the same lane integers in the same float
//! order, so they are bit-identical to these (`tests/simd_twins.rs`), and both equal the
//! reference engine's own kernels bit for bit (`tests/dot_reference.rs`). Which kernel
//! runs is chosen in [`crate::dispatch`].
//!
//! | weight | activations | per block | accumulation |
//! |---|---|---|---|
//! | F32 | F32 | fused `w·x` | 64 f32 lanes (ggml's AVX-512 `vec_dot_f32`), f32 tail |
//! | F16 | F16 | fused `w·x` | 64 f32 lanes (ggml's AVX-512 `vec_dot_f16`), f64 tail |
//! | BF16 | BF16 | `vdpbf16ps` pairs | 32 f32 lanes (ggml's AVX512_BF16 `vec_dot_bf16`), f64 tail |
//! | Q4_0 | Q8_0 | `sumi` i32 | `sumf += (sumi·d_w)·d_x` |
//! | Q5_0 | Q8_0 | `sumi` i32 | `sumf += (d_w·d_x)·sumi` |
//! | Q8_0 | Q8_0 | `sumi` i32 | `sumf += sumi·(d_w·d_x)` |
//! | Q4_K, Q5_K, Q6_K | Q8_K | eight i32 lanes | lanes as above (mins apart) |

use nx_gguf::GgmlType;

use crate::formats::{bf16_to_f32, f16_to_f32, read_f32};

pub use crate::formats::DotKernel;

/// The scalar dot kernel for a weight type (activations in its
/// [`vec_dot_type`](crate::formats::vec_dot_type)).
pub fn dot_kernel(weight_type: GgmlType) -> Option<DotKernel> {
    let kernel: DotKernel = match weight_type {
        GgmlType::F32 => dot_f32,
        GgmlType::F16 => dot_f16,
        GgmlType::BF16 => dot_bf16,
        _ => {
            return crate::formats::block_format(weight_type)
                .and_then(|f| f.dot)
                .map(|(_, dot)| dot)
        }
    };
    Some(kernel)
}

/// F32 × F32 in the order of ggml's AVX-512 `vec_dot_f32` (what the reference runs for
/// an F32 weight such as a MoE router): 64 running fused multiply-adds, lane `l` taking
/// elements `l, l+64, …`, reduced as four 16-lane registers, then the elements past the
/// last whole 64 added one by one in f32.
#[inline(always)] // into `scalar_x86`'s copy compiled for AVX2 + FMA
pub fn dot_f32(w: &[u8], x: &[u8]) -> f32 {
    const LANES: usize = 64;
    let n = (w.len() / 4).min(x.len() / 4);
    let whole = n / LANES * LANES;
    let mut lanes = [0f32; LANES];
    for (cw, cx) in w[..whole * 4]
        .chunks_exact(LANES * 4)
        .zip(x[..whole * 4].chunks_exact(LANES * 4))
    {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = read_f32(cw, 4 * l).mul_add(read_f32(cx, 4 * l), *lane);
        }
    }
    let mut sum = if whole > 0 {
        nx_f32::scalar::reduce_lanes_64(&lanes)
    } else {
        0.0
    };
    for i in whole..n {
        sum += read_f32(w, 4 * i) * read_f32(x, 4 * i);
    }
    sum
}

/// F16 × F16 (the activations rounded to F16) in the order of ggml's AVX-512
/// `vec_dot_f16`, the reference's one-token path for an F16 weight: [`dot_f32`]'s 64
/// running fused multiply-adds of the values widened to f32, reduced the same way, then
/// the elements past the last whole 64 added in f64 (each product rounded to f32 first),
/// and the f64 sum rounded to f32. (A product of two f16 values is exact in f32, so the
/// fused and the unfused multiply-add give the same bits: the order is what matters.)
#[inline(always)] // into `scalar_x86`'s copy compiled for AVX2 + FMA
pub fn dot_f16(w: &[u8], x: &[u8]) -> f32 {
    const LANES: usize = 64;
    let n = (w.len() / 2).min(x.len() / 2);
    let whole = n / LANES * LANES;
    let at = |b: &[u8], i: usize| f16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let mut lanes = [0f32; LANES];
    for start in (0..whole).step_by(LANES) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            *lane = at(w, start + l).mul_add(at(x, start + l), *lane);
        }
    }
    let mut sum = f64::from(nx_f32::scalar::reduce_lanes_64(&lanes));
    for i in whole..n {
        sum += f64::from(at(w, i) * at(x, i));
    }
    sum as f32
}

/// BF16 × BF16 (the activations rounded to BF16) in the order of ggml's AVX-512 BF16
/// `vec_dot_bf16`, the reference's one-token path for a BF16 weight on CPUs with
/// AVX512_BF16 (its build for the machine uses `vdpbf16ps`): two 16-lane registers, the
/// first taking each 64-element chunk's first 32 elements and the second its last 32,
/// lane `l` adding elements `2l + 1` and then `2l` ([`dpbf16_step`]); each register
/// reduced as a 512-bit register is, the two sums and then the elements past the last
/// whole 64 (each product in f32) added in f64, and the f64 sum rounded to f32.
#[inline(always)] // into `scalar_x86`'s copy compiled for AVX2 + FMA
pub fn dot_bf16(w: &[u8], x: &[u8]) -> f32 {
    const CHUNK: usize = 64;
    let n = (w.len() / 2).min(x.len() / 2);
    let whole = n / CHUNK * CHUNK;
    let at = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let mut regs = [[0f32; 16]; 2];
    for start in (0..whole).step_by(CHUNK) {
        for (half, reg) in regs.iter_mut().enumerate() {
            let base = start + 32 * half;
            for (l, lane) in reg.iter_mut().enumerate() {
                let (even, odd) = (base + 2 * l, base + 2 * l + 1);
                *lane = dpbf16_step(*lane, at(w, odd), at(x, odd));
                *lane = dpbf16_step(*lane, at(w, even), at(x, even));
            }
        }
    }
    bf16_sum(&regs, (w, x), (whole, n))
}

/// The end of every BF16 kernel: the two 16-lane registers `regs` each reduced as a
/// 512-bit register is, then the elements `whole..n` of `w` and `x` (each product in f32),
/// all added in f64 and rounded to f32.
#[inline(always)]
pub(crate) fn bf16_sum(
    regs: &[[f32; 16]; 2],
    (w, x): (&[u8], &[u8]),
    (whole, n): (usize, usize),
) -> f32 {
    let at = |b: &[u8], i: usize| bf16_to_f32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]));
    let mut sum = f64::from(nx_f32::scalar::reduce_add_16(&regs[0]));
    sum += f64::from(nx_f32::scalar::reduce_add_16(&regs[1]));
    for i in whole..n {
        sum += f64::from(at(w, i) * at(x, i));
    }
    sum as f32
}

/// One product-accumulate of `vdpbf16ps`: `acc + a·b` in one rounding (to nearest even),
/// with subnormal inputs read as zero and a subnormal result written as zero (the
/// instruction ignores MXCSR and always works so). A product of two BF16 values is exact
/// in f32, so only the addition rounds.
#[inline(always)]
pub fn dpbf16_step(acc: f32, a: f32, b: f32) -> f32 {
    flush_subnormal(flush_subnormal(a).mul_add(flush_subnormal(b), flush_subnormal(acc)))
}

/// `v`, or a zero of its sign where `v` is subnormal.
#[inline(always)]
fn flush_subnormal(v: f32) -> f32 {
    if v.is_subnormal() {
        0f32.copysign(v)
    } else {
        v
    }
}
