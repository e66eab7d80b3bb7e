//! The mixture-of-experts FFN (Qwen3-MoE): a router picks `n_used` of `n_expert` gated
//! FFNs per token, and their outputs are summed with the router's weights.
//!
//! In the reference's order, so the one-token path matches llama.cpp's: router logits
//! (one matmul), softmax over the experts, the `n_used` largest probabilities in
//! descending order, optionally divided by their sum (an f64 sum rounded to f32, clamped
//! below at the smallest normal f16), each chosen expert's `down(silu(gate)·up)` times its
//! weight, then the slots added in that order.
//!
//! Batch invariance: tokens are grouped by expert, so each expert's weights are read
//! once per step for all the tokens that chose it; every output element is still one
//! dot product in a fixed order, so a token's result does not depend on which other
//! tokens share the step.
//!
//! Speed: one decode step multiplies a token by `3 · n_used` small matrices per layer.
//! Given to the pool one by one, the threads spend more time waking than computing; so
//! all chosen experts' gate and up products go to the pool as one batch
//! (`matmul_batch_pool`, which gives each small matrix one chunk), and then all their
//! down products.

use nx_lazy_weight::{matmul_batch_pool, LazyWeight, LazyWeightError, MatmulJob, QuantizedActs};
use nx_syscalls::ThreadPool;

use crate::layer::{sized, BlockError, MoeWeights};
use crate::Projector;

/// Reused buffers of the expert FFN.
#[derive(Default)]
pub(crate) struct MoeScratch {
    logits: Vec<f32>, // [n, n_expert]
    /// Per token and slot: the expert and its weight.
    choice: Vec<(usize, f32)>, // [n, n_used]
    /// Expert indices while one token's are ranked.
    order: Vec<usize>,
    /// The batch rows (token · n_used + slot), grouped by the expert they chose.
    rows: Vec<usize>,
    /// The chosen experts, in index order, with their ranges of `rows`.
    groups: Vec<ExpertGroup>,
    input: Vec<f32>, // [m, n_embd]
    gate: Vec<f32>,  // [m, n_ff_exp]
    up: Vec<f32>,    // [m, n_ff_exp]
    out: Vec<f32>,   // [m, n_embd]
    slots: Vec<f32>, // [n, n_used, n_embd]
    /// Quantized activations per chosen expert: for gate, for up (when its type
    /// differs), for down.
    acts: Vec<QuantizedActs>,
    projector: Projector,
}

/// One chosen expert and the range of [`MoeScratch::rows`] routed to it.
struct ExpertGroup {
    expert: usize,
    start: usize,
    len: usize,
}

/// One expert's matrices, viewed in the 3-D tensors.
struct ExpertViews<'a> {
    gate: LazyWeight<'a>,
    up: LazyWeight<'a>,
    down: LazyWeight<'a>,
}

impl<'a> ExpertViews<'a> {
    /// Expert `e`'s rows of the layer's 3-D tensors.
    fn of(
        m: &MoeWeights<'a>,
        e: usize,
        n_ff: usize,
        n_embd: usize,
    ) -> Result<Self, LazyWeightError> {
        Ok(ExpertViews {
            gate: m.gate.row_range(e * n_ff..(e + 1) * n_ff)?,
            up: m.up.row_range(e * n_ff..(e + 1) * n_ff)?,
            down: m.down.row_range(e * n_embd..(e + 1) * n_embd)?,
        })
    }
}

/// The softmax probabilities of one token's router logits, the `n_used` best experts
/// (descending probability; ties to the lower index) with their weights. `order` is
/// scratch for the expert indices.
fn choose(
    logits: &mut [f32],
    n_used: usize,
    norm: bool,
    order: &mut Vec<usize>,
    out: &mut [(usize, f32)],
) {
    nx_f32::softmax_in_place(logits); // [n_expert]
    order.clear();
    order.extend(0..logits.len());
    order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    for (slot, &e) in out.iter_mut().zip(&order[..n_used]) {
        *slot = (e, logits[e]);
    }
    if norm {
        // As ggml's sum_rows (f64 in order), clamped to the smallest normal f16.
        let sum: f64 = out.iter().map(|&(_, w)| f64::from(w)).sum();
        let sum = (sum as f32).max(6.103_515_6e-5);
        for (_, w) in out.iter_mut() {
            *w /= sum;
        }
    }
}

