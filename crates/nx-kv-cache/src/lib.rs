//! Per-layer K/V row storage (f32 or f16) with truncate and rollback.
//!
//! One [`KvCache`] holds, for every layer, a K matrix and a V matrix of `n_ctx` rows;
//! row `p` is the key (value) vector of the token at position `p`, all KV heads side by
//! side (`n_kv_heads·head_dim` values, which may differ per layer and between K and V).
//! Storage is allocated once, at construction; nothing here computes attention.
//!
//! ## Positions: written vs committed
//! - **Written** (`written(layer)`): rows `0..written` of a layer hold data. A write at
//!   `pos` needs `pos <= written(layer)` (no gaps) and `pos < n_ctx`.
//! - **Committed** ([`KvCache::len`]): positions `0..len` are part of the sequence in
//!   every layer. The runner writes a chunk's rows into every layer during the forward
//!   pass (a block reads its own layer's freshly written rows, `0..pos+1`, for causal
//!   attention), then calls [`KvCache::advance`] / [`KvCache::set_len`] to commit
//!   them; committing needs every layer to have written them.
//! - [`KvCache::truncate`] rolls both back (rejected draft tokens, edited history).
//!
//! Reads ([`KvCache::keys`], [`KvCache::values`]) cover rows `0..n` of one layer with
//! `n <= written(layer)`, as typed slices ([`KvRows`]) so attention reads f16 directly.
//! Every failure is a [`KvError`]; nothing here panics on a bad request.
//!
//! Many sequences share one bounded pool of fixed-size blocks in [`PagedKv`] (block
//! tables, reference counts, copy-on-write, prefix cache); a batched forward pass reaches
//! either kind of storage through [`KvSegments`].

use half::f16;
use nx_f32::KvElem;

mod paged;
mod segments;

pub use paged::{BlockId, BlockTable, PagedBatch, PagedKv, PoolUsage};
pub use segments::{KvSegments, PagedRows};

/// Storage element type of a cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// IEEE half precision (llama.cpp's default `--cache-type-k/v f16`).
    F16,
    /// Full f32.
    F32,
}

impl KvDtype {
    /// Bytes per stored element.
    pub fn size_bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    /// Lower-case name (`"f16"`, `"f32"`).
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
        }
    }
}

/// Row widths of one layer: `n_kv_heads·head_dim` for K and for V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerWidths {
    /// Values per K row.
    pub k: usize,
    /// Values per V row.
    pub v: usize,
}

impl LayerWidths {
    /// The same width for K and V (every supported architecture).
    pub fn uniform(width: usize) -> LayerWidths {
        LayerWidths { k: width, v: width }
    }
}

/// Why a cache operation was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// The request needs more positions than the context holds.
    #[error("context full: {requested} positions requested, the context holds {n_ctx}")]
    ContextFull {
        /// Capacity in positions.
        n_ctx: usize,
        /// Positions the request would need (e.g. `pos + 1` for a write at `pos`).
        requested: usize,
    },
    /// Layer index out of range.
    #[error("layer {layer} out of range (the cache has {n_layers} layers)")]
    LayerOutOfRange {
        /// Requested layer.
        layer: usize,
        /// Layers in the cache.
        n_layers: usize,
    },
    /// A K or V row (or block of rows) has the wrong length.
    #[error("layer {layer}: {which} rows of {got} values do not fit width {width}")]
    RowWidth {
        /// Layer written.
        layer: usize,
        /// `"K"` or `"V"`.
        which: &'static str,
        /// The layer's row width.
        width: usize,
        /// Values supplied.
        got: usize,
    },
    /// K and V blocks describe different numbers of rows.
    #[error("layer {layer}: {k_rows} K rows but {v_rows} V rows")]
    RowCountMismatch {
        /// Layer written.
        layer: usize,
        /// Rows in the K block.
        k_rows: usize,
        /// Rows in the V block.
        v_rows: usize,
    },
    /// A write would leave unwritten rows below it.
    #[error("layer {layer}: write at position {pos} leaves a gap (rows 0..{written} written)")]
    Gap {
        /// Layer written.
        layer: usize,
        /// First position of the write.
        pos: usize,
        /// Rows already written in that layer.
        written: usize,
    },
    /// A read or commit covers rows a layer has not written.
    #[error("layer {layer}: rows 0..{requested} requested but only 0..{written} are written")]
    NotWritten {
        /// Layer concerned.
        layer: usize,
        /// Rows requested.
        requested: usize,
        /// Rows written.
        written: usize,
    },
    /// The cache geometry is unusable (zero context, zero width, no layers).
    #[error("invalid cache shape: {0}")]
    InvalidShape(&'static str),
    /// The block pool has fewer free blocks than a reservation needs.
    #[error("KV block pool exhausted: {needed} blocks needed, {available} available")]
    OutOfBlocks {
        /// Blocks the reservation needs.
        needed: usize,
        /// Blocks free or evictable.
        available: usize,
    },
    /// A write was aimed at a block another sequence shares (reserve it first).
    #[error("KV block {block} is shared and cannot be written in place")]
    SharedBlock {
        /// The block.
        block: u32,
    },
    /// The total size overflows or the allocation failed.
    #[error("cannot allocate the KV cache: {bytes} bytes requested")]
    Allocation {
        /// Bytes that were requested (saturated at `u64::MAX` on overflow).
        bytes: u64,
    },
}

