//! `PagedKv`: K/V rows of many sequences in fixed-size blocks from one bounded pool,
//! with reference-counted sharing, copy-on-write and a prefix cache.
//!
//! A sequence owns a [`BlockTable`]: the blocks holding its positions in order (position
//! `p` lives in block `p / block_size`, slot `p % block_size`). Blocks are
//! reference-counted: a fork ([`PagedKv::fork`]) or a prefix-cache hit shares them, and a
//! write into a shared block first copies it (copy-on-write), so no sequence ever sees
//! another's writes.
//!
//! ## Prefix cache
//! A full block whose rows are committed can be registered under a key chaining the hash
//! of its tokens with its parent block's key ([`PagedKv::register`]). A new sequence
//! whose tokens start with the same blocks gets them shared ([`PagedKv::match_prefix`]).
//! A match is verified, not trusted to the hash: the block's own tokens are compared and
//! its recorded parent must be the block matched just before (identified by id and
//! generation, which changes whenever a block is reused), so a hash collision can only
//! cost a hit, never give wrong rows. The rows are valid for any sequence with that
//! prefix because a position's K/V rows depend only on the tokens up to it (the forward
//! pass is batch-invariant). Registered blocks nobody references stay cached and are
//! evicted least-recently-used first when the pool runs out of free blocks.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::ops::Range;

use half::f16;
use nx_f32::KvElem;

use crate::segments::{KvSegments, PagedRows};
use crate::{KvDtype, KvError, KvRows, LayerWidths};

/// Index of a block in the pool.
pub type BlockId = u32;

/// One sequence's blocks and committed length.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockTable {
    blocks: Vec<BlockId>,
    len: usize,
    /// Leading blocks already registered in the prefix cache (or matched from it).
    registered: usize,
}

impl BlockTable {
    /// An empty table.
    pub fn new() -> BlockTable {
        BlockTable::default()
    }

    /// Committed positions.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` when no position is committed.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The blocks, in position order.
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }
}

#[derive(Debug, Clone)]
enum Storage {
    F16 { k: Vec<f16>, v: Vec<f16> },
    F32 { k: Vec<f32>, v: Vec<f32> },
}

/// What the prefix cache knows of a registered block.
#[derive(Debug, Clone)]
struct Registered {
    key: u64,
    tokens: Vec<u32>,
    /// The block before it in its sequence (id, generation), `None` for a first block.
    parent: Option<(BlockId, u64)>,
}

#[derive(Debug, Clone, Default)]
struct BlockMeta {
    refs: u32,
    /// Bumped whenever the block is reused for other rows.
    generation: u64,
    registered: Option<Registered>,
    /// LRU stamp while the block is cached but unreferenced.
    lru_stamp: Option<u64>,
}

/// Block counts for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolUsage {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks referenced by at least one sequence.
    pub used: usize,
    /// Blocks never used or released without a cache entry.
    pub free: usize,
    /// Unreferenced blocks kept by the prefix cache (evictable).
    pub cached: usize,
}

/// The block pool: storage for `n_blocks` blocks of `block_size` positions in every layer.
#[derive(Debug, Clone)]
pub struct PagedKv {
    block_size: usize,
    dtype: KvDtype,
    n_ctx: usize,
    widths: Vec<LayerWidths>,
    layers: Vec<Storage>,
    meta: Vec<BlockMeta>,
    free: Vec<BlockId>,
    /// Unreferenced registered blocks by LRU stamp.
    lru: BTreeMap<u64, BlockId>,
    stamp: u64,
    /// Prefix-cache index: key → block.
    index: HashMap<u64, BlockId>,
}

/// Element types whose all-zero bytes are the value 0.
///
/// # Safety
/// Every all-zero byte pattern must be a valid value of the type.
unsafe trait ZeroBits: Copy {}
// SAFETY: f32 has no invalid bit patterns; all-zero bits are +0.0.
unsafe impl ZeroBits for f32 {}
// SAFETY: f16 is a transparent u16; all-zero bits are +0.0.
unsafe impl ZeroBits for f16 {}

