//! Criterion benchmarks of the CPU's 512-bit execution pipes: how many `vpdpbusd`, FMA,
//! int-to-float conversions and `vpermd` it retires per unit of time, alone and in the
//! pairs and mixes the quantized kernels are built from. They are the floors the kernel
//! notes cite: the bit-identical kernels need one `vpdpbusd`, one conversion and one FMA
//! per sixteen lanes per block, and where two of those share a pipe no reordering of a
//! kernel gets under their sum.
//!
//! Every case runs independent chains in registers (no memory traffic; empty `asm!`
//! barriers keep the compiler from folding or hoisting them) and reports instructions
//! per second (`elem/s`), so a case's time divided by `fma8`'s, times 8, is its cycles
//! per iteration where one 512-bit FMA retires per cycle. On AMD EPYC family 25 model 17
//! (Zen 4): `fma8`, `dpbusd8`, `cvt8` and `vpermd8` take the same time (one per cycle);
//! `dpbusd4_fma4` as long as `dpbusd8` (one shared pipe) while `dpbusd4_cvt4` takes half.
//! The `narrow_block*` cases are one weight block of the eight-token narrow tile
//! (`nx_lazy_weight::narrow`) against one row: as written (11 cycles), without its four
//! `vpermd` (9: the floor of 4 `vpdpbusd` + 4 FMA + 1 multiply on the shared pipe), and
//! without its conversions (10: they run beside, and the FMA then waits on integer
//! inputs).
//! `dpwssd8`, `maddubs8` and `madd8` also retire one per cycle there, and beside four
//! `vpdpbusd` chains (`dpbusd4_*`, 1.12 µs where nothing else shares their pipe) four
//! `vpdpwssd` or `vpmaddubsw` take as long as `dpbusd8` (2.24 µs: the same pipe), four
//! word blends nothing (1.13), four `vpslld` a third more (1.50), four `vpslldq` half
//! more (1.68) and four `vpshldd` as long as `dpbusd8` (2.24): so the K tiles
//! (`nx_lazy_weight::tiled`) join two sub-blocks' quads in one dword by `vpslld` (and a
//! word blend where the low quad can be negative) to save a `vpdpwssd`.
//! `avx2_group_block` is one weight block of the AVX2 token groups against eight tokens
//! (`nx_lazy_weight::groups_avx2`: per token its activations loaded, two 256-bit `madd`s,
//! an add, a conversion and an FMA): about 21 cycles for the block on Zen 4 (5.7-6.3 µs
//! against `fma8`'s 2.28), well above the 12 its 16 `madd`s and 8 FMAs need on their two
//! shared pipes; `_multiply` forms each token's `d_w·d_x` by a scalar multiply and a
//! register broadcast instead of a broadcast load from a table, and takes as long here.
//! The kernel's Gemma 3 LM head pass at eight tokens (`lm_head_timing`, one thread) runs
//! at about 25 cycles per row block, this block plus the weight block's decoding.
//! `dpbusd8_broadcast` (the signed operand a 32-bit broadcast from memory, as the bound
//! pass and the wide tiles take a weight quad) retires one a cycle like `dpbusd8`.
//! `bound_block` and `lane_block` are one block of the LM head's bound pass
//! (`nx_lazy_weight::bounded`) with its data in L1: sixteen tokens against four rows at
//! 10.1 cycles a row (40 per iteration: its 8 `vpdpbusd`, multiply and FMA a row on the
//! shared pipe, nothing else in the way), and the row-lane pass at eight tokens against
//! sixteen rows at 5.5 cycles a row (its floor on that pipe 5). Both passes ran at 12.8
//! and 7.6 cycles a row reading their rows from L2 or L3 (`benches/batched`
//! `bounded-cached`), which is what the row-lane pass's loads one block ahead address.
//! Run: `cargo bench -p nx-benches --bench pipes` (AVX-512 VNNI CPUs; elsewhere it prints
//! that it skipped).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};