/// Rows of one layer's K or V matrix, typed by the storage element.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// f16 storage: `data.len() == n_rows·width`.
    F16 {
        /// Row-major values.
        data: &'a [f16],
        /// Values per row.
        width: usize,
    },
    /// f32 storage: `data.len() == n_rows·width`.
    F32 {
        /// Row-major values.
        data: &'a [f32],
        /// Values per row.
        width: usize,
    },
}

impl<'a> KvRows<'a> {
    /// Values per row.
    pub fn width(&self) -> usize {
        match *self {
            KvRows::F16 { width, .. } | KvRows::F32 { width, .. } => width,
        }
    }

    /// Number of rows.
    pub fn n_rows(&self) -> usize {
        match *self {
            KvRows::F16 { data, width } => data.len() / width.max(1),
            KvRows::F32 { data, width } => data.len() / width.max(1),
        }
    }

    /// The storage type.
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvRows::F16 { .. } => KvDtype::F16,
            KvRows::F32 { .. } => KvDtype::F32,
        }
    }

    /// Copies row `j` into `dst` as f32 (`dst.len() == width`). `false` (and `dst`
    /// untouched) if `j` is out of range or `dst` has the wrong length.
    pub fn row_to_f32(&self, j: usize, dst: &mut [f32]) -> bool {
        let width = self.width();
        if j >= self.n_rows() || dst.len() != width {
            return false;
        }
        match *self {
            KvRows::F16 { data, .. } => {
                nx_f32::f16_to_f32_row(&data[j * width..(j + 1) * width], dst)
            }
            KvRows::F32 { data, .. } => dst.copy_from_slice(&data[j * width..(j + 1) * width]),
        }
        true
    }
}

/// One layer's matrices.
#[derive(Debug, Clone)]
enum Storage {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

#[derive(Debug, Clone)]
struct Layer {
    widths: LayerWidths,
    written: usize,
    storage: Storage,
}

/// Allocates `len` zeroed elements, reporting failure instead of aborting.
fn zeroed<T: Clone>(len: usize, zero: T, elem_bytes: usize) -> Result<Vec<T>, KvError> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|_| KvError::Allocation {
        bytes: (len as u64).saturating_mul(elem_bytes as u64),
    })?;
    v.resize(len, zero);
    Ok(v)
}

/// K/V storage for every layer of one sequence.
#[derive(Debug, Clone)]
pub struct KvCache {
    n_ctx: usize,
    dtype: KvDtype,
    len: usize,
    layers: Vec<Layer>,
}

impl KvCache {
    /// A cache of `n_layers` layers whose K and V rows are all `kv_width` values wide
    /// (`n_kv_heads·head_dim`), `n_ctx` positions, stored as `dtype`.
    pub fn new(
        n_layers: usize,
        n_ctx: usize,
        kv_width: usize,
        dtype: KvDtype,
    ) -> Result<KvCache, KvError> {
        let widths = vec![LayerWidths::uniform(kv_width); n_layers];
        KvCache::with_layer_widths(n_ctx, &widths, dtype)
    }