/// `len` zeros from the allocator's zeroed memory: a large pool is mapped lazily by the
/// OS, so the process's resident memory grows only as blocks are written, not by the
/// whole `--kv-memory` at start-up. Failure is an error, not an abort.
fn zeroed<T: ZeroBits>(len: usize) -> Result<Vec<T>, KvError> {
    let bytes = (len as u64).saturating_mul(std::mem::size_of::<T>() as u64);
    if len == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(len).map_err(|_| KvError::Allocation { bytes })?;
    // SAFETY: the layout has a non-zero size (`len > 0`, `T` is f16 or f32).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<T>();
    if ptr.is_null() {
        return Err(KvError::Allocation { bytes });
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `len` `T`s, so
    // capacity `len` matches it; all `len` elements are initialised, since all-zero bytes
    // are a valid `T` (`ZeroBits`).
    Ok(unsafe { Vec::from_raw_parts(ptr, len, len) })
}

fn block_key(parent: u64, tokens: &[u32]) -> u64 {
    // SipHash with fixed keys: the same tokens give the same key in every process.
    #[allow(deprecated)]
    let mut h = std::hash::SipHasher::new_with_keys(0x6e78_6b76, 0x7072_6566);
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl PagedKv {
    /// Bytes one block takes in every layer (K and V).
    pub fn block_bytes(widths: &[LayerWidths], block_size: usize, dtype: KvDtype) -> u64 {
        widths
            .iter()
            .map(|w| (w.k + w.v) as u64)
            .sum::<u64>()
            .saturating_mul(block_size as u64)
            .saturating_mul(dtype.size_bytes() as u64)
    }

    /// A pool of as many blocks of `block_size` positions as fit in `max_bytes`, for
    /// sequences of at most `n_ctx` positions. Fails when not even one block fits.
    pub fn new(
        widths: &[LayerWidths],
        dtype: KvDtype,
        block_size: usize,
        n_ctx: usize,
        max_bytes: u64,
    ) -> Result<PagedKv, KvError> {
        if widths.is_empty() {
            return Err(KvError::InvalidShape("no layers"));
        }
        if block_size == 0 || n_ctx == 0 {
            return Err(KvError::InvalidShape(
                "block size and n_ctx must be at least 1",
            ));
        }
        if widths.iter().any(|w| w.k == 0 || w.v == 0) {
            return Err(KvError::InvalidShape("a K or V row width is 0"));
        }
        let per_block = PagedKv::block_bytes(widths, block_size, dtype);
        let n_blocks = (max_bytes / per_block.max(1)).min(u32::MAX as u64 / 2) as usize;
        if n_blocks == 0 {
            return Err(KvError::Allocation { bytes: per_block });
        }
        if per_block.saturating_mul(n_blocks as u64) > isize::MAX as u64 {
            return Err(KvError::Allocation { bytes: max_bytes });
        }
        let mut layers = Vec::with_capacity(widths.len());
        for w in widths {
            let (k_len, v_len) = (n_blocks * block_size * w.k, n_blocks * block_size * w.v);
            layers.push(match dtype {
                KvDtype::F16 => Storage::F16 {
                    k: zeroed(k_len)?,
                    v: zeroed(v_len)?,
                },
                KvDtype::F32 => Storage::F32 {
                    k: zeroed(k_len)?,
                    v: zeroed(v_len)?,
                },
            });
        }
        Ok(PagedKv {
            block_size,
            dtype,
            n_ctx,
            widths: widths.to_vec(),
            layers,
            meta: vec![BlockMeta::default(); n_blocks],
            free: (0..n_blocks as BlockId).rev().collect(),
            lru: BTreeMap::new(),
            stamp: 0,
            index: HashMap::new(),
        })
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Most positions one sequence may hold.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Storage element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Blocks in the pool.
    pub fn n_blocks(&self) -> usize {
        self.meta.len()
    }

    /// Block counts.
    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            total: self.meta.len(),
            used: self.meta.iter().filter(|m| m.refs > 0).count(),
            free: self.free.len(),
            cached: self.lru.len(),
        }
    }

    /// Blocks that can be handed out now (free plus evictable).
    pub fn available_blocks(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks a table needs to hold `n_positions`.
    pub fn blocks_for(&self, n_positions: usize) -> usize {
        n_positions.div_ceil(self.block_size)
    }

    fn take_block(&mut self) -> Option<BlockId> {
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                // Evict the least recently used cached block.
                let (&stamp, &id) = self.lru.iter().next()?;
                self.lru.remove(&stamp);
                self.unregister(id);
                id
            }
        };
        let m = &mut self.meta[id as usize];
        m.refs = 1;
        m.generation += 1;
        m.lru_stamp = None;
        Some(id)
    }

    fn unregister(&mut self, id: BlockId) {
        if let Some(r) = self.meta[id as usize].registered.take() {
            if self.index.get(&r.key) == Some(&id) {
                self.index.remove(&r.key);
            }
        }
    }

    fn retain(&mut self, id: BlockId) {
        let m = &mut self.meta[id as usize];
        if m.refs == 0 {
            if let Some(stamp) = m.lru_stamp.take() {
                self.lru.remove(&stamp);
            }
        }
        m.refs += 1;
    }

    fn release_block(&mut self, id: BlockId) {
        let m = &mut self.meta[id as usize];
        debug_assert!(m.refs > 0, "release of an unreferenced block");
        m.refs = m.refs.saturating_sub(1);
        if m.refs > 0 {
            return;
        }
        if m.registered.is_some() {
            self.stamp += 1;
            m.lru_stamp = Some(self.stamp);
            self.lru.insert(self.stamp, id);
        } else {
            self.free.push(id);
        }
    }

    /// Copies every layer's rows of block `from` into block `to`.
    fn copy_block(&mut self, from: BlockId, to: BlockId) {
        let bs = self.block_size;
        for (layer, w) in self.layers.iter_mut().zip(&self.widths) {
            let (f, t) = (from as usize * bs, to as usize * bs);
            match layer {
                Storage::F16 { k, v } => {
                    k.copy_within(f * w.k..(f + bs) * w.k, t * w.k);
                    v.copy_within(f * w.v..(f + bs) * w.v, t * w.v);
                }
                Storage::F32 { k, v } => {
                    k.copy_within(f * w.k..(f + bs) * w.k, t * w.k);
                    v.copy_within(f * w.v..(f + bs) * w.v, t * w.v);
                }
            }
        }
    }

    /// Makes `table` ready for writing positions `table.len()..new_len`: allocates the
    /// missing blocks and gives the table its own copy of any shared (or registered)
    /// block in that range. On failure ([`KvError::OutOfBlocks`]) nothing changes.
    pub fn reserve(&mut self, table: &mut BlockTable, new_len: usize) -> Result<(), KvError> {
        if new_len > self.n_ctx {
            return Err(KvError::ContextFull {
                n_ctx: self.n_ctx,
                requested: new_len,
            });
        }
        if new_len <= table.len {
            return Ok(());
        }
        let first = table.len / self.block_size;
        let need_blocks = self.blocks_for(new_len);
        let new_blocks = need_blocks.saturating_sub(table.blocks.len());
        let copies = (first..table.blocks.len().min(need_blocks))
            .filter(|&i| {
                let m = &self.meta[table.blocks[i] as usize];
                m.refs > 1
            })
            .count();
        if new_blocks + copies > self.available_blocks() {
            return Err(KvError::OutOfBlocks {
                needed: new_blocks + copies,
                available: self.available_blocks(),
            });
        }
        for i in first..table.blocks.len().min(need_blocks) {
            let id = table.blocks[i];
            if self.meta[id as usize].refs > 1 {
                let copy = self.take_block().expect("counted above");
                self.copy_block(id, copy);
                self.release_block(id);
                table.blocks[i] = copy;
            } else if self.meta[id as usize].registered.is_some() {
                // Only this table holds it: drop the cache entry, then write in place.
                self.unregister(id);
            }
            if i < table.registered {
                table.registered = i;
            }
        }
        for _ in 0..new_blocks {
            let id = self.take_block().expect("counted above");
            table.blocks.push(id);
        }
        Ok(())
    }

    /// Commits positions up to `new_len` (rows must have been written).
    pub fn set_len(&mut self, table: &mut BlockTable, new_len: usize) -> Result<(), KvError> {
        if new_len > table.blocks.len() * self.block_size {
            return Err(KvError::NotWritten {
                layer: 0,
                requested: new_len,
                written: table.blocks.len() * self.block_size,
            });
        }
        if new_len < table.len {
            self.truncate(table, new_len);
        } else {
            table.len = new_len;
        }
        Ok(())
    }

    /// Rolls `table` back to `n` positions and frees the blocks past them.
    pub fn truncate(&mut self, table: &mut BlockTable, n: usize) {
        table.len = table.len.min(n);
        let keep = self.blocks_for(table.len);
        while table.blocks.len() > keep {
            let id = table.blocks.pop().expect("len > keep");
            self.release_block(id);
        }
        table.registered = table.registered.min(table.len / self.block_size);
    }

    /// Frees every block of `table` (finish or cancel); the table becomes empty.
    pub fn release(&mut self, table: &mut BlockTable) {
        self.truncate(table, 0);
    }

    /// A new table sharing all of `table`'s blocks (copy-on-write on the next write).
    pub fn fork(&mut self, table: &BlockTable) -> BlockTable {
        for &id in &table.blocks {
            self.retain(id);
        }
        table.clone()
    }

    /// Registers the full committed blocks of `table` in the prefix cache; `tokens` are
    /// the sequence's tokens (at least `table.len()`). A block whose prefix is already
    /// cached is replaced by the cached one (same rows, bit for bit), freeing it.
    pub fn register(&mut self, table: &mut BlockTable, tokens: &[u32]) {
        let bs = self.block_size;
        let full = table.len.min(tokens.len()) / bs;
        let mut parent_key = 0u64;
        let mut parent: Option<(BlockId, u64)> = None;
        for i in 0..full {
            let toks = &tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent_key, toks);
            let mut id = table.blocks[i];
            if i >= table.registered {
                match self.index.get(&key).copied() {
                    Some(cached) if cached != id && self.verify(cached, toks, parent) => {
                        self.retain(cached);
                        self.release_block(id);
                        table.blocks[i] = cached;
                        id = cached;
                    }
                    Some(cached) if cached == id => {}
                    Some(_) => return, // a colliding entry: keep it, stop here
                    None => {
                        self.meta[id as usize].registered = Some(Registered {
                            key,
                            tokens: toks.to_vec(),
                            parent,
                        });
                        self.index.insert(key, id);
                    }
                }
                table.registered = i + 1;
            }
            parent_key = key;
            parent = Some((id, self.meta[id as usize].generation));
        }
    }

    fn verify(&self, id: BlockId, tokens: &[u32], parent: Option<(BlockId, u64)>) -> bool {
        match &self.meta[id as usize].registered {
            Some(r) => r.tokens == tokens && r.parent == parent,
            None => false,
        }
    }

    /// The longest cached prefix of `tokens` of at most `max_len` positions, in whole
    /// blocks: a table sharing those blocks (empty when nothing matches).
    pub fn match_prefix(&mut self, tokens: &[u32], max_len: usize) -> BlockTable {
        let bs = self.block_size;
        let full = max_len.min(tokens.len()).min(self.n_ctx) / bs;
        let mut table = BlockTable::new();
        let mut parent_key = 0u64;
        let mut parent: Option<(BlockId, u64)> = None;
        for i in 0..full {
            let toks = &tokens[i * bs..(i + 1) * bs];
            let key = block_key(parent_key, toks);
            let Some(id) = self.index.get(&key).copied() else {
                break;
            };
            if !self.verify(id, toks, parent) {
                break;
            }
            self.retain(id);
            self.stamp += 1;
            table.blocks.push(id);
            parent_key = key;
            parent = Some((id, self.meta[id as usize].generation));
        }
        table.len = table.blocks.len() * bs;
        table.registered = table.blocks.len();
        table
    }

    fn layer_widths(&self, layer: usize) -> Result<LayerWidths, KvError> {
        self.widths
            .get(layer)
            .copied()
            .ok_or(KvError::LayerOutOfRange {
                layer,
                n_layers: self.widths.len(),
            })
    }

    /// Writes rows `pos..pos+n` of `layer` into `table`'s blocks (reserved and unshared:
    /// see [`PagedKv::reserve`]).
    pub fn write_rows(
        &mut self,
        table: &BlockTable,
        layer: usize,
        pos: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> Result<(), KvError> {
        let w = self.layer_widths(layer)?;
        if !k_rows.len().is_multiple_of(w.k) {
            return Err(KvError::RowWidth {
                layer,
                which: "K",
                width: w.k,
                got: k_rows.len(),
            });
        }
        if !v_rows.len().is_multiple_of(w.v) {
            return Err(KvError::RowWidth {
                layer,
                which: "V",
                width: w.v,
                got: v_rows.len(),
            });
        }
        let n = k_rows.len() / w.k;
        if v_rows.len() / w.v != n {
            return Err(KvError::RowCountMismatch {
                layer,
                k_rows: n,
                v_rows: v_rows.len() / w.v,
            });
        }
        if pos > table.len {
            return Err(KvError::Gap {
                layer,
                pos,
                written: table.len,
            });
        }
        let capacity = table.blocks.len() * self.block_size;
        if pos + n > capacity {
            return Err(KvError::ContextFull {
                n_ctx: capacity,
                requested: pos + n,
            });
        }
        let bs = self.block_size;
        for (b, run) in runs(pos..pos + n, bs) {
            let id = table.blocks[b];
            if self.meta[id as usize].refs != 1 {
                return Err(KvError::SharedBlock { block: id });
            }
            let slot0 = id as usize * bs + (run.start - b * bs);
            let src = run.start - pos..run.end - pos;
            let (ks, vs) = (
                &k_rows[src.start * w.k..src.end * w.k],
                &v_rows[src.start * w.v..src.end * w.v],
            );
            let nr = run.len();
            match &mut self.layers[layer] {
                Storage::F16 { k, v } => {
                    KvElem::store_row(&mut k[slot0 * w.k..(slot0 + nr) * w.k], ks);
                    KvElem::store_row(&mut v[slot0 * w.v..(slot0 + nr) * w.v], vs);
                }
                Storage::F32 { k, v } => {
                    k[slot0 * w.k..(slot0 + nr) * w.k].copy_from_slice(ks);
                    v[slot0 * w.v..(slot0 + nr) * w.v].copy_from_slice(vs);
                }
            }
        }
        self.prefetch_next_layer(table, layer, pos..pos + n);
        Ok(())
    }

    /// Asks for the cache lines that `rows` of `layer + 1` will be written to, so that
    /// layer's write (a forward pass later, the same slots) finds them in cache. New rows
    /// are cold memory: written on demand, each of a decode step's K/V rows cost a run of
    /// cache misses on the calling thread while the pool's workers waited (sixteen
    /// streams: about a seventh of a step's serial samples).
    fn prefetch_next_layer(&self, table: &BlockTable, layer: usize, rows: Range<usize>) {
        let (Some(storage), Ok(w)) = (self.layers.get(layer + 1), self.layer_widths(layer + 1))
        else {
            return;
        };
        let bs = self.block_size;
        for (b, run) in runs(rows, bs) {
            let Some(&id) = table.blocks.get(b) else {
                return;
            };
            let slot0 = id as usize * bs + (run.start - b * bs);
            let nr = run.len();
            match storage {
                Storage::F16 { k, v } => {
                    prefetch_lines(k.get(slot0 * w.k..(slot0 + nr) * w.k));
                    prefetch_lines(v.get(slot0 * w.v..(slot0 + nr) * w.v));
                }
                Storage::F32 { k, v } => {
                    prefetch_lines(k.get(slot0 * w.k..(slot0 + nr) * w.k));
                    prefetch_lines(v.get(slot0 * w.v..(slot0 + nr) * w.v));
                }
            }
        }
    }

    /// Copies rows `rows` of `layer` from `table`'s blocks into `k_dst` / `v_dst` as f32.
    pub fn gather_f32(
        &self,
        table: &BlockTable,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f32],
        v_dst: &mut [f32],
    ) -> Result<(), KvError> {
        let w = self.layer_widths(layer)?;
        self.check_gather(table, layer, &rows, (k_dst.len(), v_dst.len()))?;
        let first = rows.start;
        self.walk_runs(table, layer, rows, |ks, vs, run| {
            let (d0, nr) = (run.start - first, run.len());
            crate::segments::rows_to_f32(ks, 0..nr, &mut k_dst[d0 * w.k..(d0 + nr) * w.k]);
            crate::segments::rows_to_f32(vs, 0..nr, &mut v_dst[d0 * w.v..(d0 + nr) * w.v]);
        })
    }

    /// Copies rows `rows` of `layer` from `table`'s blocks into `k_dst` / `v_dst` as they
    /// are stored (f16 storage only: a single-token query reads each row once, so
    /// widening it beforehand would only add a pass).
    pub fn gather_f16(
        &self,
        table: &BlockTable,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f16],
        v_dst: &mut [f16],
    ) -> Result<(), KvError> {
        if self.dtype() != KvDtype::F16 {
            return Err(KvError::InvalidShape("f16 gather from an f32 cache"));
        }
        let w = self.layer_widths(layer)?;
        self.check_gather(table, layer, &rows, (k_dst.len(), v_dst.len()))?;
        let first = rows.start;
        self.walk_runs(table, layer, rows, |ks, vs, run| {
            let (d0, nr) = (run.start - first, run.len());
            if let (KvRows::F16 { data: kd, .. }, KvRows::F16 { data: vd, .. }) = (ks, vs) {
                k_dst[d0 * w.k..(d0 + nr) * w.k].copy_from_slice(kd);
                v_dst[d0 * w.v..(d0 + nr) * w.v].copy_from_slice(vd);
            }
        })
    }

    /// Rows `0..end` of `layer` of `table` in place (`None` when `end` passes the
    /// table's blocks or the layer does not exist).
    pub fn paged_rows<'a>(
        &'a self,
        table: &'a BlockTable,
        layer: usize,
        end: usize,
    ) -> Option<PagedRows<'a>> {
        let w = self.layer_widths(layer).ok()?;
        if end > table.blocks.len() * self.block_size {
            return None;
        }
        let (keys, values) = match self.layers.get(layer)? {
            Storage::F16 { k, v } => (
                KvRows::F16 {
                    data: k,
                    width: w.k,
                },
                KvRows::F16 {
                    data: v,
                    width: w.v,
                },
            ),
            Storage::F32 { k, v } => (
                KvRows::F32 {
                    data: k,
                    width: w.k,
                },
                KvRows::F32 {
                    data: v,
                    width: w.v,
                },
            ),
        };
        Some(PagedRows {
            keys,
            values,
            blocks: &table.blocks,
            block_size: self.block_size,
        })
    }

    /// Checks a gather of `rows` into destinations of `dst_lens` values (K, V).
    fn check_gather(
        &self,
        table: &BlockTable,
        layer: usize,
        rows: &Range<usize>,
        dst_lens: (usize, usize),
    ) -> Result<(), KvError> {
        let w = self.layer_widths(layer)?;
        let capacity = table.blocks.len() * self.block_size;
        if rows.start > rows.end || rows.end > capacity {
            return Err(KvError::NotWritten {
                layer,
                requested: rows.end,
                written: capacity,
            });
        }
        if dst_lens != (rows.len() * w.k, rows.len() * w.v) {
            return Err(KvError::InvalidShape(
                "gather destination has the wrong length",
            ));
        }
        Ok(())
    }

    /// Calls `copy` with the stored K and V rows of each run of `rows` that lies in one
    /// block of `table` (rows checked by [`Self::check_gather`]), in order.
    fn walk_runs(
        &self,
        table: &BlockTable,
        layer: usize,
        rows: Range<usize>,
        mut copy: impl FnMut(KvRows<'_>, KvRows<'_>, Range<usize>),
    ) -> Result<(), KvError> {
        let w = self.layer_widths(layer)?;
        let bs = self.block_size;
        for (b, run) in runs(rows, bs) {
            let id = table.blocks[b] as usize;
            let slot0 = id * bs + (run.start - b * bs);
            let nr = run.len();
            let (ks, vs) = match &self.layers[layer] {
                Storage::F16 { k, v } => (
                    KvRows::F16 {
                        data: &k[slot0 * w.k..(slot0 + nr) * w.k],
                        width: w.k,
                    },
                    KvRows::F16 {
                        data: &v[slot0 * w.v..(slot0 + nr) * w.v],
                        width: w.v,
                    },
                ),
                Storage::F32 { k, v } => (
                    KvRows::F32 {
                        data: &k[slot0 * w.k..(slot0 + nr) * w.k],
                        width: w.k,
                    },
                    KvRows::F32 {
                        data: &v[slot0 * w.v..(slot0 + nr) * w.v],
                        width: w.v,
                    },
                ),
            };
            copy(ks, vs, run);
        }
        Ok(())
    }
}