/// Loop iterations per timed call.
const ITERS: u64 = 1024;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Keeps the registers opaque to the optimizer (their values could have changed):
    /// 512-bit ones, or those of the register class named first (`ymm_reg: a, b`), or
    /// pointers (`ptr: p, q`: the memory behind them may have changed too, so what is
    /// read through them is read again).
    macro_rules! opaque {
        (ptr: $($v:ident),*) => {
            // SAFETY: the template is a comment (no instruction, no access).
            unsafe {
                asm!(
                    concat!("# ", $("{", stringify!($v), "} "),*),
                    $($v = inout(reg) $v,)*
                    options(nostack, preserves_flags)
                )
            }
        };
        ($class:ident: $($v:ident),*) => {
            // SAFETY: the template is a comment (no instruction); it only pins the values in
            // registers.
            unsafe {
                asm!(
                    concat!("# ", $("{", stringify!($v), "} "),*),
                    $($v = inout($class) $v,)*
                    options(nomem, nostack, preserves_flags)
                )
            }
        };
        ($($v:ident),*) => {
            opaque!(zmm_reg: $($v),*)
        };
    }

    /// Makes the registers count as used (by an instruction the optimizer cannot see
    /// through), so the work that made them stays.
    macro_rules! sink {
        ($($v:ident),*) => {
            // SAFETY: the template is a comment (no instruction).
            unsafe {
                asm!(
                    concat!("# ", $("{", stringify!($v), "} "),*),
                    $($v = in(zmm_reg) $v,)*
                    options(nomem, nostack, preserves_flags)
                )
            }
        };
    }

    /// Eight independent chains `$a = $e` on i32 registers, `$x` and `$y` opaque
    /// constants.
    macro_rules! eight_int {
        ($name:ident, |$a:ident, $x:ident, $y:ident| $e:expr) => {
            /// Eight independent chains, `iters` times.
            ///
            /// # Safety
            /// The CPU has AVX-512 F/BW/VNNI.
            #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
            pub unsafe fn $name(iters: u64) -> f32 {
                let (mut a0, mut a1, mut a2, mut a3) = (
                    _mm512_set1_epi32(1),
                    _mm512_set1_epi32(2),
                    _mm512_set1_epi32(3),
                    _mm512_set1_epi32(4),
                );
                let (mut a4, mut a5, mut a6, mut a7) = (a0, a1, a2, a3);
                let (mut $x, mut $y) = (_mm512_set1_epi32(0x0102_0304), _mm512_set1_epi32(2));
                opaque!($x, $y);
                for _ in 0..iters {
                    a0 = {
                        let $a = a0;
                        $e
                    };
                    a1 = {
                        let $a = a1;
                        $e
                    };
                    a2 = {
                        let $a = a2;
                        $e
                    };
                    a3 = {
                        let $a = a3;
                        $e
                    };
                    a4 = {
                        let $a = a4;
                        $e
                    };
                    a5 = {
                        let $a = a5;
                        $e
                    };
                    a6 = {
                        let $a = a6;
                        $e
                    };
                    a7 = {
                        let $a = a7;
                        $e
                    };
                    opaque!(a0, a1, a2, a3, a4, a5, a6, a7);
                }
                let s = _mm512_add_epi32(
                    _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3)),
                    _mm512_add_epi32(_mm512_add_epi32(a4, a5), _mm512_add_epi32(a6, a7)),
                );
                _mm512_reduce_add_epi32(s) as f32
            }
        };
    }

    eight_int!(dpbusd8, |a, x, y| _mm512_dpbusd_epi32(a, x, y));
    eight_int!(vpaddd8, |a, x, y| _mm512_add_epi32(
        _mm512_add_epi32(a, x),
        y
    ));
    eight_int!(dpwssd8, |a, x, y| _mm512_dpwssd_epi32(a, x, y));
    eight_int!(maddubs8, |a, _x, y| _mm512_maddubs_epi16(a, y));
    eight_int!(madd8, |a, _x, y| _mm512_madd_epi16(a, y));

    /// Eight independent `vpdpbusd` chains whose signed operand is a 32-bit broadcast
    /// from memory (`{1to16}`, as the LM head's bound pass and the wide tiles take a
    /// weight quad), `iters` times; each chain reads its own dword of `quads`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dpbusd8_broadcast(iters: u64) -> f32 {
        let quads = [0x0102_0304_i32; 8];
        let p = quads.as_ptr();
        let mut a = [_mm512_set1_epi32(1); 8];
        let mut x = _mm512_set1_epi32(0x0102_0304);
        opaque!(x);
        for _ in 0..iters {
            // SAFETY: `p` points at eight dwords; the template reads each once.
            unsafe {
                asm!(
                    "vpdpbusd {a0}, {x}, dword ptr [{p}]{{1to16}}",
                    "vpdpbusd {a1}, {x}, dword ptr [{p} + 4]{{1to16}}",
                    "vpdpbusd {a2}, {x}, dword ptr [{p} + 8]{{1to16}}",
                    "vpdpbusd {a3}, {x}, dword ptr [{p} + 12]{{1to16}}",
                    "vpdpbusd {a4}, {x}, dword ptr [{p} + 16]{{1to16}}",
                    "vpdpbusd {a5}, {x}, dword ptr [{p} + 20]{{1to16}}",
                    "vpdpbusd {a6}, {x}, dword ptr [{p} + 24]{{1to16}}",
                    "vpdpbusd {a7}, {x}, dword ptr [{p} + 28]{{1to16}}",
                    a0 = inout(zmm_reg) a[0],
                    a1 = inout(zmm_reg) a[1],
                    a2 = inout(zmm_reg) a[2],
                    a3 = inout(zmm_reg) a[3],
                    a4 = inout(zmm_reg) a[4],
                    a5 = inout(zmm_reg) a[5],
                    a6 = inout(zmm_reg) a[6],
                    a7 = inout(zmm_reg) a[7],
                    x = in(zmm_reg) x,
                    p = in(reg) p,
                    options(readonly, nostack, preserves_flags)
                );
            }
        }
        let s = a
            .iter()
            .fold(_mm512_setzero_si512(), |s, &v| _mm512_add_epi32(s, v));
        _mm512_reduce_add_epi32(s) as f32
    }

    /// What [`dpbusd4_with4`] runs beside its four `vpdpbusd` chains.
    pub const SHIFT: u8 = 0;
    /// A word blend under a mask.
    pub const BLEND: u8 = 1;
    /// `vpmaddubsw`.
    pub const MADDUBS: u8 = 2;
    /// `vpdpwssd`.
    pub const DPWSSD: u8 = 3;
    /// A byte shift within 128-bit lanes (`vpslldq`).
    pub const BYTE_SHIFT: u8 = 4;
    /// A concatenating shift (`vpshldd`, AVX-512 VBMI2).
    pub const SHLD: u8 = 5;

    /// Four `vpdpbusd` chains beside four chains of `OP` ([`SHIFT`], [`BLEND`],
    /// [`MADDUBS`] or [`DPWSSD`]), `iters` times: whether `OP` takes the pipe `vpdpbusd`
    /// uses.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx512vbmi2")]
    pub unsafe fn dpbusd4_with4<const OP: u8>(iters: u64) -> f32 {
        let mut a = [
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(2),
            _mm512_set1_epi32(3),
            _mm512_set1_epi32(4),
        ];
        let mut b = a;
        let (mut x, mut y) = (_mm512_set1_epi32(0x0102_0304), _mm512_set1_epi32(2));
        opaque!(x, y);
        for _ in 0..iters {
            for (a, b) in a.iter_mut().zip(b.iter_mut()) {
                *a = _mm512_dpbusd_epi32(*a, x, y);
                *b = match OP {
                    SHIFT => _mm512_slli_epi32::<3>(*b),
                    BLEND => _mm512_mask_blend_epi16(0xAAAA_AAAA, *b, y),
                    MADDUBS => _mm512_maddubs_epi16(*b, y),
                    BYTE_SHIFT => _mm512_bslli_epi128::<2>(*b),
                    SHLD => _mm512_shldi_epi32::<16>(*b, y),
                    _ => _mm512_dpwssd_epi32(*b, x, y),
                };
            }
            let [mut a0, mut a1, mut a2, mut a3] = a;
            let [mut b0, mut b1, mut b2, mut b3] = b;
            opaque!(a0, a1, a2, a3, b0, b1, b2, b3);
            a = [a0, a1, a2, a3];
            b = [b0, b1, b2, b3];
        }
        let s = _mm512_add_epi32(_mm512_add_epi32(a[0], a[1]), _mm512_add_epi32(a[2], a[3]));
        let t = _mm512_add_epi32(_mm512_add_epi32(b[0], b[1]), _mm512_add_epi32(b[2], b[3]));
        _mm512_reduce_add_epi32(_mm512_add_epi32(s, t)) as f32
    }

    /// Eight independent FMA chains, `iters` times.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn fma8(iters: u64) -> f32 {
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_set1_ps(1.0),
            _mm512_set1_ps(2.0),
            _mm512_set1_ps(3.0),
            _mm512_set1_ps(4.0),
        );
        let (mut a4, mut a5, mut a6, mut a7) = (a0, a1, a2, a3);
        let (mut x, mut y) = (_mm512_set1_ps(0.5), _mm512_set1_ps(0.25));
        opaque!(x, y);
        for _ in 0..iters {
            a0 = _mm512_fmadd_ps(a0, x, y);
            a1 = _mm512_fmadd_ps(a1, x, y);
            a2 = _mm512_fmadd_ps(a2, x, y);
            a3 = _mm512_fmadd_ps(a3, x, y);
            a4 = _mm512_fmadd_ps(a4, x, y);
            a5 = _mm512_fmadd_ps(a5, x, y);
            a6 = _mm512_fmadd_ps(a6, x, y);
            a7 = _mm512_fmadd_ps(a7, x, y);
            opaque!(a0, a1, a2, a3, a4, a5, a6, a7);
        }
        let s = _mm512_add_ps(
            _mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
            _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)),
        );
        _mm512_reduce_add_ps(s)
    }

    /// Eight conversions (`PERMUTE`: eight `vpermd`) of registers the barrier renews,
    /// `iters` times: no chain between iterations, so this is the rate, not a latency.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn unary8<const PERMUTE: bool>(iters: u64) -> f32 {
        let (mut q0, mut q1, mut q2, mut q3) = (
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(2),
            _mm512_set1_epi32(3),
            _mm512_set1_epi32(4),
        );
        let (mut q4, mut q5, mut q6, mut q7) = (q0, q1, q2, q3);
        let mut index = _mm512_set1_epi32(5);
        opaque!(index);
        // (A macro, not a closure: a closure would not share this function's features.)
        macro_rules! op {
            ($q:expr) => {
                match PERMUTE {
                    true => _mm512_castsi512_ps(_mm512_permutexvar_epi32(index, $q)),
                    false => _mm512_cvtepi32_ps($q),
                }
            };
        }
        let mut last = _mm512_setzero_ps();
        for _ in 0..iters {
            opaque!(q0, q1, q2, q3, q4, q5, q6, q7);
            let (f0, f1, f2, f3) = (op!(q0), op!(q1), op!(q2), op!(q3));
            let (f4, f5, f6, f7) = (op!(q4), op!(q5), op!(q6), op!(q7));
            sink!(f0, f1, f2, f3, f4, f5, f6, f7);
            last = f7;
        }
        _mm512_reduce_add_ps(last)
    }

    /// Four `vpdpbusd` chains beside four FMA chains (`FMA`) or four conversions,
    /// `iters` times.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn dpbusd4_and4<const FMA: bool>(iters: u64) -> f32 {
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(2),
            _mm512_set1_epi32(3),
            _mm512_set1_epi32(4),
        );
        let (mut q0, mut q1, mut q2, mut q3) = (a0, a1, a2, a3);
        let (mut f0, mut f1, mut f2, mut f3) = (
            _mm512_set1_ps(1.0),
            _mm512_set1_ps(2.0),
            _mm512_set1_ps(3.0),
            _mm512_set1_ps(4.0),
        );
        let (mut x, mut y) = (_mm512_set1_epi32(0x0102_0304), _mm512_set1_epi32(2));
        let (mut fx, mut fy) = (_mm512_set1_ps(0.5), _mm512_set1_ps(0.25));
        opaque!(x, y, fx, fy);
        for _ in 0..iters {
            a0 = _mm512_dpbusd_epi32(a0, x, y);
            a1 = _mm512_dpbusd_epi32(a1, x, y);
            a2 = _mm512_dpbusd_epi32(a2, x, y);
            a3 = _mm512_dpbusd_epi32(a3, x, y);
            if FMA {
                f0 = _mm512_fmadd_ps(f0, fx, fy);
                f1 = _mm512_fmadd_ps(f1, fx, fy);
                f2 = _mm512_fmadd_ps(f2, fx, fy);
                f3 = _mm512_fmadd_ps(f3, fx, fy);
            } else {
                opaque!(q0, q1, q2, q3);
                f0 = _mm512_cvtepi32_ps(q0);
                f1 = _mm512_cvtepi32_ps(q1);
                f2 = _mm512_cvtepi32_ps(q2);
                f3 = _mm512_cvtepi32_ps(q3);
            }
            opaque!(a0, a1, a2, a3, f0, f1, f2, f3);
        }
        let s = _mm512_add_ps(_mm512_add_ps(f0, f1), _mm512_add_ps(f2, f3));
        let a = _mm512_add_epi32(_mm512_add_epi32(a0, a1), _mm512_add_epi32(a2, a3));
        _mm512_reduce_add_ps(_mm512_add_ps(s, _mm512_cvtepi32_ps(a)))
    }

    /// One weight block of the eight-token narrow tile against one row, `iters` times
    /// (the activation registers stay loaded): the sign flip, `PERMUTE` (one `vpermd`
    /// per register, or the block's bytes as they are), four `vpdpbusd` from the lane
    /// corrections, four conversions (`CONVERT`, or the raw integers reinterpreted) and
    /// four FMAs, after the block's one `d_w·d_x` multiply.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub unsafe fn narrow_block<const PERMUTE: bool, const CONVERT: bool>(iters: u64) -> f32 {
        let mut acc = [_mm512_setzero_ps(); 4];
        let (mut xq0, mut xq1, mut xq2, mut xq3) = (
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(2),
            _mm512_set1_epi32(3),
            _mm512_set1_epi32(4),
        );
        let (mut xc0, mut xc1, mut xc2, mut xc3) = (xq0, xq1, xq2, xq3);
        let (mut i0, mut i1, mut i2, mut i3) = (
            _mm512_set1_epi32(0),
            _mm512_set1_epi32(2),
            _mm512_set1_epi32(4),
            _mm512_set1_epi32(6),
        );
        let (mut dx, mut dw) = (_mm512_set1_ps(1e-6), _mm512_set1_ps(0.5));
        let mut w = _mm512_set1_epi32(0x1122_3344);
        opaque!(xq0, xq1, xq2, xq3, xc0, xc1, xc2, xc3, i0, i1, i2, i3, dx);
        let flip = _mm512_set1_epi8(0x80u8 as i8);
        for _ in 0..iters {
            opaque!(w, dw);
            let d = _mm512_mul_ps(dw, dx);
            let wu = _mm512_xor_si512(w, flip);
            let lanes = match PERMUTE {
                true => [
                    _mm512_permutexvar_epi32(i0, wu),
                    _mm512_permutexvar_epi32(i1, wu),
                    _mm512_permutexvar_epi32(i2, wu),
                    _mm512_permutexvar_epi32(i3, wu),
                ],
                false => [wu; 4],
            };
            let xq = [xq0, xq1, xq2, xq3];
            let xc = [xc0, xc1, xc2, xc3];
            for k in 0..4 {
                let lane = _mm512_dpbusd_epi32(xc[k], lanes[k], xq[k]);
                let f = match CONVERT {
                    true => _mm512_cvtepi32_ps(lane),
                    false => _mm512_castsi512_ps(lane),
                };
                acc[k] = _mm512_fmadd_ps(d, f, acc[k]);
            }
            let [mut a0, mut a1, mut a2, mut a3] = acc;
            opaque!(a0, a1, a2, a3);
            acc = [a0, a1, a2, a3];
        }
        let s = _mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3]));
        _mm512_reduce_add_ps(s)
    }

    /// One block of the LM head's sixteen-token bound pass (`nx_lazy_weight::bounded`'s
    /// `row_sums` on 512-bit registers) against its four rows, `iters` times, as the pass
    /// compiles it: per row the start term broadcast from a general register into two
    /// chains, eight `vpdpbusd` with the row's quads as 32-bit broadcasts from memory
    /// (L1 here), the chains joined, the f16 scale broadcast and widened, then a
    /// conversion, the `d_w·d_x` multiply and the FMA.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub unsafe fn bound_block(iters: u64) -> f32 {
        // Four rows' blocks: the f16 scale, then the 32 quants (a Q8_0 block).
        let mut blocks = [[0u8; 34]; 4];
        for (k, b) in blocks.iter_mut().enumerate() {
            b[..2].copy_from_slice(&(0x2c00u16 + k as u16).to_le_bytes());
            for (i, q) in b[2..].iter_mut().enumerate() {
                *q = (i * 7 + k) as u8;
            }
        }
        let terms = [-640i16, 320, -128, 64];
        let mut x = [_mm512_set1_epi32(0x0102_0304); 8];
        let [mut x0, mut x1, mut x2, mut x3, mut x4, mut x5, mut x6, mut x7] = x;
        opaque!(x0, x1, x2, x3, x4, x5, x6, x7);
        x = [x0, x1, x2, x3, x4, x5, x6, x7];
        let mut dx = _mm512_set1_ps(1e-3);
        opaque!(dx);
        let mut approx = [_mm512_setzero_ps(); 4];
        let mut p = blocks.as_ptr() as *const u8;
        let mut t = terms.as_ptr();
        for _ in 0..iters {
            // The rows' bytes count as new each time (as the pass reads a new block).
            opaque!(ptr: p, t);
            // SAFETY: `p` points at the four 34-byte blocks, `t` at the four terms.
            unsafe {
                let mut acc = [[_mm512_setzero_si512(); 2]; 4];
                for (k, acc) in acc.iter_mut().enumerate() {
                    let half = _mm512_set1_epi32(-64 * i32::from(t.add(k).read()));
                    *acc = [half, half];
                }
                for (j, &xu) in x.iter().enumerate() {
                    for (k, acc) in acc.iter_mut().enumerate() {
                        let q = (p.add(34 * k + 2 + 4 * j) as *const i32).read_unaligned();
                        acc[j % 2] = _mm512_dpbusd_epi32(acc[j % 2], xu, _mm512_set1_epi32(q));
                    }
                }
                for k in 0..4 {
                    let bits = (p.add(34 * k) as *const i16).read_unaligned();
                    let d = _mm512_mul_ps(_mm512_cvtph_ps(_mm256_set1_epi16(bits)), dx);
                    let sum = _mm512_add_epi32(acc[k][0], acc[k][1]);
                    approx[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), d, approx[k]);
                }
            }
            let [mut a0, mut a1, mut a2, mut a3] = approx;
            opaque!(a0, a1, a2, a3);
            approx = [a0, a1, a2, a3];
        }
        let s = _mm512_add_ps(
            _mm512_add_ps(approx[0], approx[1]),
            _mm512_add_ps(approx[2], approx[3]),
        );
        _mm512_reduce_add_ps(s)
    }

    /// One block of the LM head's row-lane bound pass at eight tokens
    /// (`nx_lazy_weight::bounded`'s `lane_row_sums`) against sixteen rows, `iters` times,
    /// from L1: the sixteen rows' 32 quant bytes transposed in registers (eight inserts,
    /// sixteen unpacks, eight 128-bit shuffles) and flipped, one scale register widened
    /// from f16, then per token a start broadcast, eight `vpdpbusd` with the token's quads
    /// as 32-bit broadcasts from memory, the multiply by its `d_x`, a conversion and the
    /// FMA.
    ///
    /// # Safety
    /// The CPU has AVX-512 F/BW/VNNI and F16C.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
    pub unsafe fn lane_block(iters: u64) -> f32 {
        // Sixteen rows of one 32-byte quant block each, 34 bytes apart as in Q8_0 rows;
        // the tokens' fields: eight registers of quads, the scales, the starts.
        let mut rows = [0u8; 16 * 34 + 32];
        for (i, b) in rows.iter_mut().enumerate() {
            *b = (i * 13) as u8;
        }
        let mut fields = [0i32; 10 * 8];
        for (i, f) in fields.iter_mut().enumerate() {
            *f = (i as i32).wrapping_mul(0x0103_0507);
        }
        let scales = [0x2c00u16; 16];
        let mut approx = [_mm512_setzero_ps(); 8];
        let (mut p, mut xb, mut sp) = (rows.as_ptr(), fields.as_ptr(), scales.as_ptr());
        let flip = _mm512_set1_epi8(-128);
        for _ in 0..iters {
            opaque!(ptr: p, xb, sp);
            // SAFETY: inside `rows`, `fields` and `scales`.
            unsafe {
                let row = |k: usize| _mm256_loadu_si256(p.add(2 + 34 * k) as *const __m256i);
                // Register `i` holds rows `HALVES[i]` in its halves, then a 4×4 transpose
                // of dwords per 128-bit lane, then 128-bit shuffles across registers.
                const HALVES: [(usize, usize); 8] = [
                    (0, 4),
                    (1, 5),
                    (2, 6),
                    (3, 7),
                    (8, 12),
                    (9, 13),
                    (10, 14),
                    (11, 15),
                ];
                let a = HALVES.map(|(lo, hi)| {
                    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(row(lo)), row(hi))
                });
                let mut u = [_mm512_setzero_si512(); 8];
                for h in [0, 4] {
                    let pairs = [
                        _mm512_unpacklo_epi32(a[h], a[h + 1]),
                        _mm512_unpackhi_epi32(a[h], a[h + 1]),
                        _mm512_unpacklo_epi32(a[h + 2], a[h + 3]),
                        _mm512_unpackhi_epi32(a[h + 2], a[h + 3]),
                    ];
                    for k in 0..2 {
                        u[h + 2 * k] = _mm512_unpacklo_epi64(pairs[k], pairs[k + 2]);
                        u[h + 2 * k + 1] = _mm512_unpackhi_epi64(pairs[k], pairs[k + 2]);
                    }
                }
                let quads = std::array::from_fn::<_, 8, _>(|j| match j < 4 {
                    true => _mm512_shuffle_i64x2::<0x88>(u[j], u[j + 4]),
                    false => _mm512_shuffle_i64x2::<0xdd>(u[j - 4], u[j]),
                })
                .map(|q| _mm512_xor_si512(q, flip));
                let d_w = _mm512_cvtph_ps(_mm256_loadu_si256(sp as *const __m256i));
                for (t, approx) in approx.iter_mut().enumerate() {
                    let lane = |field: usize| xb.add(8 * field + t).read();
                    let mut acc = _mm512_set1_epi32(lane(9));
                    for (j, &q) in quads.iter().enumerate() {
                        acc = _mm512_dpbusd_epi32(acc, q, _mm512_set1_epi32(lane(j)));
                    }
                    let dx = _mm512_set1_ps(f32::from_bits(lane(8) as u32));
                    let s = _mm512_mul_ps(d_w, dx);
                    *approx = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, *approx);
                }
            }
            let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5, mut a6, mut a7] = approx;
            opaque!(a0, a1, a2, a3, a4, a5, a6, a7);
            approx = [a0, a1, a2, a3, a4, a5, a6, a7];
        }
        let s = approx
            .iter()
            .fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a));
        _mm512_reduce_add_ps(s)
    }

    /// One weight block of the AVX2 token groups (`nx_lazy_weight::groups_avx2`) against
    /// eight tokens, `iters` times: per token its activations loaded (from L1, as the
    /// kernel reads them), two `madd`s and an add for the lane integers, a conversion and
    /// the FMA, with the token's `d_w·d_x` a broadcast load from a table (`TABLE`) or a
    /// scalar multiply and a register broadcast.
    ///
    /// # Safety
    /// The CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn group_block<const TABLE: bool>(iters: u64) -> f32 {
        let mut acc = [_mm256_setzero_ps(); 8];
        let (mut w_lo, mut w_hi) = (_mm256_set1_epi16(3), _mm256_set1_epi16(-5));
        let acts: [[i16; 32]; 8] =
            std::array::from_fn(|t| std::array::from_fn(|k| (t * 32 + k) as i16 - 100));
        let acts = std::hint::black_box(&acts);
        let table = std::hint::black_box([1e-6f32, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6, 7e-6, 8e-6]);
        let mut dw = _mm256_set1_ps(0.5);
        for _ in 0..iters {
            opaque!(ymm_reg: w_lo, w_hi, dw);
            for (t, acc) in acc.iter_mut().enumerate() {
                // SAFETY: 32 i16 of token t.
                let (x_lo, x_hi) = unsafe {
                    let p = acts[t].as_ptr();
                    (
                        _mm256_loadu_si256(p as *const __m256i),
                        _mm256_loadu_si256(p.add(16) as *const __m256i),
                    )
                };
                let lanes =
                    _mm256_add_epi32(_mm256_madd_epi16(w_lo, x_lo), _mm256_madd_epi16(w_hi, x_hi));
                let d = match TABLE {
                    true => _mm256_broadcast_ss(&table[t]),
                    false => _mm256_mul_ps(dw, _mm256_set1_ps(table[t])),
                };
                *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(lanes), *acc);
            }
            let [mut a0, mut a1, mut a2, mut a3, mut a4, mut a5, mut a6, mut a7] = acc;
            opaque!(ymm_reg: a0, a1, a2, a3, a4, a5, a6, a7);
            acc = [a0, a1, a2, a3, a4, a5, a6, a7];
        }
        let s = _mm256_add_ps(
            _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])),
            _mm256_add_ps(_mm256_add_ps(acc[4], acc[5]), _mm256_add_ps(acc[6], acc[7])),
        );
        let mut out = [0f32; 8];
        _mm256_storeu_ps(out.as_mut_ptr(), s);
        out.iter().sum()
    }
}