    /// A cache with per-layer (and per-matrix) row widths, one entry per layer.
    pub fn with_layer_widths(
        n_ctx: usize,
        widths: &[LayerWidths],
        dtype: KvDtype,
    ) -> Result<KvCache, KvError> {
        if widths.is_empty() {
            return Err(KvError::InvalidShape("no layers"));
        }
        if n_ctx == 0 {
            return Err(KvError::InvalidShape("n_ctx is 0"));
        }
        if widths.iter().any(|w| w.k == 0 || w.v == 0) {
            return Err(KvError::InvalidShape("a K or V row width is 0"));
        }
        // Check the whole size first so an impossible request fails before allocating.
        let elem = dtype.size_bytes() as u64;
        let mut total: u64 = 0;
        for w in widths {
            let per_layer = (w.k as u64)
                .checked_add(w.v as u64)
                .and_then(|x| x.checked_mul(n_ctx as u64))
                .and_then(|x| x.checked_mul(elem));
            total = per_layer
                .and_then(|x| total.checked_add(x))
                .ok_or(KvError::Allocation { bytes: u64::MAX })?;
        }
        if total > isize::MAX as u64 {
            return Err(KvError::Allocation { bytes: total });
        }
        let mut layers = Vec::with_capacity(widths.len());
        for &w in widths {
            // Sizes fit in isize (checked above), so these products cannot overflow.
            let (k_len, v_len) = (w.k * n_ctx, w.v * n_ctx);
            let storage = match dtype {
                KvDtype::F16 => Storage::F16 {
                    k: zeroed(k_len, f16::ZERO, 2)?,
                    v: zeroed(v_len, f16::ZERO, 2)?,
                },
                KvDtype::F32 => Storage::F32 {
                    k: zeroed(k_len, 0.0f32, 4)?,
                    v: zeroed(v_len, 0.0f32, 4)?,
                },
            };
            layers.push(Layer {
                widths: w,
                written: 0,
                storage,
            });
        }
        Ok(KvCache {
            n_ctx,
            dtype,
            len: 0,
            layers,
        })
    }

    /// Capacity in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Number of layers.
    pub fn n_layers(&self) -> usize {
        self.layers.len()
    }

    /// Storage element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Committed positions: `0..len()` belong to the sequence in every layer.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when no position is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions still free after the committed ones (`n_ctx − len`).
    pub fn remaining(&self) -> usize {
        self.n_ctx - self.len
    }

    /// Row widths of `layer`.
    pub fn layer_widths(&self, layer: usize) -> Result<LayerWidths, KvError> {
        Ok(self.layer(layer)?.widths)
    }

    /// Rows `0..written(layer)` of `layer` hold data (committed or not).
    pub fn written(&self, layer: usize) -> Result<usize, KvError> {
        Ok(self.layer(layer)?.written)
    }

    /// Checks that `n_new` more positions fit after the committed ones, so the runner
    /// can refuse a chunk before computing it.
    pub fn ensure_room(&self, n_new: usize) -> Result<(), KvError> {
        let requested = self.len.saturating_add(n_new);
        if requested > self.n_ctx {
            return Err(KvError::ContextFull {
                n_ctx: self.n_ctx,
                requested,
            });
        }
        Ok(())
    }

    fn layer(&self, layer: usize) -> Result<&Layer, KvError> {
        self.layers.get(layer).ok_or(KvError::LayerOutOfRange {
            layer,
            n_layers: self.layers.len(),
        })
    }

    /// Stores the K and V rows of position `pos` in `layer`, converting to the storage
    /// type. Needs `pos < n_ctx`, `pos <= written(layer)` (rewriting an already written
    /// row is allowed) and rows of exactly the layer's widths.
    pub fn write(
        &mut self,
        layer: usize,
        pos: usize,
        k_row: &[f32],
        v_row: &[f32],
    ) -> Result<(), KvError> {
        self.write_rows(layer, pos, k_row, v_row)
    }

    /// Stores consecutive rows for positions `pos..pos+n` of `layer`, where `k_rows`
    /// holds `n` K rows and `v_rows` `n` V rows, row-major. Same rules as
    /// [`KvCache::write`]; an empty block is a no-op (after the checks).
    pub fn write_rows(
        &mut self,
        layer: usize,
        pos: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> Result<(), KvError> {
        let n_ctx = self.n_ctx;
        let n_layers = self.layers.len();
        let l = self
            .layers
            .get_mut(layer)
            .ok_or(KvError::LayerOutOfRange { layer, n_layers })?;
        let LayerWidths { k: kw, v: vw } = l.widths;
        if !k_rows.len().is_multiple_of(kw) {
            return Err(KvError::RowWidth {
                layer,
                which: "K",
                width: kw,
                got: k_rows.len(),
            });
        }
        if !v_rows.len().is_multiple_of(vw) {
            return Err(KvError::RowWidth {
                layer,
                which: "V",
                width: vw,
                got: v_rows.len(),
            });
        }
        let n = k_rows.len() / kw;
        if v_rows.len() / vw != n {
            return Err(KvError::RowCountMismatch {
                layer,
                k_rows: n,
                v_rows: v_rows.len() / vw,
            });
        }
        let end = pos.checked_add(n).ok_or(KvError::ContextFull {
            n_ctx,
            requested: usize::MAX,
        })?;
        // A zero-row write still must name a valid position.
        let requested = end.max(pos.saturating_add(1));
        if requested > n_ctx {
            return Err(KvError::ContextFull { n_ctx, requested });
        }
        if pos > l.written {
            return Err(KvError::Gap {
                layer,
                pos,
                written: l.written,
            });
        }
        match &mut l.storage {
            Storage::F16 { k, v } => {
                KvElem::store_row(&mut k[pos * kw..end * kw], k_rows);
                KvElem::store_row(&mut v[pos * vw..end * vw], v_rows);
            }
            Storage::F32 { k, v } => {
                k[pos * kw..end * kw].copy_from_slice(k_rows);
                v[pos * vw..end * vw].copy_from_slice(v_rows);
            }
        }
        l.written = l.written.max(end);
        Ok(())
    }

    /// K rows `0..n_rows` of `layer` (`n_rows <= written(layer)`).
    pub fn keys(&self, layer: usize, n_rows: usize) -> Result<KvRows<'_>, KvError> {
        self.rows(layer, n_rows, true)
    }

