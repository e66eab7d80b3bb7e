//! `KvSegments`: how a batched forward pass reaches the K/V rows of each sequence in it.

use std::ops::Range;

use half::f16;

use crate::{KvCache, KvDtype, KvError, KvRows};

/// The K/V storage a batched forward pass writes and reads: one sequence per batch
/// segment (`seg` is the segment's index in the batch).
///
/// A segment's rows `0..len(seg)` are committed; the forward pass writes the rows of its
/// new tokens (`len..len+n`, after [`KvSegments::ensure_room`]), reads rows up to
/// `len + n` of the layer it is in, and commits them with [`KvSegments::commit`] at the
/// end. Implemented by the one-sequence [`KvCache`] and by [`crate::PagedBatch`].
pub trait KvSegments: Sync {
    /// Storage element type (the same for every segment).
    fn dtype(&self) -> KvDtype;
    /// Number of segments.
    fn n_segments(&self) -> usize;
    /// Most positions one sequence may hold: the context the model runs at (LongRoPE
    /// models choose their frequency factors by it, as the reference does).
    fn n_ctx(&self) -> usize;
    /// Committed positions of segment `seg`.
    fn len(&self, seg: usize) -> Result<usize, KvError>;
    /// Checks that `n_new` rows can be written after the committed ones.
    fn ensure_room(&self, seg: usize, n_new: usize) -> Result<(), KvError>;
    /// Stores the rows of positions `pos..pos+n` of `layer` (`k_rows`, `v_rows`
    /// row-major, converted to the storage type).
    fn write_rows(
        &mut self,
        seg: usize,
        layer: usize,
        pos: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> Result<(), KvError>;
    /// Rows `0..end` of `layer` as borrowed slices, when the storage is contiguous.
    fn contiguous(
        &self,
        _seg: usize,
        _layer: usize,
        _end: usize,
    ) -> Option<(KvRows<'_>, KvRows<'_>)> {
        None
    }
    /// Rows `0..end` of `layer` in place, when the storage is a block pool: the layer's
    /// whole K and V pools and the segment's block table (see [`PagedRows`]).
    fn paged(&self, _seg: usize, _layer: usize, _end: usize) -> Option<PagedRows<'_>> {
        None
    }
    /// Copies rows `rows` of `layer` into `k_dst` / `v_dst` as f32 (f16 widened
    /// exactly), `rows.len()` rows of the layer's widths each.
    fn gather_f32(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f32],
        v_dst: &mut [f32],
    ) -> Result<(), KvError>;
    /// Copies rows `rows` of `layer` into `k_dst` / `v_dst` as stored, for f16 storage
    /// (an error for f32 storage), `rows.len()` rows of the layer's widths each.
    fn gather_f16(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f16],
        v_dst: &mut [f16],
    ) -> Result<(), KvError>;
    /// Commits `n_new` written positions of segment `seg`.
    fn commit(&mut self, seg: usize, n_new: usize) -> Result<(), KvError>;
    /// Forgets rows written past the committed ones (after a failed forward pass).
    fn rollback(&mut self, seg: usize);
}

/// One segment's rows of one layer in a block pool: position `p` is pool row
/// `blocks[p / block_size]·block_size + p % block_size` of `keys` and `values` (each the
/// layer's whole pool, rows of the layer's widths).
#[derive(Debug, Clone, Copy)]
pub struct PagedRows<'a> {
    /// The layer's K pool.
    pub keys: KvRows<'a>,
    /// The layer's V pool.
    pub values: KvRows<'a>,
    /// The segment's blocks in position order (at least the ones rows `0..end` reach).
    pub blocks: &'a [u32],
    /// Positions per block.
    pub block_size: usize,
}

fn only_segment_zero(seg: usize) -> Result<(), KvError> {
    if seg != 0 {
        return Err(KvError::InvalidShape("a KvCache holds one segment"));
    }
    Ok(())
}

/// Widens (or copies) rows of `src` into `dst`.
pub(crate) fn rows_to_f32(src: KvRows<'_>, rows: Range<usize>, dst: &mut [f32]) -> bool {
    let width = src.width();
    if rows.end > src.n_rows() || rows.start > rows.end || dst.len() != rows.len() * width {
        return false;
    }
    match src {
        KvRows::F16 { data, .. } => {
            let s: &[f16] = &data[rows.start * width..rows.end * width];
            nx_f32::f16_to_f32_row(s, dst);
        }
        KvRows::F32 { data, .. } => {
            dst.copy_from_slice(&data[rows.start * width..rows.end * width])
        }
    }
    true
}

impl KvSegments for KvCache {
    fn n_ctx(&self) -> usize {
        KvCache::n_ctx(self)
    }

    fn dtype(&self) -> KvDtype {
        KvCache::dtype(self)
    }

    fn n_segments(&self) -> usize {
        1
    }

    fn len(&self, seg: usize) -> Result<usize, KvError> {
        only_segment_zero(seg)?;
        Ok(KvCache::len(self))
    }

    fn ensure_room(&self, seg: usize, n_new: usize) -> Result<(), KvError> {
        only_segment_zero(seg)?;
        KvCache::ensure_room(self, n_new)
    }

    fn write_rows(
        &mut self,
        seg: usize,
        layer: usize,
        pos: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> Result<(), KvError> {
        only_segment_zero(seg)?;
        KvCache::write_rows(self, layer, pos, k_rows, v_rows)
    }

    fn contiguous(&self, seg: usize, layer: usize, end: usize) -> Option<(KvRows<'_>, KvRows<'_>)> {
        if seg != 0 {
            return None;
        }
        self.layer_rows(layer, end).ok()
    }

    fn gather_f32(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f32],
        v_dst: &mut [f32],
    ) -> Result<(), KvError> {
        only_segment_zero(seg)?;
        let (k, v) = self.layer_rows(layer, rows.end)?;
        if !rows_to_f32(k, rows.clone(), k_dst) || !rows_to_f32(v, rows, v_dst) {
            return Err(KvError::InvalidShape(
                "gather destination has the wrong length",
            ));
        }
        Ok(())
    }

    fn gather_f16(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f16],
        v_dst: &mut [f16],
    ) -> Result<(), KvError> {
        only_segment_zero(seg)?;
        let (k, v) = self.layer_rows(layer, rows.end)?;
        let (
            KvRows::F16 {
                data: kd,
                width: kw,
            },
            KvRows::F16 {
                data: vd,
                width: vw,
            },
        ) = (k, v)
        else {
            return Err(KvError::InvalidShape("f16 gather from an f32 cache"));
        };
        if rows.start > rows.end || k_dst.len() != rows.len() * kw || v_dst.len() != rows.len() * vw
        {
            return Err(KvError::InvalidShape(
                "gather destination has the wrong length",
            ));
        }
        k_dst.copy_from_slice(&kd[rows.start * kw..rows.end * kw]);
        v_dst.copy_from_slice(&vd[rows.start * vw..rows.end * vw]);
        Ok(())
    }

    fn commit(&mut self, seg: usize, n_new: usize) -> Result<(), KvError> {
        only_segment_zero(seg)?;
        self.advance(n_new)
    }

    fn rollback(&mut self, _seg: usize) {
        let len = KvCache::len(self);
        self.truncate(len);
    }
}
