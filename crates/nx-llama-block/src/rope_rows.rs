//! RoPE over a whole batch: each position's angles are computed once per forward pass
//! (not once per layer) and the rotations of a chunk's rows are spread over the pool.
//!
//! Why: in a prefill chunk every layer used to recompute every token's sines and cosines
//! and rotate all heads on the calling thread while the other workers waited, about a
//! twentieth of Gemma 3 270M's prefill. The angles depend only on the position and the
//! layer's RoPE parameters, so layers that share parameters share them (Gemma 3 has two
//! sets, its local and global layers). Every value is the same arithmetic as
//! [`RopeTable::apply_heads`] after [`RopeTable::set_position`], so the bits do not move.

use nx_f32::{rotate_heads, RopeTable};
use nx_syscalls::ThreadPool;

use crate::layer::{BlockError, LayerConfig, Segment};

/// What a set of angles was computed for: rotated width, the bits of the base, frequency
/// scale and attention factor, YaRN's original context, and the per-pair frequency
/// factors' bits (Llama 3.1's `rope_freqs.weight`).
#[derive(Debug, Clone, PartialEq)]
struct RopeKey {
    rope_dim: usize,
    base: u32,
    freq_scale: u32,
    attn_factor: u32,
    yarn_orig_ctx: Option<usize>,
    freq_factors: Option<Vec<u32>>,
}

impl RopeKey {
    fn of(cfg: &LayerConfig, freq_factors: Option<&[f32]>) -> RopeKey {
        RopeKey {
            rope_dim: cfg.rope_dim,
            base: cfg.rope_base.to_bits(),
            freq_scale: cfg.rope_freq_scale.to_bits(),
            attn_factor: cfg.rope_attn_factor.to_bits(),
            yarn_orig_ctx: cfg.rope_yarn_orig_ctx,
            freq_factors: freq_factors.map(|f| f.iter().map(|x| x.to_bits()).collect()),
        }
    }
}

/// One parameter set's angles for the batch's positions.
#[derive(Debug)]
struct Angles {
    key: RopeKey,
    table: RopeTable,
    /// The positions `by_row` holds, one per batch row.
    positions: Vec<usize>,
    /// `[n, 2, rope_dim / 2]`: each row's cosines, then its sines.
    by_row: Vec<f32>,
}

/// Distinct parameter sets kept at once (every supported model has one or two).
const MAX_KEYS: usize = 4;

/// Batch rows below which the rotation stays on the calling thread: a decode step's
/// rows (up to sixteen streams) cost less than handing them to the pool (see
/// `nx_lazy_weight`'s `MIN_PARALLEL_QUANTIZE_ROWS`, raised with it).
const MIN_PARALLEL_ROWS: usize = 32;

/// The RoPE angles of the current batch, per parameter set (kept in [`BlockScratch`]
/// across layers).
///
/// [`BlockScratch`]: crate::BlockScratch
#[derive(Debug, Default)]
pub(crate) struct RopeRows {
    sets: Vec<Angles>,
}

impl RopeRows {
    /// Rotates every head of `q` (`[n, n_head·head_dim]`) and `k` (`[n,
    /// n_head_kv·head_dim]`), row `t` at the position the segments give it.
    pub(crate) fn apply(
        &mut self,
        cfg: &LayerConfig,
        freq_factors: Option<&[f32]>,
        q: &mut [f32],
        k: &mut [f32],
        segs: &[Segment],
        pool: &ThreadPool,
    ) -> Result<(), BlockError> {
        let angles = self.angles_for(cfg, freq_factors, segs, pool)?;
        let pairs = cfg.rope_dim / 2;
        let n = angles.positions.len();
        let (q_dim, k_dim) = (cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim);
        let by_row = &angles.by_row;
        let rotate = |x: &mut [f32], rows: std::ops::Range<usize>, dim: usize| {
            for (t, row) in rows.zip(x.chunks_exact_mut(dim)) {
                let (cos, sin) = by_row[2 * pairs * t..2 * pairs * (t + 1)].split_at(pairs);
                rotate_heads(cos, sin, row, cfg.head_dim, cfg.rope_style);
            }
        };
        if n < MIN_PARALLEL_ROWS || pool.n_threads() <= 1 {
            rotate(q, 0..n, q_dim);
            rotate(k, 0..n, k_dim);
            return Ok(());
        }
        let chunk = n.div_ceil(4 * pool.n_threads());
        let mut states = vec![(); pool.n_threads()];
        for (x, dim) in [(q, q_dim), (k, k_dim)] {
            if dim > 0 {
                pool.parallel_chunks_mut(x, dim, chunk, &mut states, |_, rows, part| {
                    rotate(part, rows, dim)
                });
            }
        }
        Ok(())
    }