    /// V rows `0..n_rows` of `layer` (`n_rows <= written(layer)`).
    pub fn values(&self, layer: usize, n_rows: usize) -> Result<KvRows<'_>, KvError> {
        self.rows(layer, n_rows, false)
    }

    /// K and V rows `0..n_rows` of `layer` together.
    pub fn layer_rows(
        &self,
        layer: usize,
        n_rows: usize,
    ) -> Result<(KvRows<'_>, KvRows<'_>), KvError> {
        Ok((
            self.rows(layer, n_rows, true)?,
            self.rows(layer, n_rows, false)?,
        ))
    }

    fn rows(&self, layer: usize, n_rows: usize, keys: bool) -> Result<KvRows<'_>, KvError> {
        let l = self.layer(layer)?;
        if n_rows > l.written {
            return Err(KvError::NotWritten {
                layer,
                requested: n_rows,
                written: l.written,
            });
        }
        let width = if keys { l.widths.k } else { l.widths.v };
        let end = n_rows * width;
        Ok(match &l.storage {
            Storage::F16 { k, v } => KvRows::F16 {
                data: if keys { &k[..end] } else { &v[..end] },
                width,
            },
            Storage::F32 { k, v } => KvRows::F32 {
                data: if keys { &k[..end] } else { &v[..end] },
                width,
            },
        })
    }

    /// Commits positions `0..new_len`. Growing needs every layer to have written
    /// `new_len` rows; shrinking is the same as [`KvCache::truncate`]; the current
    /// length is a no-op (uncommitted written rows are kept).
    pub fn set_len(&mut self, new_len: usize) -> Result<(), KvError> {
        if new_len > self.n_ctx {
            return Err(KvError::ContextFull {
                n_ctx: self.n_ctx,
                requested: new_len,
            });
        }
        if new_len == self.len {
            // Not a rollback: rows written past `len` stay written.
            return Ok(());
        }
        if new_len < self.len {
            self.truncate(new_len);
            return Ok(());
        }
        if let Some((layer, l)) = self
            .layers
            .iter()
            .enumerate()
            .find(|(_, l)| l.written < new_len)
        {
            return Err(KvError::NotWritten {
                layer,
                requested: new_len,
                written: l.written,
            });
        }
        self.len = new_len;
        Ok(())
    }

    /// Commits `n_new` more positions (`set_len(len + n_new)`).
    pub fn advance(&mut self, n_new: usize) -> Result<(), KvError> {
        let new_len = self.len.checked_add(n_new).ok_or(KvError::ContextFull {
            n_ctx: self.n_ctx,
            requested: usize::MAX,
        })?;
        self.set_len(new_len)
    }

    /// Rolls back to `n` positions: `len` and every layer's written rows become at most
    /// `n`. Larger `n` than the current length changes nothing. Stored values are not
    /// cleared (they are unreachable until rewritten).
    pub fn truncate(&mut self, n: usize) {
        self.len = self.len.min(n);
        for l in &mut self.layers {
            l.written = l.written.min(n);
        }
    }

    /// Forgets every position (`truncate(0)`); the allocation is kept.
    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// Bytes of storage holding committed positions (all layers, K and V).
    pub fn bytes_used(&self) -> u64 {
        let elem = self.dtype.size_bytes() as u64;
        self.layers
            .iter()
            .map(|l| (l.widths.k + l.widths.v) as u64 * self.len as u64 * elem)
            .sum()
    }

    /// Bytes of storage allocated (all layers, K and V, `n_ctx` positions).
    pub fn bytes_allocated(&self) -> u64 {
        let elem = self.dtype.size_bytes() as u64;
        self.layers
            .iter()
            .map(|l| (l.widths.k + l.widths.v) as u64 * self.n_ctx as u64 * elem)
            .sum()
    }
}