fn bench_pipes(c: &mut Criterion) {
    #[cfg(target_arch = "x86_64")]
    {
        let has = |f: &str| match f {
            "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
            "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
            _ => std::arch::is_x86_feature_detected!("avx512vnni"),
        };
        if !["avx512f", "avx512bw", "avx512vnni"].iter().all(|f| has(f)) {
            eprintln!("pipes: this CPU has no AVX-512 VNNI; skipped");
            return;
        }
        type Case = (&'static str, u64, fn(u64) -> f32);
        // SAFETY (every case): the features were detected above.
        let cases: [Case; 24] = [
            ("fma8", 8, |n| unsafe { x86::fma8(n) }),
            ("dpbusd8", 8, |n| unsafe { x86::dpbusd8(n) }),
            ("dpbusd8_broadcast", 8, |n| unsafe {
                x86::dpbusd8_broadcast(n)
            }),
            ("bound_block", 4, |n| unsafe { x86::bound_block(n) }),
            ("lane_block", 16, |n| unsafe { x86::lane_block(n) }),
            ("cvt8", 8, |n| unsafe { x86::unary8::<false>(n) }),
            ("vpermd8", 8, |n| unsafe { x86::unary8::<true>(n) }),
            ("vpaddd8", 16, |n| unsafe { x86::vpaddd8(n) }),
            ("dpbusd4_fma4", 8, |n| unsafe {
                x86::dpbusd4_and4::<true>(n)
            }),
            ("dpbusd4_cvt4", 8, |n| unsafe {
                x86::dpbusd4_and4::<false>(n)
            }),
            ("dpwssd8", 8, |n| unsafe { x86::dpwssd8(n) }),
            ("maddubs8", 8, |n| unsafe { x86::maddubs8(n) }),
            ("madd8", 8, |n| unsafe { x86::madd8(n) }),
            ("dpbusd4_shift4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::SHIFT }>(n)
            }),
            ("dpbusd4_blend4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::BLEND }>(n)
            }),
            ("dpbusd4_maddubs4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::MADDUBS }>(n)
            }),
            ("dpbusd4_byte_shift4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::BYTE_SHIFT }>(n)
            }),
            ("dpbusd4_shld4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::SHLD }>(n)
            }),
            ("dpbusd4_dpwssd4", 8, |n| unsafe {
                x86::dpbusd4_with4::<{ x86::DPWSSD }>(n)
            }),
            ("narrow_block", 18, |n| unsafe {
                x86::narrow_block::<true, true>(n)
            }),
            ("narrow_block_no_permute", 14, |n| unsafe {
                x86::narrow_block::<false, true>(n)
            }),
            ("narrow_block_no_convert", 10, |n| unsafe {
                x86::narrow_block::<false, false>(n)
            }),
            // Per token: two madds, an add, a conversion, an FMA (and a multiply).
            ("avx2_group_block", 40, |n| unsafe {
                x86::group_block::<true>(n)
            }),
            ("avx2_group_block_multiply", 48, |n| unsafe {
                x86::group_block::<false>(n)
            }),
        ];
        let mut group = c.benchmark_group("pipes");
        for (name, ops, run) in cases {
            group.throughput(Throughput::Elements(ITERS * ops));
            group.bench_function(name, |b| b.iter(|| std::hint::black_box(run(ITERS))));
        }
        group.finish();
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (c, ITERS);
        eprintln!("pipes: x86-64 only; skipped");
    }
}

criterion_group!(benches, bench_pipes);
criterion_main!(benches);
