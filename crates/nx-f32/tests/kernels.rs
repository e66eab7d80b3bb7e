//! Kernel tests: each nx-f32 kernel against a straightforward f64 reference, plus the
//! properties the forward pass relies on (softmax sums to one, RoPE preserves norms and
//! is the identity at position 0, attention is independent of how many rows follow).

use nx_f32::*;
use proptest::prelude::*;

/// Deterministic pseudo-random values in [-1, 1) (SplitMix64), so tests need no RNG crate.
fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ((z >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn assert_close(got: f32, want: f64, tol: f64, what: &str) {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= tol * want.abs().max(1.0),
        "{what}: got {got}, want {want}, err {err}"
    );
}

fn norm64(x: &[f32]) -> f64 {
    x.iter()
        .map(|&v| f64::from(v) * f64::from(v))
        .sum::<f64>()
        .sqrt()
}

// ---------------------------------------------------------------- vector basics

#[test]
fn dot_matches_f64_reference_for_many_lengths() {
    for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 64, 100, 255, 256, 1000] {
        let a = values(n as u64, n);
        let b = values(1000 + n as u64, n);
        let want: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        assert_close(dot(&a, &b), want, 1e-5, &format!("dot n={n}"));
    }
}

#[test]
fn dot_f16_equals_dot_on_the_widened_row() {
    for n in [1usize, 8, 13, 64, 256] {
        let a = values(3, n);
        let b16: Vec<f16> = values(4, n).iter().map(|&v| f16::from_f32(v)).collect();
        let b32: Vec<f32> = b16.iter().map(|v| v.to_f32()).collect();
        assert_eq!(
            dot_f16(&a, &b16).to_bits(),
            dot(&a, &b32).to_bits(),
            "n={n}"
        );
    }
}

#[test]
fn axpy_scale_add_mul_match_reference() {
    let x = values(10, 37);
    let y0 = values(11, 37);
    let mut y = y0.clone();
    axpy(&mut y, 0.375, &x);
    for i in 0..37 {
        assert_close(
            y[i],
            f64::from(y0[i]) + 0.375 * f64::from(x[i]),
            1e-6,
            "axpy",
        );
    }
    let mut s = x.clone();
    scale(&mut s, -2.5);
    for i in 0..37 {
        assert_eq!(s[i], x[i] * -2.5);
    }
    let mut a = y0.clone();
    add_in_place(&mut a, &x);
    for i in 0..37 {
        assert_eq!(a[i], y0[i] + x[i]);
    }
    let mut m = y0.clone();
    mul_in_place(&mut m, &x);
    for i in 0..37 {
        assert_eq!(m[i], y0[i] * x[i]);
    }
}

// ---------------------------------------------------------------- rmsnorm

fn rmsnorm_ref(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / x.len() as f64;
    let s = 1.0 / (ms + eps).sqrt();
    x.iter()
        .zip(w)
        .map(|(&v, &wi)| f64::from(v) * s * f64::from(wi))
        .collect()
}

#[test]
fn rmsnorm_matches_f64_reference() {
    for dim in [1usize, 5, 64, 640, 1024] {
        let x: Vec<f32> = values(20 + dim as u64, dim)
            .iter()
            .map(|v| v * 30.0)
            .collect();
        let w = values(21, dim);
        let mut out = vec![0.0; dim];
        rmsnorm(&mut out, &x, &w, 1e-6);
        let want = rmsnorm_ref(&x, &w, 1e-6);
        for i in 0..dim {
            assert_close(out[i], want[i], 2e-6, &format!("rmsnorm dim={dim} i={i}"));
        }
        let mut inplace = x.clone();
        rmsnorm_in_place(&mut inplace, &w, 1e-6);
        assert_eq!(inplace, out, "in-place differs from out-of-place");
    }
}

#[test]
fn rmsnorm_eps_dominates_a_zero_row() {
    let x = vec![0.0f32; 8];
    let w = vec![1.0f32; 8];
    let mut out = vec![1.0; 8];
    rmsnorm(&mut out, &x, &w, 1e-5);
    assert!(out.iter().all(|&v| v == 0.0));
}

#[test]
fn rmsnorm_rows_equals_row_by_row() {
    // Row counts below, at and past the rows summed side by side (groups of eight, two
    // groups at once), rows of whole and partial blocks of eight columns, and values
    // spread over many binades so that a different order of the f64 sums would show.
    for (dim, n) in [44, 48]
        .into_iter()
        .flat_map(|d| [1, 5, 8, 9, 16, 17, 24, 33, 40].map(|n| (d, n)))
    {
        let x: Vec<f32> = values(30 + n as u64, n * dim)
            .iter()
            .enumerate()
            .map(|(i, v)| v * 2f32.powi((i % 37) as i32 - 18))
            .collect();
        let w = values(31, dim);
        let mut out = vec![0.0; n * dim];
        rmsnorm_rows(&mut out, &x, &w, dim, 1e-5);
        for r in 0..n {
            let mut row = vec![0.0; dim];
            rmsnorm(&mut row, &x[r * dim..(r + 1) * dim], &w, 1e-5);
            assert_eq!(
                &out[r * dim..(r + 1) * dim],
                &row[..],
                "n {n} dim {dim} row {r}"
            );
        }
        let mut inplace = x.clone();
        rmsnorm_rows_in_place(&mut inplace, &w, dim, 1e-5);
        assert_eq!(inplace, out, "n {n} dim {dim}");
    }
}

#[test]
fn rmsnorm_rows_sum_squares_in_index_order() {
    // A row whose f64 sum of squares lands on an f32 tie in index order but past it when
    // the small squares come first: 2^24 + 1, then sixteen 2^-30 that each fall below half
    // an f64 ulp of it. Any other order of the sums (or a sum in f32) moves the scale.
    let dim = 32;
    let mut crafted = vec![0f32; dim];
    crafted[0] = 4096.0;
    crafted[1] = 1.0;
    for v in &mut crafted[2..18] {
        *v = 2f32.powi(-15);
    }
    let reversed: f64 = crafted.iter().rev().map(|&v| f64::from(v * v)).sum();
    let in_order = crafted.iter().fold(0f64, |s, &v| s + f64::from(v * v));
    assert_ne!(
        (reversed / dim as f64) as f32,
        (in_order / dim as f64) as f32,
        "the crafted row must tell the orders apart"
    );
    let w = vec![1f32; dim];
    for n in [1, 8, 11, 16, 21, 32] {
        for at in [0, n / 2, n - 1] {
            let mut x = values(40 + n as u64, n * dim);
            x[at * dim..(at + 1) * dim].copy_from_slice(&crafted);
            let mut want = vec![0f32; dim];
            rmsnorm(&mut want, &crafted, &w, 0.0);
            let mut out = vec![0f32; n * dim];
            rmsnorm_rows(&mut out, &x, &w, dim, 0.0);
            assert_eq!(&out[at * dim..(at + 1) * dim], &want[..], "n {n} row {at}");
            rmsnorm_rows_in_place(&mut x, &w, dim, 0.0);
            assert_eq!(
                &x[at * dim..(at + 1) * dim],
                &want[..],
                "in place, n {n} row {at}"
            );
        }
    }
}

// ---------------------------------------------------------------- softmax, activations

#[test]
fn softmax_matches_reference_and_sums_to_one() {
    let x: Vec<f32> = values(40, 300).iter().map(|v| v * 20.0).collect();
    let mut p = x.clone();
    softmax_in_place(&mut p);
    let max = x
        .iter()
        .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let z: f64 = x.iter().map(|&v| (f64::from(v) - max).exp()).sum();
    for i in 0..x.len() {
        let want = (f64::from(x[i]) - max).exp() / z;
        assert!((f64::from(p[i]) - want).abs() < 1e-6, "softmax[{i}]");
    }
    let total: f64 = p.iter().map(|&v| f64::from(v)).sum();
    assert!((total - 1.0).abs() < 1e-5, "sum {total}");
}