    /// The angles of this layer's parameters at the batch's positions, computed when no
    /// earlier layer of this pass left them.
    fn angles_for(
        &mut self,
        cfg: &LayerConfig,
        freq_factors: Option<&[f32]>,
        segs: &[Segment],
        pool: &ThreadPool,
    ) -> Result<&Angles, BlockError> {
        let key = RopeKey::of(cfg, freq_factors);
        let at = match self.sets.iter().position(|a| a.key == key) {
            Some(at) => at,
            None => {
                if self.sets.len() >= MAX_KEYS {
                    self.sets.clear();
                }
                self.sets.push(Angles {
                    table: new_table(cfg, freq_factors)?,
                    key,
                    positions: Vec::new(),
                    by_row: Vec::new(),
                });
                self.sets.len() - 1
            }
        };
        let angles = &mut self.sets[at];
        let positions = segs.iter().flat_map(|g| g.pos..g.pos + g.n);
        if !angles.positions.iter().copied().eq(positions.clone()) {
            angles.positions.clear();
            angles.positions.extend(positions);
            fill_angles(angles, cfg.rope_dim / 2, pool);
        }
        Ok(&self.sets[at])
    }
}

/// The layer's RoPE table (base, frequency scale, attention factor, YaRN).
fn new_table(cfg: &LayerConfig, freq_factors: Option<&[f32]>) -> Result<RopeTable, BlockError> {
    RopeTable::new(cfg.rope_dim, cfg.rope_base, freq_factors)
        .and_then(|t| t.with_freq_scale(cfg.rope_freq_scale))
        .and_then(|t| t.with_attn_factor(cfg.rope_attn_factor))
        .and_then(|t| match cfg.rope_yarn_orig_ctx {
            // The reference's YaRN ramp: 32 and 1 rotations (no file sets others).
            Some(n_orig) => t.with_yarn(n_orig, cfg.rope_base, 32.0, 1.0),
            None => Ok(t),
        })
        .map_err(|e| BlockError::Rope(e.to_string()))
}

/// Computes `angles.by_row` for `angles.positions`, rows spread over the pool.
fn fill_angles(angles: &mut Angles, pairs: usize, pool: &ThreadPool) {
    let n = angles.positions.len();
    angles.by_row.resize(n * 2 * pairs, 0.0);
    let (table, positions) = (&angles.table, &angles.positions);
    let fill = |rows: std::ops::Range<usize>, part: &mut [f32]| {
        for (t, row) in rows.zip(part.chunks_exact_mut(2 * pairs)) {
            let (cos, sin) = row.split_at_mut(pairs);
            table.angles_at(positions[t], cos, sin);
        }
    };
    if n < MIN_PARALLEL_ROWS || pool.n_threads() <= 1 || pairs == 0 {
        return fill(0..n, &mut angles.by_row);
    }
    let mut states = vec![(); pool.n_threads()];
    let chunk = n.div_ceil(4 * pool.n_threads());
    pool.parallel_chunks_mut(
        &mut angles.by_row,
        2 * pairs,
        chunk,
        &mut states,
        |_, r, p| fill(r, p),
    );
}
