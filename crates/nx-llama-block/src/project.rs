//! Projections that share one quantized copy of their input.

use nx_lazy_weight::{matmul_quantized_pool, GgmlType, LazyWeight, LazyWeightError, QuantizedActs};
use nx_syscalls::ThreadPool;

/// Quantizes an activation matrix at most once per activation type and multiplies it by
/// any number of weights. Q, K and V (and gate and up) read the same normalised input;
/// quantizing it once per type is both faster and what the reference engine does.
#[derive(Debug, Default)]
pub struct Projector {
    holders: Vec<QuantizedActs>,
}

impl Projector {
    /// Forgets the previous input; the next [`Projector::project`] quantizes afresh.
    pub fn reset(&mut self) {
        for h in &mut self.holders {
            // An empty holder never fits a weight, so it is re-quantized on demand.
            let _ = h.quantize(GgmlType::F32, &[], 0, 0);
        }
    }

    /// `y = x·Wᵀ` for `x: [n, K]`, `y: [n, N]`, the weight rows split across `pool`
    /// (bit-identical for any thread count). `x` must be the same matrix on every call
    /// between two resets.
    pub fn project(
        &mut self,
        w: &LazyWeight<'_>,
        x: &[f32],
        n: usize,
        y: &mut [f32],
        pool: &ThreadPool,
    ) -> Result<(), LazyWeightError> {
        let idx = match self
            .holders
            .iter()
            .position(|h| h.n_rows() == n && n > 0 && h.fits(w))
        {
            Some(i) => i,
            None => {
                let slot = self
                    .holders
                    .iter()
                    .position(|h| h.n_rows() == 0)
                    .unwrap_or_else(|| {
                        self.holders.push(QuantizedActs::new());
                        self.holders.len() - 1
                    });
                self.holders[slot].quantize_for_pool(w, x, n, pool)?;
                slot
            }
        };
        matmul_quantized_pool(w, &self.holders[idx], y, pool)
    }
}