#[test]
fn softmax_is_shift_invariant_and_handles_extremes() {
    let x = vec![1000.0f32, 999.0, 998.0];
    let mut p = x.clone();
    softmax_in_place(&mut p);
    let mut q = vec![2.0f32, 1.0, 0.0];
    softmax_in_place(&mut q);
    assert_eq!(p, q);

    let mut all_masked = vec![f32::NEG_INFINITY; 4];
    softmax_in_place(&mut all_masked);
    assert_eq!(all_masked, vec![0.0; 4]);

    let mut partly = vec![0.0f32, f32::NEG_INFINITY];
    softmax_in_place(&mut partly);
    assert_eq!(partly, vec![1.0, 0.0]);

    let mut empty: Vec<f32> = vec![];
    softmax_in_place(&mut empty);
}

#[test]
fn silu_and_gelu_match_f64_formulas() {
    for &x in &[
        -20.0f32, -5.0, -1.0, -0.1, 0.0, 0.1, 0.5, 1.0, 3.0, 9.9, 20.0,
    ] {
        let xd = f64::from(x);
        assert_close(silu(x), xd / (1.0 + (-xd).exp()), 1e-6, "silu");
        let g = 0.5
            * xd
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
        assert_close(gelu_tanh(x), g, 1e-6, "gelu_tanh");
    }
}

#[test]
fn swiglu_and_geglu_are_elementwise_products() {
    let gate = values(50, 33);
    let up = values(51, 33);
    let mut out = vec![0.0; 33];
    swiglu(&mut out, &gate, &up);
    for i in 0..33 {
        assert_eq!(out[i], silu(gate[i]) * up[i]);
    }
    geglu(&mut out, &gate, &up);
    for i in 0..33 {
        assert_eq!(out[i], gelu_tanh(gate[i]) * up[i]);
    }
    let mut a = gate.clone();
    silu_in_place(&mut a);
    let mut b = gate.clone();
    gelu_tanh_in_place(&mut b);
    for i in 0..33 {
        assert_eq!(a[i], silu(gate[i]));
        assert_eq!(b[i], gelu_tanh(gate[i]));
    }
}

#[test]
fn gelu_table_follows_ggml_rules() {
    let table = GeluTable::new();
    assert_eq!(table.gelu(-10.0), 0.0);
    assert_eq!(table.gelu(-50.0), 0.0);
    assert_eq!(table.gelu(10.0), 10.0);
    assert_eq!(table.gelu(12.5), 12.5);
    for &x in &values(60, 1000) {
        let x = x * 9.0;
        // Independent statement of the rule: round the input to f16, evaluate, round.
        let xr = f64::from(f16::from_f32(x).to_f32());
        let g = 0.5
            * xr
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (xr + 0.044715 * xr.powi(3))).tanh());
        let want = f64::from(f16::from_f64(g).to_f32());
        let got = f64::from(table.gelu(x));
        // The f32 formula may land one f16 step away from the f64 one, and for x < -4
        // its `1 + tanh(..)` cancels, leaving an absolute error of a few f32 ulps of x.
        assert!(
            (got - want).abs() <= want.abs() * 1e-3 + 1e-6,
            "x={x} got {got} want {want}"
        );
        // And the table differs from the exact formula by f16 precision at most.
        assert!(
            (got - f64::from(gelu_tanh(x))).abs() <= f64::from(gelu_tanh(x)).abs() * 2e-3 + 2e-3
        );
    }
    let gate = [-11.0f32, -1.0, 0.5, 11.0];
    let up = [f32::NAN, 2.0, 3.0, 4.0];
    let mut out = [0.0f32; 4];
    table.geglu(&mut out, &gate, &up);
    assert_eq!(out[0], 0.0, "below -10 ggml writes a plain zero");
    assert_eq!(out[1], table.gelu(-1.0) * 2.0);
    assert_eq!(out[3], 44.0);
    assert!(std::ptr::eq(GeluTable::shared(), GeluTable::shared()));
}

// ---------------------------------------------------------------- RoPE

fn rope_ref(
    x: &[f32],
    pos: usize,
    base: f64,
    rope_dim: usize,
    neox: bool,
    ff: Option<&[f32]>,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    let half = rope_dim / 2;
    for i in 0..half {
        let mut theta = pos as f64 * base.powf(-2.0 * i as f64 / rope_dim as f64);
        if let Some(ff) = ff {
            theta /= f64::from(ff[i]);
        }
        let (a, b) = if neox {
            (i, i + half)
        } else {
            (2 * i, 2 * i + 1)
        };
        let (x0, x1) = (f64::from(x[a]), f64::from(x[b]));
        out[a] = x0 * theta.cos() - x1 * theta.sin();
        out[b] = x0 * theta.sin() + x1 * theta.cos();
    }
    out
}

#[test]
fn rope_matches_f64_reference() {
    let head_dim = 64;
    for &pos in &[0usize, 1, 7, 100, 1000] {
        for &base in &[10_000.0f32, 1_000_000.0] {
            let x = values(70 + pos as u64, head_dim);
            let mut normal = x.clone();
            rope_normal(&mut normal, pos, base, head_dim, None);
            let mut neox = x.clone();
            rope_neox(&mut neox, pos, base, head_dim, None);
            let want_n = rope_ref(&x, pos, f64::from(base), head_dim, false, None);
            let want_x = rope_ref(&x, pos, f64::from(base), head_dim, true, None);
            // f32 angles of size ~pos carry absolute error ~pos·2^-24 (and grow a little
            // through the repeated multiplication), so the tolerance scales with pos.
            let tol = 1e-5 + pos as f64 * 4e-7;
            for i in 0..head_dim {
                assert!(
                    (f64::from(normal[i]) - want_n[i]).abs() < tol,
                    "normal pos={pos} i={i}"
                );
                assert!(
                    (f64::from(neox[i]) - want_x[i]).abs() < tol,
                    "neox pos={pos} i={i}"
                );
            }
        }
    }
}

#[test]
fn rope_at_position_zero_is_identity() {
    let x = values(80, 128);
    let mut a = x.clone();
    rope_normal(&mut a, 0, 10_000.0, 128, None);
    assert_eq!(a, x);
    let mut b = x.clone();
    rope_neox(&mut b, 0, 10_000.0, 128, None);
    assert_eq!(b, x);
}

#[test]
fn rope_partial_dims_leave_the_tail_alone() {
    let x = values(81, 96);
    let mut a = x.clone();
    rope_normal(&mut a, 17, 10_000.0, 32, None);
    assert_eq!(&a[32..], &x[32..]);
    assert_ne!(&a[..32], &x[..32]);
    let want = rope_ref(&x, 17, 10_000.0, 32, false, None);
    for i in 0..32 {
        assert!((f64::from(a[i]) - want[i]).abs() < 1e-5);
    }
    let mut b = x.clone();
    rope_neox(&mut b, 17, 10_000.0, 32, None);
    assert_eq!(&b[32..], &x[32..]);
    let want = rope_ref(&x, 17, 10_000.0, 32, true, None);
    for i in 0..32 {
        assert!(
            (f64::from(b[i]) - want[i]).abs() < 1e-5,
            "neox partial i={i}"
        );
    }
}

