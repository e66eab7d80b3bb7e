//! Projections that share one quantized copy of their input.

use nx_lazy_weight::{
    matmul_batch_pool, matmul_quantized_pool, LazyWeight, LazyWeightError, MatmulJob, QuantizedActs,
};
use nx_syscalls::ThreadPool;

/// Multiplies one activation matrix by several weights, quantizing it once per activation
/// type. Q, K and V (and gate and up) read the same normalised input; quantizing it once
/// per type is both faster and what the reference engine does. Each call takes its input
/// afresh, so nothing carries over between calls but the buffers.
#[derive(Debug, Default)]
pub struct Projector {
    holders: Vec<QuantizedActs>,
}

/// Most tokens whose products [`Projector::project_all`] runs as one pass: decode steps
/// (`nx bench -p 64 -n 48 -t 2 --parallel 8`, default model, AMD EPYC family 25 model 17,
/// seven alternating pairs in a quiet phase: about +1.5 % tok/s against one token only).
const BATCHED_TOKENS: usize = 16;

/// One product of [`Projector::project_all`]: the weight and where `x·Wᵀ` goes.
pub type Projection<'p, 'w> = (&'p LazyWeight<'w>, &'p mut [f32]);

impl Projector {
    /// `y = x·Wᵀ` for `x: [n, K]`, `y: [n, N]`, the weight rows split across `pool`
    /// (bit-identical for any thread count).
    pub fn project(
        &mut self,
        w: &LazyWeight<'_>,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        pool: &ThreadPool,
    ) -> Result<(), LazyWeightError> {
        self.project_all(x, n, &mut [(w, y)], pool)
    }

    /// `y = x·Wᵀ` for every `(W, y)` of `products`, `x` quantized once per activation type
    /// they need. The products of up to sixteen tokens (a decode step, batched
    /// or verifying a draft) run as one parallel pass over all their weight rows (small
    /// matrices such as K and V would otherwise each pay a pass of their own); a prefill
    /// chunk's run one after the other, each cut as prefill wants.
    /// Every output has the bits of its own [`Projector::project`].
    pub fn project_all(
        &mut self,
        x: &[f32],
        n: usize,
        products: &mut [Projection<'_, '_>],
        pool: &ThreadPool,
    ) -> Result<(), LazyWeightError> {
        // Holders `..used` hold `x` in this call; `which[i]` is product i's.
        let mut used = 0;
        let mut which = Vec::with_capacity(products.len());
        for (w, _) in products.iter() {
            let fitting = self.holders[..used].iter().position(|h| h.fits(w));
            let idx = match fitting {
                Some(i) => i,
                None => {
                    if used == self.holders.len() {
                        self.holders.push(QuantizedActs::new());
                    }
                    self.holders[used].quantize_for_pool(w, x, n, pool)?;
                    used += 1;
                    used - 1
                }
            };
            which.push(idx);
        }
        if n <= BATCHED_TOKENS && products.len() > 1 {
            let mut jobs: Vec<MatmulJob<'_, '_>> = products
                .iter_mut()
                .zip(&which)
                .map(|((w, y), &i)| MatmulJob {
                    w,
                    xq: &self.holders[i],
                    y,
                })
                .collect();
            return matmul_batch_pool(&mut jobs, pool);
        }
        for ((w, y), &i) in products.iter_mut().zip(&which) {
            matmul_quantized_pool(w, &self.holders[i], y, pool)?;
        }
        Ok(())
    }
}