/// A prefetch of every cache line of `rows` (nothing for `None`, or where the target has
/// no prefetch instruction).
fn prefetch_lines<T>(rows: Option<&[T]>) {
    let Some(rows) = rows else {
        return;
    };
    #[cfg(target_arch = "x86_64")]
    {
        let (p, bytes) = (rows.as_ptr() as *const i8, std::mem::size_of_val(rows));
        for at in (0..bytes).step_by(64) {
            // SAFETY: a prefetch is a hint that reads nothing and cannot fault (SSE,
            // baseline on x86_64); `at` lies inside `rows`.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.add(at))
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = rows;
}

/// Splits `rows` at block boundaries: `(block index, rows in it)`.
fn runs(rows: Range<usize>, bs: usize) -> impl Iterator<Item = (usize, Range<usize>)> {
    let mut at = rows.start;
    std::iter::from_fn(move || {
        if at >= rows.end {
            return None;
        }
        let b = at / bs;
        let end = ((b + 1) * bs).min(rows.end);
        let r = (b, at..end);
        at = end;
        Some(r)
    })
}

/// The sequences of one batched forward pass over a [`PagedKv`]: segment `i` is
/// `tables[i]`, whose blocks must be reserved for the segment's new tokens.
pub struct PagedBatch<'a> {
    /// The pool.
    pub pool: &'a mut PagedKv,
    /// One table per batch segment.
    pub tables: Vec<&'a mut BlockTable>,
}

impl PagedBatch<'_> {
    fn table(&self, seg: usize) -> Result<&BlockTable, KvError> {
        self.tables
            .get(seg)
            .map(|t| &**t)
            .ok_or(KvError::InvalidShape("segment index out of range"))
    }
}