#[test]
fn rope_neox_is_normal_on_interleaved_layout() {
    // NeoX pairs (i, i+half) are normal pairs (2i, 2i+1) after interleaving; the same
    // f32 operations run on the same values, so the results agree bit for bit.
    let head_dim = 32;
    let half = head_dim / 2;
    let x = values(82, head_dim);
    let mut inter = vec![0.0; head_dim];
    for i in 0..half {
        inter[2 * i] = x[i];
        inter[2 * i + 1] = x[i + half];
    }
    let mut neox = x.clone();
    rope_neox(&mut neox, 123, 10_000.0, head_dim, None);
    rope_normal(&mut inter, 123, 10_000.0, head_dim, None);
    for i in 0..half {
        assert_eq!(neox[i], inter[2 * i]);
        assert_eq!(neox[i + half], inter[2 * i + 1]);
    }
}

#[test]
fn rope_freq_factors_divide_the_angle() {
    let head_dim = 16;
    let x = values(83, head_dim);
    let ones = vec![1.0f32; head_dim / 2];
    let mut a = x.clone();
    let mut b = x.clone();
    rope_normal(&mut a, 50, 500_000.0, head_dim, None);
    rope_normal(&mut b, 50, 500_000.0, head_dim, Some(&ones));
    assert_eq!(a, b, "unit factors must change nothing");

    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + i as f32).collect();
    let mut c = x.clone();
    rope_normal(&mut c, 50, 500_000.0, head_dim, Some(&factors));
    let want = rope_ref(&x, 50, 500_000.0, head_dim, false, Some(&factors));
    for i in 0..head_dim {
        assert!((f64::from(c[i]) - want[i]).abs() < 5e-5, "i={i}");
    }
}

#[test]
fn rope_table_is_bit_identical_to_free_functions() {
    let head_dim = 64;
    let n_heads = 3;
    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + 0.25 * i as f32).collect();
    for ff in [None, Some(&factors[..])] {
        let mut table = RopeTable::new(head_dim, 10_000.0, ff).unwrap();
        for &pos in &[0usize, 5, 511, 4096] {
            table.set_position(pos);
            assert_eq!(table.position(), Some(pos));
            for style in [RopeStyle::Normal, RopeStyle::Neox] {
                let x = values(pos as u64 + 90, n_heads * head_dim);
                let mut via_table = x.clone();
                table.apply_heads(&mut via_table, head_dim, style);
                let mut via_fn = x.clone();
                for head in via_fn.chunks_exact_mut(head_dim) {
                    match style {
                        RopeStyle::Normal => rope_normal(head, pos, 10_000.0, head_dim, ff),
                        RopeStyle::Neox => rope_neox(head, pos, 10_000.0, head_dim, ff),
                    }
                }
                assert_eq!(via_table, via_fn, "pos={pos} style={style:?}");
            }
        }
    }
}

#[test]
fn rope_angles_at_and_rotate_heads_are_the_table_bit_for_bit() {
    // The batched path (one position's angles computed apart, then applied to a row's
    // heads) against the table's own, for plain, scaled, YaRN and factored tables.
    let head_dim = 64;
    let factors: Vec<f32> = (0..head_dim / 2).map(|i| 1.0 + 0.25 * i as f32).collect();
    let plain = RopeTable::new(head_dim, 10_000.0, None).unwrap();
    let tables = [
        plain.clone(),
        plain.clone().with_freq_scale(0.25).unwrap(),
        plain
            .clone()
            .with_freq_scale(0.25)
            .unwrap()
            .with_yarn(4096, 10_000.0, 32.0, 1.0)
            .unwrap(),
        RopeTable::new(head_dim, 500_000.0, Some(&factors))
            .unwrap()
            .with_attn_factor(1.5)
            .unwrap(),
    ];
    for (i, table) in tables.into_iter().enumerate() {
        let mut positioned = table.clone();
        let (mut cos, mut sin) = (vec![0f32; head_dim / 2], vec![0f32; head_dim / 2]);
        for &pos in &[0usize, 7, 511, 4096, 30_000] {
            positioned.set_position(pos);
            table.angles_at(pos, &mut cos, &mut sin);
            assert_eq!((positioned.cos(), positioned.sin()), (&cos[..], &sin[..]));
            for style in [RopeStyle::Normal, RopeStyle::Neox] {
                let x = values(pos as u64 + 7, 3 * head_dim);
                let (mut want, mut got) = (x.clone(), x);
                positioned.apply_heads(&mut want, head_dim, style);
                rotate_heads(&cos, &sin, &mut got, head_dim, style);
                assert_eq!(got, want, "table {i} pos={pos} style={style:?}");
            }
        }
    }
}

#[test]
fn rope_table_rejects_bad_configs() {
    assert_eq!(
        RopeTable::new(0, 10_000.0, None).unwrap_err(),
        RopeError::BadRopeDim(0)
    );
    assert_eq!(
        RopeTable::new(7, 10_000.0, None).unwrap_err(),
        RopeError::BadRopeDim(7)
    );
    assert!(matches!(
        RopeTable::new(8, f32::NAN, None),
        Err(RopeError::BadFreqBase(_))
    ));
    assert_eq!(
        RopeTable::new(8, 10_000.0, Some(&[1.0, 1.0])).unwrap_err(),
        RopeError::FreqFactorsTooShort { need: 4, got: 2 }
    );
    assert!(matches!(
        RopeTable::new(8, 10_000.0, None)
            .unwrap()
            .with_freq_scale(0.0),
        Err(RopeError::BadFreqScale(_))
    ));
}

#[test]
fn rope_linear_scaling_scales_the_angle() {
    // freq_scale 0.5 at position 2p gives the angles of position p (exact: the angle
    // recurrence starts from 2p, and halving is exact in binary floating point, but the
    // repeated products differ, so compare against the f64 reference instead).
    let head_dim = 32;
    let x = values(95, head_dim);
    let mut table = RopeTable::new(head_dim, 10_000.0, None)
        .unwrap()
        .with_freq_scale(0.5)
        .unwrap();
    table.set_position(200);
    let mut y = x.clone();
    table.apply(&mut y, RopeStyle::Normal);
    let want = rope_ref(&x, 100, 10_000.0, head_dim, false, None);
    for i in 0..head_dim {
        assert!((f64::from(y[i]) - want[i]).abs() < 1e-4, "i={i}");
    }
}

proptest! {
    // Miri runs each case thousands of times slower; a few still check every access.
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    #[test]
    fn rope_preserves_norm(seed in 0u64..10_000, pos in 0usize..100_000, neox in any::<bool>()) {
        let x = values(seed, 128);
        let mut y = x.clone();
        if neox {
            rope_neox(&mut y, pos, 1_000_000.0, 128, None);
        } else {
            rope_normal(&mut y, pos, 10_000.0, 128, None);
        }
        let (n0, n1) = (norm64(&x), norm64(&y));
        prop_assert!((n0 - n1).abs() <= 1e-5 * n0, "norm {} -> {}", n0, n1);
    }

    #[test]
    fn rope_composes_additively(seed in 0u64..1000, a in 0usize..200, b in 0usize..200) {
        let x = values(seed, 64);
        let mut ab = x.clone();
        rope_neox(&mut ab, a, 10_000.0, 64, None);
        rope_neox(&mut ab, b, 10_000.0, 64, None);
        let mut direct = x.clone();
        rope_neox(&mut direct, a + b, 10_000.0, 64, None);
        for i in 0..64 {
            prop_assert!((ab[i] - direct[i]).abs() < 1e-4, "i={} {} vs {}", i, ab[i], direct[i]);
        }
    }

    #[test]
    fn softmax_sums_to_one(seed in 0u64..10_000, n in 1usize..500, spread in 0.1f32..80.0) {
        let mut x: Vec<f32> = values(seed, n).iter().map(|v| v * spread).collect();
        softmax_in_place(&mut x);
        let total: f64 = x.iter().map(|&v| f64::from(v)).sum();
        prop_assert!((total - 1.0).abs() < 1e-5, "sum {}", total);
        prop_assert!(x.iter().all(|&v| (0.0..=1.0).contains(&v)));
    }

    #[test]
    fn dot_is_close_to_f64(seed in 0u64..10_000, n in 0usize..2000) {
        let a = values(seed, n);
        let b = values(seed ^ 0xABCD, n);
        let want: f64 = a.iter().zip(&b).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum();
        let abs_sum: f64 = a.iter().zip(&b).map(|(&x, &y)| (f64::from(x) * f64::from(y)).abs()).sum();
        // Standard bound for a floating-point sum: about n·eps·Σ|terms|.
        prop_assert!((f64::from(dot(&a, &b)) - want).abs() <= abs_sum * 1e-6 + 1e-7);
    }
}