/// `proj = Σ_slots weight·down(silu(gate·x)·(up·x))` for the `n` rows of `normed`
/// (`[n, n_embd]` in, `[n, n_embd]` out).
#[allow(clippy::too_many_arguments)]
pub(crate) fn moe_ffn(
    m: &MoeWeights<'_>,
    layer: usize,
    n_embd: usize,
    normed: &[f32],
    n: usize,
    proj: &mut [f32],
    s: &mut MoeScratch,
    pool: &ThreadPool,
) -> Result<(), BlockError> {
    let n_expert = m.n_expert();
    let n_ff = m.gate.n_rows() / n_expert.max(1);
    if m.n_used == 0 || m.n_used > n_expert || n_ff * n_expert != m.gate.n_rows() {
        return Err(BlockError::Shape {
            layer,
            what: "experts",
            expected: n_expert,
            actual: m.n_used,
        });
    }
    // ---- router: each token's experts, best first, with their weights ----
    let logits = sized(&mut s.logits, n * n_expert); // [n, n_expert]
    s.projector.project(&m.router, normed, n, logits, pool)?;
    s.choice.resize(n * m.n_used, (0, 0.0)); // [n, n_used]
    for (row, out) in logits
        .chunks_exact_mut(n_expert)
        .zip(s.choice.chunks_exact_mut(m.n_used))
    {
        choose(row, m.n_used, m.norm_weights, &mut s.order, out);
    }
    // ---- the batch rows (token · n_used + slot) grouped by the expert they chose ----
    group_rows(&s.choice, n_expert, &mut s.rows, &mut s.groups);
    let rows = s.rows.len(); // n · n_used
    let input = sized(&mut s.input, rows * n_embd); // [rows, n_embd], grouped
    for (dst, &r) in input.chunks_exact_mut(n_embd).zip(&s.rows) {
        let t = r / m.n_used;
        dst.copy_from_slice(&normed[t * n_embd..(t + 1) * n_embd]);
    }
    let views = s
        .groups
        .iter()
        .map(|g| ExpertViews::of(m, g.expert, n_ff, n_embd))
        .collect::<Result<Vec<_>, _>>()?;
    let n_groups = s.groups.len();
    if s.acts.len() < 3 * n_groups {
        s.acts.resize_with(3 * n_groups, QuantizedActs::new);
    }
    let (gate_up_acts, down_acts) = s.acts.split_at_mut(2 * n_groups);
    // ---- every chosen expert's gate and up in one pass, then SwiGLU ----
    let gate = sized(&mut s.gate, rows * n_ff); // [rows, n_ff_exp]
    let up = sized(&mut s.up, rows * n_ff); // [rows, n_ff_exp]
    let io = GroupedRows {
        groups: &s.groups,
        views: &views,
    };
    io.gate_up(input, n_embd, n_ff, gate_up_acts, gate, up, pool)?;
    for (g, u) in gate.chunks_exact_mut(n_ff).zip(up.chunks_exact(n_ff)) {
        nx_f32::swiglu_row_in_place(g, u);
    }
    // ---- every chosen expert's down projection in one pass ----
    let out = sized(&mut s.out, rows * n_embd); // [rows, n_embd], grouped
    io.down(gate, n_ff, n_embd, &mut down_acts[..n_groups], out, pool)?;
    // ---- each token's slots, weighted, added in slot order ----
    let slots = sized(&mut s.slots, n * m.n_used * n_embd); // [n, n_used, n_embd]
    for (o, &r) in out.chunks_exact(n_embd).zip(&s.rows) {
        let w = s.choice[r].1;
        for (d, &x) in slots[r * n_embd..(r + 1) * n_embd].iter_mut().zip(o) {
            *d = x * w;
        }
    }
    for (t, out) in proj.chunks_exact_mut(n_embd).enumerate().take(n) {
        let first = t * m.n_used;
        out.copy_from_slice(&slots[first * n_embd..(first + 1) * n_embd]);
        for slot in 1..m.n_used {
            let r = first + slot;
            nx_f32::add_in_place(out, &slots[r * n_embd..(r + 1) * n_embd]);
        }
    }
    Ok(())
}

/// The batch rows (`token · n_used + slot`) of each expert, experts in index order; an
/// expert nobody chose gets no group and is never read.
fn group_rows(
    choice: &[(usize, f32)],
    n_expert: usize,
    rows: &mut Vec<usize>,
    groups: &mut Vec<ExpertGroup>,
) {
    rows.clear();
    groups.clear();
    for expert in 0..n_expert {
        let start = rows.len();
        rows.extend((0..choice.len()).filter(|&r| choice[r].0 == expert));
        if rows.len() > start {
            groups.push(ExpertGroup {
                expert,
                start,
                len: rows.len() - start,
            });
        }
    }
}

