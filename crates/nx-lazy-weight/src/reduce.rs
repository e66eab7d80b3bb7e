//! The float reduction orders of the reference engine's x86 dot kernels, shared by every
//! scalar kernel that reproduces one.

/// Eight f32 lanes, each fed once per block by a fused multiply-add of the block scale
/// with that lane's exact integer sum, then added pairwise as
/// `((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7))` (ggml's `hsum_float_8`). Reproducing it (rather
/// than any other order) makes our matmuls bit-identical to llama.cpp's on x86 for
/// identical inputs; the order depends on K alone, so batch and thread invariance hold.
#[derive(Default, Clone, Copy)]
pub(crate) struct Lanes8 {
    pub(crate) acc: [f32; 8],
}

impl Lanes8 {
    /// `acc[l] = fma(d, ints[l], acc[l])` for every lane.
    #[inline(always)]
    pub(crate) fn fma_block(&mut self, d: f32, ints: &[i32; 8]) {
        for l in 0..8 {
            self.acc[l] = d.mul_add(ints[l] as f32, self.acc[l]);
        }
    }

    /// Lane-wise sum of two accumulators (kernels that keep one per block parity).
    #[inline(always)]
    pub(crate) fn plus(&self, other: &Lanes8) -> Lanes8 {
        let mut acc = [0.0f32; 8];
        for l in 0..8 {
            acc[l] = self.acc[l] + other.acc[l];
        }
        Lanes8 { acc }
    }

    /// ggml's `hsum_float_8`.
    #[inline(always)]
    pub(crate) fn sum(&self) -> f32 {
        let a = &self.acc;
        ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
    }
}

/// Lane sums of a 32-quant block: lane `l` holds `Σ w[k]·x[k]` for `k` in `4l..4l+4`
/// (what `maddubs` then `madd` by ones, or `dpbusd`, leave in each 32-bit lane).
#[inline(always)]
pub(crate) fn quad_lanes(wq: &[i32; 32], xq: &[u8]) -> [i32; 8] {
    // A fixed-size view: no bounds check per element, so the loop vectorizes.
    let xq: &[u8; 32] = xq[..32].try_into().expect("32 quants");
    let mut lanes = [0i32; 8];
    for (l, lane) in lanes.iter_mut().enumerate() {
        for k in 4 * l..4 * l + 4 {
            *lane += wq[k] * xq[k] as i8 as i32;
        }
    }
    lanes
}

/// The blocks every row has: the weight row's `w_blocks`, or fewer when an activation
/// row (blocks of `x_block_bytes`) is shorter (as a zip of the rows' blocks stops).
#[inline(always)]
pub(crate) fn common_blocks<const N: usize>(
    w_blocks: usize,
    x_block_bytes: usize,
    xs: &[&[u8]; N],
) -> usize {
    xs.iter()
        .fold(w_blocks, |n, x| n.min(x.len() / x_block_bytes))
}

/// Block `b` (of `block_bytes` bytes) of each of the `N` activation rows.
#[inline(always)]
pub(crate) fn blocks_at<'a, const N: usize>(
    xs: &[&'a [u8]; N],
    b: usize,
    block_bytes: usize,
) -> [&'a [u8]; N] {
    xs.map(|x| &x[b * block_bytes..][..block_bytes])
}

/// K-format lane sums: lane `l` collects, for every 32-quant group `g` of the
/// super-block, `scale(g, l)·Σ w[32g+k]·x[32g+k]` over `k` in `4l..4l+4`, where
/// `scale(g, l)` is the scale of the sub-block holding those quants (sub-blocks of
/// `sub_len` = 32 or 16 quants): what ggml's AVX2 K-format kernels leave in each lane
/// after `maddubs` and `madd` by the (shuffled) scales.
#[inline(always)]
pub(crate) fn k_quad_lanes(wq: &[i8; 256], xq: &[u8], scales: &[i32], sub_len: usize) -> [i32; 8] {
    // A fixed-size view: no bounds check per element, so the loops vectorize.
    let xq: &[u8; 256] = xq[..256].try_into().expect("256 quants");
    let mut lanes = [0i32; 8];
    for g in 0..256 / 32 {
        for (l, lane) in lanes.iter_mut().enumerate() {
            let first = 32 * g + 4 * l;
            let scale = scales[first / sub_len];
            let mut quad = 0i32;
            for k in first..first + 4 {
                quad += wq[k] as i32 * xq[k] as i8 as i32;
            }
            *lane += scale * quad;
        }
    }
    lanes
}

/// Lanes of the ternary formats (TQ1_0, TQ2_0) against Q8_K, as ggml's AVX2 kernels form
/// them: sixteen 16-bit lanes, lane `p` summing `w[e]·x[e]` over the elements `e` with
/// `e mod 32` in `{2p, 2p+1}` (unsigned levels, so `maddubs` never saturates), minus
/// `bsums[p]` (the levels are stored `+1`, so `Σ(w−1)·x = Σw·x − Σx`), all modulo 2^16
/// as `add_epi16`/`sub_epi16` compute it; then pairs of them widened and added into
/// eight 32-bit lanes (`madd` by ones).
#[inline(always)]
pub(crate) fn offset_pair_lanes(wq: &[u8; 256], xq: &[u8], bsums: &[u8]) -> [i32; 8] {
    let mut s16 = [0i16; 16];
    for (e, (&w, &x)) in wq.iter().zip(xq).enumerate() {
        let p = (e % 32) / 2;
        s16[p] = s16[p].wrapping_add((w as i16) * (x as i8 as i16));
    }
    let mut lanes = [0i32; 8];
    for (p, s) in s16.iter_mut().enumerate() {
        let bsum = i16::from_le_bytes([bsums[2 * p], bsums[2 * p + 1]]);
        *s = s.wrapping_sub(bsum);
        lanes[p / 2] += *s as i32;
    }
    lanes
}