// ---------------------------------------------------------------- conversions

/// Every f16 bit pattern (normals, subnormals, zeros, infinities, NaNs) widens to the
/// bits `f16::to_f32` gives, at a length with a tail after the sixteen-wide steps.
#[test]
fn f16_rows_widen_every_bit_pattern_exactly() {
    let all: Vec<f16> = (0..=u16::MAX)
        .map(f16::from_bits)
        .chain([f16::ONE; 7])
        .collect();
    let mut wide = vec![0.0f32; all.len()];
    f16_to_f32_row(&all, &mut wide);
    for (h, w) in all.iter().zip(&wide) {
        assert_eq!(
            w.to_bits(),
            h.to_f32().to_bits(),
            "f16 bits {:#06x}",
            h.to_bits()
        );
    }
}

/// f32 values of every exponent, with mantissas at and around the f16 rounding ties,
/// subnormal results, overflow to infinity, infinities and NaNs narrow to the bits
/// `f16::from_f32` gives, at a length with a tail after the eight-wide steps.
#[test]
fn f32_rows_narrow_to_f16_exactly() {
    let mantissas = [
        0u32, 1, 0xfff, 0x1000, 0x1001, 0x2000, 0x3000, 0x7f_e000, 0x7f_f000, 0x7f_ffff,
    ];
    let all: Vec<f32> = (0..=0x1ffu32)
        .flat_map(|se| mantissas.map(move |m| f32::from_bits((se << 23) | m)))
        .chain([
            f32::NAN,
            -f32::NAN,
            65520.0,
            65519.99,
            1e-8,
            5.9604645e-8,
            2.9802322e-8,
        ])
        .collect();
    let mut narrow = vec![f16::ZERO; all.len()];
    f32_to_f16_row(&all, &mut narrow);
    for (x, h) in all.iter().zip(&narrow) {
        assert_eq!(
            h.to_bits(),
            f16::from_f32(*x).to_bits(),
            "f32 bits {:#010x}",
            x.to_bits()
        );
    }
}

#[test]
fn f16_and_bf16_rows_round_trip_and_round_to_even() {
    let exact = [0.0f32, -0.0, 1.0, -2.5, 0.099975586, 65504.0];
    let mut h = vec![f16::ZERO; exact.len()];
    f32_to_f16_row(&exact, &mut h);
    let mut back = vec![0.0f32; exact.len()];
    f16_to_f32_row(&h, &mut back);
    assert_eq!(back, exact);

    // 1 + 2^-11 is halfway between 1 and the next f16 (1 + 2^-10): ties go to even (1).
    // 1 + 3·2^-11 is halfway between 1+2^-10 and 1+2^-9: ties go to even (1 + 2^-9).
    let ties = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11)];
    let mut th = vec![f16::ZERO; 2];
    f32_to_f16_row(&ties, &mut th);
    assert_eq!(th[0].to_f32(), 1.0);
    assert_eq!(th[1].to_f32(), 1.0 + 2f32.powi(-9));

    // bf16 keeps 8 significant bits: 1 + 2^-8 is a tie between 1 and 1 + 2^-7.
    let b_in = [3.0f32, 1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8)];
    let mut b = vec![bf16::ZERO; 3];
    f32_to_bf16_row(&b_in, &mut b);
    let mut b_out = vec![0.0f32; 3];
    bf16_to_f32_row(&b, &mut b_out);
    assert_eq!(b_out, vec![3.0, 1.0, 1.0 + 2f32.powi(-6)]);

    let bytes: Vec<u8> = h.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut from_bytes = vec![0.0f32; exact.len()];
    f16_le_bytes_to_f32_row(&bytes, &mut from_bytes);
    assert_eq!(from_bytes, exact);
    let bbytes: Vec<u8> = b.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut from_bbytes = vec![0.0f32; 3];
    bf16_le_bytes_to_f32_row(&bbytes, &mut from_bbytes);
    assert_eq!(from_bbytes, b_out);
}

// ---------------------------------------------------------------- attention