/// The chosen experts' matrices and their groups of rows: each expert's products over
/// its own rows, all experts' as one pass over the pool.
struct GroupedRows<'g, 'w> {
    groups: &'g [ExpertGroup],
    views: &'g [ExpertViews<'w>],
}

impl GroupedRows<'_, '_> {
    /// `gate` and `up` (`[rows, n_ff]`) of the grouped `input` (`[rows, n_embd]`): each
    /// expert's rows quantized for gate (and again for up where up's activation type
    /// differs) into `acts` (`[gate acts | up acts]`, one per group each).
    #[allow(clippy::too_many_arguments)]
    fn gate_up(
        &self,
        input: &[f32],
        n_embd: usize,
        n_ff: usize,
        acts: &mut [QuantizedActs],
        gate: &mut [f32],
        up: &mut [f32],
        pool: &ThreadPool,
    ) -> Result<(), BlockError> {
        let (gate_acts, up_acts) = acts.split_at_mut(self.groups.len());
        for ((g, v), (ga, ua)) in self
            .groups
            .iter()
            .zip(self.views)
            .zip(gate_acts.iter_mut().zip(up_acts.iter_mut()))
        {
            let x = &input[g.start * n_embd..(g.start + g.len) * n_embd];
            ga.quantize_for_pool(&v.gate, x, g.len, pool)?;
            if !ga.fits(&v.up) {
                ua.quantize_for_pool(&v.up, x, g.len, pool)?;
            }
        }
        let mut jobs = Vec::with_capacity(2 * self.groups.len());
        let (mut gate_rest, mut up_rest) = (gate, up);
        for (i, (g, v)) in self.groups.iter().zip(self.views).enumerate() {
            let (gy, gr) = std::mem::take(&mut gate_rest).split_at_mut(g.len * n_ff);
            let (uy, ur) = std::mem::take(&mut up_rest).split_at_mut(g.len * n_ff);
            (gate_rest, up_rest) = (gr, ur);
            let up_xq = if gate_acts[i].fits(&v.up) {
                &gate_acts[i]
            } else {
                &up_acts[i]
            };
            jobs.push(MatmulJob {
                w: &v.gate,
                xq: &gate_acts[i],
                y: gy,
            });
            jobs.push(MatmulJob {
                w: &v.up,
                xq: up_xq,
                y: uy,
            });
        }
        matmul_batch_pool(&mut jobs, pool)?;
        Ok(())
    }

    /// `out` (`[rows, n_embd]`) = each expert's down projection of its rows of `hidden`
    /// (`[rows, n_ff]`), quantized into `acts` (one per group).
    fn down(
        &self,
        hidden: &[f32],
        n_ff: usize,
        n_embd: usize,
        acts: &mut [QuantizedActs],
        out: &mut [f32],
        pool: &ThreadPool,
    ) -> Result<(), BlockError> {
        for ((g, v), xq) in self.groups.iter().zip(self.views).zip(acts.iter_mut()) {
            let x = &hidden[g.start * n_ff..(g.start + g.len) * n_ff];
            xq.quantize_for_pool(&v.down, x, g.len, pool)?;
        }
        let mut jobs = Vec::with_capacity(self.groups.len());
        let mut out_rest = out;
        for ((g, v), xq) in self.groups.iter().zip(self.views).zip(acts.iter()) {
            let (oy, or) = std::mem::take(&mut out_rest).split_at_mut(g.len * n_embd);
            out_rest = or;
            jobs.push(MatmulJob {
                w: &v.down,
                xq,
                y: oy,
            });
        }
        matmul_batch_pool(&mut jobs, pool)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_best_experts_come_in_descending_order_with_normalised_weights() {
        let mut logits = vec![0.1, 2.0, -1.0, 1.5, 2.0];
        let mut out = [(0, 0.0); 3];
        let mut order = Vec::new();
        choose(&mut logits.clone(), 3, false, &mut order, &mut out);
        // A tie goes to the lower index.
        assert_eq!(out.map(|(e, _)| e), [1, 4, 3]);
        let probs = out.map(|(_, w)| w);
        choose(&mut logits, 3, true, &mut order, &mut out);
        let sum = probs.iter().map(|&w| f64::from(w)).sum::<f64>() as f32;
        for ((_, w), p) in out.iter().zip(probs) {
            assert_eq!(*w, p / sum);
        }
    }
}