impl KvSegments for PagedBatch<'_> {
    fn n_ctx(&self) -> usize {
        self.pool.n_ctx
    }

    fn dtype(&self) -> KvDtype {
        self.pool.dtype
    }

    fn n_segments(&self) -> usize {
        self.tables.len()
    }

    fn len(&self, seg: usize) -> Result<usize, KvError> {
        Ok(self.table(seg)?.len)
    }

    fn ensure_room(&self, seg: usize, n_new: usize) -> Result<(), KvError> {
        let t = self.table(seg)?;
        let requested = t.len.saturating_add(n_new);
        let capacity = t.blocks.len() * self.pool.block_size;
        if requested > capacity.min(self.pool.n_ctx) {
            return Err(KvError::ContextFull {
                n_ctx: capacity.min(self.pool.n_ctx),
                requested,
            });
        }
        Ok(())
    }

    fn write_rows(
        &mut self,
        seg: usize,
        layer: usize,
        pos: usize,
        k_rows: &[f32],
        v_rows: &[f32],
    ) -> Result<(), KvError> {
        let table = self
            .tables
            .get(seg)
            .ok_or(KvError::InvalidShape("segment index out of range"))?;
        self.pool.write_rows(table, layer, pos, k_rows, v_rows)
    }

    fn paged(&self, seg: usize, layer: usize, end: usize) -> Option<PagedRows<'_>> {
        let table = self.table(seg).ok()?;
        self.pool.paged_rows(table, layer, end)
    }

    fn gather_f32(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f32],
        v_dst: &mut [f32],
    ) -> Result<(), KvError> {
        self.pool
            .gather_f32(self.table(seg)?, layer, rows, k_dst, v_dst)
    }

    fn gather_f16(
        &self,
        seg: usize,
        layer: usize,
        rows: Range<usize>,
        k_dst: &mut [f16],
        v_dst: &mut [f16],
    ) -> Result<(), KvError> {
        self.pool
            .gather_f16(self.table(seg)?, layer, rows, k_dst, v_dst)
    }

    fn commit(&mut self, seg: usize, n_new: usize) -> Result<(), KvError> {
        let table = self
            .tables
            .get_mut(seg)
            .ok_or(KvError::InvalidShape("segment index out of range"))?;
        let new_len = table.len + n_new;
        self.pool.set_len(table, new_len)
    }

    fn rollback(&mut self, _seg: usize) {
        // Rows past `len` are never read before they are written again.
    }
}