fn attention_ref(q: &[f32], k: &[Vec<f32>], v: &[Vec<f32>], scale: f64) -> Vec<f64> {
    let scores: Vec<f64> = k
        .iter()
        .map(|row| {
            scale
                * row
                    .iter()
                    .zip(q)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let z: f64 = e.iter().sum();
    let mut out = vec![0.0; q.len()];
    for (p, row) in e.iter().zip(v) {
        for (o, &x) in out.iter_mut().zip(row) {
            *o += p / z * f64::from(x);
        }
    }
    out
}

/// Builds cache-like rows `[n_rows, n_kv_heads·head_dim]` and per-head row lists.
fn kv_rows(seed: u64, n_rows: usize, n_kv_heads: usize, head_dim: usize) -> Vec<f32> {
    values(seed, n_rows * n_kv_heads * head_dim)
        .iter()
        .map(|v| v * 2.0)
        .collect()
}

fn head_of(
    rows: &[f32],
    n_kv_heads: usize,
    head_dim: usize,
    h: usize,
    range: std::ops::Range<usize>,
) -> Vec<Vec<f32>> {
    let w = n_kv_heads * head_dim;
    range
        .map(|j| rows[j * w + h * head_dim..j * w + (h + 1) * head_dim].to_vec())
        .collect()
}

#[test]
fn attend_head_f32_matches_reference() {
    let (n_rows, n_kv_heads, head_dim) = (37, 2, 64);
    let k = kv_rows(100, n_rows, n_kv_heads, head_dim);
    let v = kv_rows(101, n_rows, n_kv_heads, head_dim);
    let q = values(102, head_dim);
    let scale = 1.0 / (head_dim as f32).sqrt();
    let mut scratch = vec![0.0; attend_scratch_len(n_rows, head_dim)];
    for h in 0..n_kv_heads {
        for range in [0..n_rows, 5..20, 36..37] {
            let keys = HeadRows::head(&k, n_kv_heads, head_dim, h).unwrap();
            let vals = HeadRows::head(&v, n_kv_heads, head_dim, h).unwrap();
            let mut out = vec![0.0; head_dim];
            attend_head(&q, keys, vals, range.clone(), scale, &mut out, &mut scratch);
            let want = attention_ref(
                &q,
                &head_of(&k, n_kv_heads, head_dim, h, range.clone()),
                &head_of(&v, n_kv_heads, head_dim, h, range.clone()),
                f64::from(scale),
            );
            for i in 0..head_dim {
                assert_close(
                    out[i],
                    want[i],
                    1e-5,
                    &format!("h={h} range={range:?} i={i}"),
                );
            }
        }
    }
}

#[test]
fn attend_head_f16_matches_reference_on_widened_rows() {
    let (n_rows, n_kv_heads, head_dim) = (50, 1, 256);
    let k32 = kv_rows(110, n_rows, n_kv_heads, head_dim);
    let v32 = kv_rows(111, n_rows, n_kv_heads, head_dim);
    let k16: Vec<f16> = k32.iter().map(|&x| f16::from_f32(x)).collect();
    let v16: Vec<f16> = v32.iter().map(|&x| f16::from_f32(x)).collect();
    let kw: Vec<f32> = k16.iter().map(|x| x.to_f32()).collect();
    let vw: Vec<f32> = v16.iter().map(|x| x.to_f32()).collect();
    let q = values(112, head_dim);
    let mut scratch = vec![0.0; attend_scratch_len(n_rows, head_dim)];
    let mut out16 = vec![0.0; head_dim];
    attend_head(
        &q,
        HeadRows::head(&k16, 1, head_dim, 0).unwrap(),
        HeadRows::head(&v16, 1, head_dim, 0).unwrap(),
        0..n_rows,
        0.0625,
        &mut out16,
        &mut scratch,
    );
    // With f16 storage the query and the probabilities are rounded to f16 before they
    // meet the cache rows (as the reference engine multiplies f16 by f16); the reference
    // here does the same rounding and the rest in f64.
    let q16: Vec<f32> = q.iter().map(|&x| f16::from_f32(x).to_f32()).collect();
    let scores: Vec<f64> = (0..n_rows)
        .map(|j| {
            0.0625
                * (0..head_dim)
                    .map(|d| q16[d] as f64 * kw[j * head_dim + d] as f64)
                    .sum::<f64>()
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let exps: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = exps.iter().sum();
    let probs16: Vec<f64> = exps
        .iter()
        .map(|e| f16::from_f32((e / total) as f32).to_f32() as f64)
        .collect();
    for i in 0..head_dim {
        let want: f64 = (0..n_rows)
            .map(|j| probs16[j] * vw[j * head_dim + i] as f64)
            .sum();
        assert_close(out16[i], want, 1e-5, &format!("i={i}"));
    }
}

#[test]
fn attend_head_single_row_returns_that_value_row() {
    let head_dim = 16;
    let k = values(120, 4 * head_dim);
    let v = values(121, 4 * head_dim);
    let q = values(122, head_dim);
    let mut out = vec![9.0; head_dim];
    let mut scratch = vec![0.0; attend_scratch_len(4, head_dim)];
    let keys = HeadRows::new(&k, head_dim, 0, head_dim).unwrap();
    let vals = HeadRows::new(&v, head_dim, 0, head_dim).unwrap();
    attend_head(&q, keys, vals, 2..3, 0.5, &mut out, &mut scratch);
    assert_eq!(&out[..], &v[2 * head_dim..3 * head_dim]);
    attend_head(&q, keys, vals, 3..3, 0.5, &mut out, &mut scratch);
    assert!(out.iter().all(|&x| x == 0.0), "empty range gives zeros");
}

#[test]
fn attend_head_ignores_rows_outside_the_range() {
    // The same query over the same rows must give identical bits whether the cache
    // view holds just those rows or many more (later positions of a chunk, unused
    // capacity) — the property chunk-size invariance rests on.
    let (head_dim, n_kv_heads) = (64, 2);
    let big_k = kv_rows(130, 100, n_kv_heads, head_dim);
    let big_v = kv_rows(131, 100, n_kv_heads, head_dim);
    let w = n_kv_heads * head_dim;
    let q = values(132, head_dim);
    let mut scratch = vec![0.0; attend_scratch_len(100, head_dim)];
    let mut a = vec![0.0; head_dim];
    let mut b = vec![0.0; head_dim];
    attend_head(
        &q,
        HeadRows::head(&big_k, n_kv_heads, head_dim, 1).unwrap(),
        HeadRows::head(&big_v, n_kv_heads, head_dim, 1).unwrap(),
        10..40,
        0.125,
        &mut a,
        &mut scratch,
    );
    // A scratch full of NaN: every lane the sum reads must be written first.
    let mut dirty_scratch = vec![f32::NAN; attend_scratch_len(30, head_dim)];
    attend_head(
        &q,
        HeadRows::head(&big_k[..40 * w], n_kv_heads, head_dim, 1).unwrap(),
        HeadRows::head(&big_v[..40 * w], n_kv_heads, head_dim, 1).unwrap(),
        10..40,
        0.125,
        &mut b,
        &mut dirty_scratch,
    );
    assert_eq!(a, b);
}

#[test]
fn head_rows_rejects_bad_geometry() {
    let data = vec![0.0f32; 24];
    assert!(HeadRows::new(&data, 8, 0, 8).is_some());
    assert_eq!(HeadRows::new(&data, 8, 4, 4).unwrap().n_rows(), 3);
    assert!(
        HeadRows::new(&data, 8, 6, 4).is_none(),
        "columns past the row"
    );
    assert!(HeadRows::new(&data, 7, 0, 4).is_none(), "ragged rows");
    assert!(HeadRows::new(&data, 8, 0, 0).is_none(), "zero head_dim");
    assert!(HeadRows::new(&data, 0, 0, 4).is_none(), "zero stride");
    assert!(
        HeadRows::head(&data, 2, 4, 2).is_none(),
        "head index out of range"
    );
    let h = HeadRows::head(&data, 2, 4, 1).unwrap();
    assert_eq!(h.head_dim(), 4);
    assert_eq!(h.n_rows(), 3);
}

#[test]
#[should_panic(expected = "scratch")]
fn attend_head_panics_on_short_scratch() {
    let data = vec![0.0f32; 32];
    let rows = HeadRows::new(&data, 8, 0, 8).unwrap();
    let mut out = vec![0.0; 8];
    let mut scratch = vec![0.0; 2];
    attend_head(&[0.0; 8], rows, rows, 0..4, 1.0, &mut out, &mut scratch);
}

/// The AVX2 + FMA build of the attention kernel against its portable twin: same bits,
/// for f32 and f16 storage, head sizes with and without a tail past 64, row ranges
/// shorter and longer than the 64 value lanes, starting anywhere.
#[cfg(target_arch = "x86_64")]
#[test]
fn attend_head_avx2_matches_portable_twin() {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    {
        eprintln!("skipped: no AVX2/FMA on this CPU");
        return;
    }
    for (seed, head_dim) in [(140u64, 40usize), (141, 64), (142, 80), (143, 256)] {
        let n_rows = 150;
        let k = kv_rows(seed, n_rows, 2, head_dim);
        let v = kv_rows(seed + 100, n_rows, 2, head_dim);
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let q = values(seed + 200, head_dim);
        for range in [0..1, 3..50, 0..64, 17..150, 64..130] {
            let len = attend_scratch_len(range.len(), head_dim);
            let (mut s1, mut s2) = (vec![0.0; len], vec![f32::NAN; len]);
            let (mut a, mut b) = (vec![0.0; head_dim], vec![0.0; head_dim]);
            let keys = HeadRows::head(&k, 2, head_dim, 1).unwrap();
            let vals = HeadRows::head(&v, 2, head_dim, 1).unwrap();
            let view = CacheView {
                keys,
                values: vals,
                first_row: 0,
                precision: KvPrecision::F32,
            };
            attend_portable(&q, view, range.clone(), 0.3, &mut a, &mut s1);
            // SAFETY: AVX2 and FMA were detected above.
            unsafe { attend_avx2(&q, view, range.clone(), 0.3, &mut b, &mut s2) };
            assert_eq!(a, b, "f32 head_dim={head_dim} range={range:?}");
            let keys = HeadRows::head(&k16, 2, head_dim, 0).unwrap();
            let vals = HeadRows::head(&v16, 2, head_dim, 0).unwrap();
            let view = CacheView {
                keys,
                values: vals,
                first_row: 0,
                precision: KvPrecision::F16,
            };
            attend_portable(&q, view, range.clone(), 0.3, &mut a, &mut s1);
            // SAFETY: as above.
            unsafe { attend_avx2(&q, view, range.clone(), 0.3, &mut b, &mut s2) };
            assert_eq!(a, b, "f16 head_dim={head_dim} range={range:?}");
            // The same f16 rows widened to f32 and viewed from a later first row give the
            // same bits: what a prefill chunk does.
            let base = range.start.min(3);
            let wide_k: Vec<f32> = k16[base * 2 * head_dim..]
                .iter()
                .map(|x| x.to_f32())
                .collect();
            let wide_v: Vec<f32> = v16[base * 2 * head_dim..]
                .iter()
                .map(|x| x.to_f32())
                .collect();
            let widened = CacheView {
                keys: HeadRows::head(&wide_k, 2, head_dim, 0).unwrap(),
                values: HeadRows::head(&wide_v, 2, head_dim, 0).unwrap(),
                first_row: base,
                precision: KvPrecision::F16,
            };
            attend(&q, widened, range.clone(), 0.3, &mut b, &mut s2);
            assert_eq!(a, b, "widened f16 head_dim={head_dim} range={range:?}");
        }
    }
}

/// `attend_group`'s AVX2 build (scores and value lanes eight to a register, each key row
/// widened once for the group, the heads taking turns on each set of value lanes)
/// against the portable twin, bit for bit: f32 and f16 storage, heads of 64, 128 and 256
/// (the AVX2 code) and 40 and 80 (the portable code compiled for AVX2), 1 to 4 and 7 query
/// heads per KV head (the value lanes take up to four heads together: 7 is four and
/// three), ranges shorter and longer than the 64 lanes, starting anywhere.
#[cfg(target_arch = "x86_64")]
#[test]
fn attend_group_avx2_matches_portable_twin() {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    {
        eprintln!("skipped: no AVX2/FMA on this CPU");
        return;
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (seed, head_dim) in [
        (150u64, 40usize),
        (151, 64),
        (152, 80),
        (154, 128),
        (153, 256),
    ] {
        let n_rows = 150;
        let k = kv_rows(seed, n_rows, 2, head_dim);
        let v = kv_rows(seed + 100, n_rows, 2, head_dim);
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let all_qs = values(seed + 200, 7 * head_dim);
        let cases = [1, 2, 3, 4, 7]
            .into_iter()
            .flat_map(|group| [0..1, 3..50, 0..64, 17..150, 64..130].map(|r| (group, r)));
        for (group, range) in cases {
            let qs = &all_qs[..group * head_dim];
            let glen = attend_group_scratch_len(group, range.len(), head_dim);
            let (mut g1, mut g2) = (vec![0.0; glen], vec![f32::NAN; glen]);
            let (mut a, mut b) = (vec![0.0; qs.len()], vec![0.0; qs.len()]);
            let f32_view = CacheView {
                keys: HeadRows::head(&k, 2, head_dim, 1).unwrap(),
                values: HeadRows::head(&v, 2, head_dim, 1).unwrap(),
                first_row: 0,
                precision: KvPrecision::F32,
            };
            attend_group_portable(qs, f32_view, range.clone(), 0.3, &mut a, &mut g1);
            // SAFETY: AVX2 and FMA were detected above.
            unsafe { attend_group_avx2(qs, f32_view, range.clone(), 0.3, &mut b, &mut g2) };
            assert_eq!(
                bits(&a),
                bits(&b),
                "f32 head_dim={head_dim} group={group} range={range:?}"
            );
            let f16_view = CacheView {
                keys: HeadRows::head(&k16, 2, head_dim, 0).unwrap(),
                values: HeadRows::head(&v16, 2, head_dim, 0).unwrap(),
                first_row: 0,
                precision: KvPrecision::F16,
            };
            attend_group_portable(qs, f16_view, range.clone(), 0.3, &mut a, &mut g1);
            // SAFETY: as above.
            unsafe { attend_group_avx2(qs, f16_view, range.clone(), 0.3, &mut b, &mut g2) };
            assert_eq!(
                bits(&a),
                bits(&b),
                "f16 head_dim={head_dim} group={group} range={range:?}"
            );
        }
    }
}

/// SwiGLU's FMA build against the portable one: same bits (rows with and without a tail
/// past the groups of 16, values across the exp's range).
#[cfg(target_arch = "x86_64")]
#[test]
fn swiglu_avx2_matches_portable_twin() {
    if !(std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    {
        eprintln!("skipped: no AVX2/FMA on this CPU");
        return;
    }
    for len in [1usize, 15, 16, 100, 4864] {
        let gate: Vec<f32> = values(150 + len as u64, len)
            .iter()
            .map(|v| v * 40.0)
            .collect();
        let up = values(151 + len as u64, len);
        let (mut a, mut b) = (gate.clone(), gate.clone());
        nx_f32::scalar::swiglu_row_in_place(&mut a, &up);
        // SAFETY: AVX2 and FMA were detected above.
        unsafe { swiglu_row_avx2(&mut b, &up) };
        assert_eq!(a, b, "len {len}");
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
        {
            let mut c = gate.clone();
            // SAFETY: AVX-512 F/DQ detected here, AVX2 and FMA above.
            unsafe { swiglu_row_avx512(&mut c, &up) };
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&c), "avx512 len {len}");
        }
    }
}

/// Scoring the query heads of a KV group together gives each head the bits it gets
/// alone, for f32 and f16 storage, any row range and group sizes up to and past the
/// eight heads rounded at once.
#[test]
fn attend_group_equals_attend_per_head() {
    let cases = [(160u64, 64usize, 4usize), (161, 80, 7), (162, 256, 9)];
    // Under Miri (thousands of times slower) the first geometry only: same code paths.
    let cases = if cfg!(miri) { &cases[..1] } else { &cases[..] };
    for &(seed, head_dim, group) in cases {
        let n_rows = 140;
        let k = kv_rows(seed, n_rows, 2, head_dim);
        let v = kv_rows(seed + 1, n_rows, 2, head_dim);
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let qs = values(seed + 2, group * head_dim);
        for range in [0..1, 5..70, 0..140, 100..140] {
            let mut want = vec![0.0; group * head_dim];
            let mut got = vec![0.0; group * head_dim];
            let mut scratch = vec![0.0; attend_scratch_len(range.len(), head_dim)];
            let mut group_scratch =
                vec![f32::NAN; attend_group_scratch_len(group, range.len(), head_dim)];
            let f32_view = CacheView {
                keys: HeadRows::head(&k, 2, head_dim, 1).unwrap(),
                values: HeadRows::head(&v, 2, head_dim, 1).unwrap(),
                first_row: 0,
                precision: KvPrecision::F32,
            };
            for g in 0..group {
                let q = &qs[g * head_dim..(g + 1) * head_dim];
                let out = &mut want[g * head_dim..(g + 1) * head_dim];
                attend(q, f32_view, range.clone(), 0.2, out, &mut scratch);
            }
            attend_group(
                &qs,
                f32_view,
                range.clone(),
                0.2,
                &mut got,
                &mut group_scratch,
            );
            assert_eq!(got, want, "f32 head_dim={head_dim} group={group} {range:?}");
            let f16_view = CacheView {
                keys: HeadRows::head(&k16, 2, head_dim, 0).unwrap(),
                values: HeadRows::head(&v16, 2, head_dim, 0).unwrap(),
                first_row: 0,
                precision: KvPrecision::F16,
            };
            for g in 0..group {
                let q = &qs[g * head_dim..(g + 1) * head_dim];
                let out = &mut want[g * head_dim..(g + 1) * head_dim];
                attend(q, f16_view, range.clone(), 0.2, out, &mut scratch);
            }
            attend_group(
                &qs,
                f16_view,
                range.clone(),
                0.2,
                &mut got,
                &mut group_scratch,
            );
            assert_eq!(got, want, "f16 head_dim={head_dim} group={group} {range:?}");
        }
    }
}

/// The AVX-512 builds of `attend` and `attend_group` against their portable twins, bit
/// for bit: f32, f16 and widened-f16 storage, value heads taking the register path (64,
/// 128, 256 wide) and the fallback (40, 80), ranges shorter and longer than the 64 value
/// lanes, starting anywhere, 2 to 7 query heads per KV head (the AVX-512 value lanes
/// take up to four heads together, so 6 and 7 are a group of four and one of 2 or 3).
#[cfg(target_arch = "x86_64")]
#[test]
fn attend_avx512_matches_portable_twin() {
    if !(std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c"))
    {
        eprintln!("skipped: no AVX-512 F on this CPU");
        return;
    }
    let mut checked = 0;
    for (seed, head_dim) in [
        (170u64, 40usize),
        (171, 64),
        (172, 80),
        (173, 128),
        (174, 256),
    ] {
        let n_rows = 200;
        let k = kv_rows(seed, n_rows, 2, head_dim);
        let v = kv_rows(seed + 100, n_rows, 2, head_dim);
        let k16: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
        let v16: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
        let base = 5;
        let wide_k: Vec<f32> = k16[base * 2 * head_dim..]
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let wide_v: Vec<f32> = v16[base * 2 * head_dim..]
            .iter()
            .map(|x| x.to_f32())
            .collect();
        let qs = values(seed + 200, 7 * head_dim);
        for range in [5..6, 7..50, 5..69, 17..150, 64..130, 70..200] {
            let f32_view = CacheView {
                keys: HeadRows::head(&k, 2, head_dim, 1).unwrap(),
                values: HeadRows::head(&v, 2, head_dim, 1).unwrap(),
                first_row: 0,
                precision: KvPrecision::F32,
            };
            let f16_view = CacheView {
                keys: HeadRows::head(&k16, 2, head_dim, 0).unwrap(),
                values: HeadRows::head(&v16, 2, head_dim, 0).unwrap(),
                first_row: 0,
                precision: KvPrecision::F16,
            };
            // The f16 rows widened to f32 and viewed from a later first row: the prefill
            // path, which must give the f16 view's bits.
            let widened = CacheView {
                keys: HeadRows::head(&wide_k, 2, head_dim, 0).unwrap(),
                values: HeadRows::head(&wide_v, 2, head_dim, 0).unwrap(),
                first_row: base,
                precision: KvPrecision::F16,
            };
            let what = format!("head_dim={head_dim} {range:?}");
            check_avx512_twin(&qs, f32_view, range.clone(), &format!("f32 {what}"));
            let want = check_avx512_twin(&qs, f16_view, range.clone(), &format!("f16 {what}"));
            let got = check_avx512_twin(&qs, widened, range.clone(), &format!("wide {what}"));
            assert_eq!(want, got, "widened {what}");
            checked += 1;
        }
    }
    assert_eq!(checked, 30);
}

/// Runs `attend` (first head of `qs`) and `attend_group` (the first 2, 3, 4, 6 and 7
/// heads) through the portable and AVX-512 builds, asserts equal bits, and returns them.
#[cfg(target_arch = "x86_64")]
fn check_avx512_twin<T: KvElem>(
    qs: &[f32],
    view: CacheView<'_, T>,
    range: std::ops::Range<usize>,
    what: &str,
) -> Vec<u32> {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let head_dim = view.keys.head_dim();
    let len = attend_scratch_len(range.len(), head_dim);
    let (mut s1, mut s2) = (vec![0.0; len], vec![f32::NAN; len]);
    let (mut a, mut b) = (vec![0.0; head_dim], vec![0.0; head_dim]);
    attend_portable(&qs[..head_dim], view, range.clone(), 0.3, &mut a, &mut s1);
    // SAFETY: the caller detected the features.
    unsafe { attend_avx512(&qs[..head_dim], view, range.clone(), 0.3, &mut b, &mut s2) };
    assert_eq!(bits(&a), bits(&b), "{what}");
    let mut all = bits(&a);
    for group in [2, 3, 4, 6, 7] {
        let qs = &qs[..group * head_dim];
        let glen = attend_group_scratch_len(group, range.len(), head_dim);
        let (mut g1, mut g2) = (vec![0.0; glen], vec![f32::NAN; glen]);
        let (mut ga, mut gb) = (vec![0.0; qs.len()], vec![0.0; qs.len()]);
        attend_group_portable(qs, view, range.clone(), 0.3, &mut ga, &mut g1);
        // SAFETY: as above.
        unsafe { attend_group_avx512(qs, view, range.clone(), 0.3, &mut gb, &mut g2) };
        assert_eq!(bits(&ga), bits(&gb), "group of {group}, {what}");
        all.extend(bits(&ga));
    }
    all
}

/// Gemma 2's soft cap: scores `tanh(s/cap)·cap` before the scale. Close to an f64
/// reference, different from the uncapped result, and the same bits on every tier and
/// for a KV group scored together.
#[test]
fn attend_soft_cap_matches_reference_and_every_tier() {
    let (n_rows, head_dim, group) = (90, 64, 2);
    let k = kv_rows(170, n_rows, 1, head_dim);
    let v = kv_rows(171, n_rows, 1, head_dim);
    let qs: Vec<f32> = values(172, group * head_dim)
        .iter()
        .map(|x| x * 3.0)
        .collect();
    let (cap, scale) = (5.0f32, 0.5f32);
    let scoring = Scoring {
        scale,
        softcap: Some(cap),
    };
    let view = CacheView {
        keys: HeadRows::head(&k, 1, head_dim, 0).unwrap(),
        values: HeadRows::head(&v, 1, head_dim, 0).unwrap(),
        first_row: 0,
        precision: KvPrecision::F32,
    };
    let range = 7..n_rows;
    let mut scratch = vec![0.0; attend_scratch_len(range.len(), head_dim)];
    let q = &qs[..head_dim];
    let mut capped = vec![0.0; head_dim];
    attend_portable(q, view, range.clone(), scoring, &mut capped, &mut scratch);
    // The reference: capped f64 scores, then the softmax and weighted sum.
    let keys = head_of(&k, 1, head_dim, 0, range.clone());
    let vals = head_of(&v, 1, head_dim, 0, range.clone());
    let scores: Vec<f64> = keys
        .iter()
        .map(|row| {
            let s: f64 = row
                .iter()
                .zip(q)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            f64::from(scale) * (s / f64::from(cap)).tanh() * f64::from(cap)
        })
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let z: f64 = scores.iter().map(|s| (s - max).exp()).sum();
    for i in 0..head_dim {
        let want: f64 = scores
            .iter()
            .zip(&vals)
            .map(|(s, row)| (s - max).exp() / z * f64::from(row[i]))
            .sum();
        assert_close(capped[i], want, 1e-5, &format!("capped i={i}"));
    }
    let mut plain = vec![0.0; head_dim];
    attend_portable(q, view, range.clone(), scale, &mut plain, &mut scratch);
    assert_ne!(plain, capped, "the cap must change these scores");
    // Every tier, and the grouped scoring, give the portable bits.
    let mut tiers = vec![capped.clone()];
    #[cfg(target_arch = "x86_64")]
    {
        let mut b = vec![0.0; head_dim];
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX2 and FMA were detected.
            unsafe { attend_avx2(q, view, range.clone(), scoring, &mut b, &mut scratch) };
            tiers.push(b.clone());
        }
        if std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("f16c")
            && std::arch::is_x86_feature_detected!("fma")
        {
            // SAFETY: AVX-512 F/DQ, AVX2 (implied), FMA and F16C were detected.
            unsafe { attend_avx512(q, view, range.clone(), scoring, &mut b, &mut scratch) };
            tiers.push(b);
        }
    }
    for t in &tiers {
        assert_eq!(t, &capped);
    }
    let mut outs = vec![0.0; group * head_dim];
    let mut group_scratch = vec![0.0; attend_group_scratch_len(group, range.len(), head_dim)];
    attend_group(
        &qs,
        view,
        range.clone(),
        scoring,
        &mut outs,
        &mut group_scratch,
    );
    assert_eq!(&outs[..head_dim], &capped[..]);
    let mut second = vec![0.0; head_dim];
    attend(
        &qs[head_dim..],
        view,
        range,
        scoring,
        &mut second,
        &mut scratch,
    );
    assert_eq!(&outs[head_dim..], &second[..]);
}

/// YaRN: pairs below the correction range keep the original angle, pairs above it take
/// the interpolated one, every magnitude grows by `1 + 0.1·ln(factor)`, and the pairs
/// between blend the two.
#[test]
fn rope_yarn_keeps_fast_pairs_and_interpolates_slow_ones() {
    let (dim, base, scale) = (64usize, 10_000f32, 0.25f32);
    let plain = RopeTable::new(dim, base, None).unwrap();
    let linear = plain.clone().with_freq_scale(scale).unwrap();
    let yarn = linear.clone().with_yarn(1024, base, 32.0, 1.0).unwrap();
    let m = 0.1f32.mul_add((1.0f32 / scale).ln(), 1.0);
    for pos in [0usize, 1, 17, 3000] {
        let (mut p, mut l, mut y) = (plain.clone(), linear.clone(), yarn.clone());
        p.set_position(pos);
        l.set_position(pos);
        y.set_position(pos);
        // 1024 positions turn pairs 0..=5 at least 32 times and pairs from 18 on at most
        // once (ggml's correction dimensions for this base and width).
        for i in 0..=5 {
            assert_eq!(y.cos()[i], p.cos()[i] * m, "pos {pos} pair {i}");
            assert_eq!(y.sin()[i], p.sin()[i] * m, "pos {pos} pair {i}");
        }
        for i in 18..dim / 2 {
            assert_eq!(y.cos()[i], l.cos()[i] * m, "pos {pos} pair {i}");
            assert_eq!(y.sin()[i], l.sin()[i] * m, "pos {pos} pair {i}");
        }
        if pos == 3000 {
            let mid = 12;
            assert_ne!(y.cos()[mid], p.cos()[mid] * m);
            assert_ne!(y.cos()[mid], l.cos()[mid] * m);
        }
    }
    assert!(linear.with_yarn(1024, base, f32::NAN, 1.0).is_err());
}

#[test]
fn f16_store_row_rounds_as_from_f32() {
    // The row converter against f16::from_f32 one by one: ties to even, subnormals,
    // overflow to infinity, signed zeros, and lengths around the vector widths.
    let mut src = values(3, 203);
    src.extend([
        0.0,
        -0.0,
        1.0 + f32::EPSILON,
        65504.0,
        65520.0,
        1e9,
        -1e9,
        5.96e-8,
        2.98e-8,
        6.1e-5,
        f32::INFINITY,
        f32::NEG_INFINITY,
    ]);
    // Exact ties between neighbouring f16 values (the rounding direction shows).
    src.extend((0..64).map(|i| 1.0 + (2 * i + 1) as f32 / 2048.0));
    for len in [0, 1, 7, 8, 15, 16, 17, src.len()] {
        let mut got = vec![f16::ZERO; len];
        <f16 as KvElem>::store_row(&mut got, &src[..len]);
        let want: Vec<f16> = src[..len].iter().map(|&x| f16::from_f32(x)).collect();
        let bits = |v: &[f16]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got), bits(&want), "len {len}");
    }
}

#[test]
fn paged_rows_attend_with_the_contiguous_rows_bits() {
    // 45 positions of two KV heads in blocks of 8, scattered over a pool of 9 blocks in
    // a shuffled order: attention through the block table must give the bits of the
    // same rows laid out contiguously, for every head, range and element type.
    let (head_dim, n_kv_heads, block, n_rows) = (64, 2, 8, 45);
    let w = n_kv_heads * head_dim;
    let table: Vec<u32> = vec![7, 2, 5, 0, 8, 3];
    let k = kv_rows(140, n_rows, n_kv_heads, head_dim);
    let v = kv_rows(141, n_rows, n_kv_heads, head_dim);
    let mut k_pool = vec![f32::NAN; 9 * block * w];
    let mut v_pool = vec![f32::NAN; 9 * block * w];
    for p in 0..n_rows {
        let slot = table[p / block] as usize * block + p % block;
        k_pool[slot * w..(slot + 1) * w].copy_from_slice(&k[p * w..(p + 1) * w]);
        v_pool[slot * w..(slot + 1) * w].copy_from_slice(&v[p * w..(p + 1) * w]);
    }
    let k16: Vec<f16> = k_pool.iter().map(|&x| f16::from_f32(x)).collect();
    let v16: Vec<f16> = v_pool.iter().map(|&x| f16::from_f32(x)).collect();
    let k16c: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
    let v16c: Vec<f16> = v.iter().map(|&x| f16::from_f32(x)).collect();
    let q = values(142, head_dim);
    let mut scratch = vec![0.0; attend_scratch_len(n_rows, head_dim)];
    for h in 0..n_kv_heads {
        for rows in [0..n_rows, 3..17, 8..16, 40..45, 44..45] {
            let shape = (n_kv_heads, head_dim, h);
            let (mut want, mut got) = (vec![0.0; head_dim], vec![0.0; head_dim]);
            let kc = HeadRows::head(&k, n_kv_heads, head_dim, h).unwrap();
            let vc = HeadRows::head(&v, n_kv_heads, head_dim, h).unwrap();
            attend_head(&q, kc, vc, rows.clone(), 0.125, &mut want, &mut scratch);
            let kp = HeadRows::head_paged(&k_pool, &table, block, n_rows, shape).unwrap();
            let vp = HeadRows::head_paged(&v_pool, &table, block, n_rows, shape).unwrap();
            attend_head(&q, kp, vp, rows.clone(), 0.125, &mut got, &mut scratch);
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "f32 head {h} rows {rows:?}");
            let kc = HeadRows::head(&k16c, n_kv_heads, head_dim, h).unwrap();
            let vc = HeadRows::head(&v16c, n_kv_heads, head_dim, h).unwrap();
            attend_head(&q, kc, vc, rows.clone(), 0.125, &mut want, &mut scratch);
            let kp = HeadRows::head_paged(&k16, &table, block, n_rows, shape).unwrap();
            let vp = HeadRows::head_paged(&v16, &table, block, n_rows, shape).unwrap();
            attend_head(&q, kp, vp, rows.clone(), 0.125, &mut got, &mut scratch);
            assert_eq!(bits(&got), bits(&want), "f16 head {h} rows {rows:?}");
        }
    }
    // Refused: a block size that is not a power of two, more rows than the table
    // reaches, a block outside the pool, a head past the last.
    let shape = (n_kv_heads, head_dim, 0);
    assert!(HeadRows::head_paged(&k_pool, &table, 6, 30, shape).is_none());
    assert!(HeadRows::head_paged(&k_pool, &table, block, 49, shape).is_none());
    assert!(HeadRows::head_paged(&k_pool, &[9], block, 8, shape).is_none());
    assert!(HeadRows::head_paged(&k_pool, &table, block, 8, (2, head_dim, 2)).is_none());
}
