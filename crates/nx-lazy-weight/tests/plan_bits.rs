//! No kernel plan changes a single output bit.
//!
//! For every weight format, every decode and prefill candidate this CPU can run (at the
//! active tier) multiplies the same weights by 1 to 37 tokens, on one and two threads,
//! and must give exactly the bits of the scalar plan. Activations laid out for one plan
//! and multiplied under another (a plan installed between the two) must too: the
//! kernel whose layout is missing gives way to one that reads the plain rows.

mod common;

use common::{assert_bits_eq, weight_row, Rng, WEIGHT_TYPES};
use nx_lazy_weight::plan::{decode_candidates, prefill_candidates, FormatPlan};
use nx_lazy_weight::{
    active_tier, matmul_quantized_pool_with, vec_dot_type, CpuTier, GgmlType, KernelPlan,
    LazyWeight, QuantizedActs,
};
use nx_syscalls::ThreadPool;

const K: usize = 512;
/// Not a multiple of four or sixteen: the four-row kernels and the tiles leave rows.
const ROWS: usize = 70;
/// Every remainder 1 to 7 past the eight-token groups (9, 2, 3, 12, 21, 14, 15).
const TOKEN_COUNTS: [usize; 10] = [1, 2, 3, 9, 12, 14, 15, 16, 21, 37];

fn product(
    plan: &KernelPlan,
    acts_plan: &KernelPlan,
    w: &LazyWeight<'_>,
    x: &[f32],
    n: usize,
    pool: &ThreadPool,
) -> Vec<f32> {
    let mut xq = QuantizedActs::new();
    xq.quantize_with_plan(acts_plan, w.vec_dot_type(), x, n, K, Some(pool))
        .unwrap();
    let mut y = vec![0f32; n * w.n_rows()];
    matmul_quantized_pool_with(plan, w, &xq, &mut y, pool).unwrap();
    y
}

#[test]
fn every_candidate_gives_the_scalar_plans_bits() {
    let tier = active_tier().unwrap();
    let scalar = KernelPlan::default_rules(CpuTier::Scalar);
    let default = KernelPlan::default_rules(tier);
    let pools = [ThreadPool::new(1), ThreadPool::new(2)];
    let mut rng = Rng::new(61);
    let mut checked = 0;
    for ty in WEIGHT_TYPES {
        if vec_dot_type(ty).is_none() {
            continue;
        }
        let bytes: Vec<u8> = (0..ROWS)
            .flat_map(|r| weight_row(&mut rng, ty, K, r % 2 == 0))
            .collect();
        let w = LazyWeight::from_parts(ty, &[K as u64, ROWS as u64], &bytes).unwrap();
        let base = default.get(ty);
        let mut plans: Vec<FormatPlan> = decode_candidates(tier, ty)
            .into_iter()
            .map(|decode| FormatPlan { decode, ..base })
            .collect();
        plans.extend(
            prefill_candidates(tier, ty)
                .into_iter()
                .map(|prefill| FormatPlan { prefill, ..base }),
        );
        for n in TOKEN_COUNTS {
            let x = rng.normals(n * K, 0.5);
            let expected = product(&scalar, &scalar, &w, &x, n, &pools[0]);
            for fp in &plans {
                let mut plan = default.clone();
                plan.set(ty, *fp).unwrap();
                for pool in &pools {
                    let what = format!(
                        "{ty} n={n} decode={} prefill={} threads={}",
                        fp.decode.name(),
                        fp.prefill.name(),
                        pool.n_threads()
                    );
                    let y = product(&plan, &plan, &w, &x, n, pool);
                    assert_bits_eq(&y, &expected, &what);
                    // Laid out for the default plan, multiplied under this one, and back.
                    let y = product(&plan, &default, &w, &x, n, pool);
                    assert_bits_eq(&y, &expected, &format!("{what} (default layout)"));
                    let y = product(&default, &plan, &w, &x, n, pool);
                    assert_bits_eq(&y, &expected, &format!("{what} (its layout, default)"));
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 0);
    // A SIMD tier must have offered more than one candidate somewhere.
    if tier != CpuTier::Scalar {
        assert!(
            decode_candidates(tier, GgmlType::Q8_0).len() > 1,
            "{tier}: one decode kernel for Q8_0"
        );
    }
}
