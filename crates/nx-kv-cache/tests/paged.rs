//! The paged pool: block tables, reference counts, copy-on-write, the prefix cache and
//! its eviction, and rows read back exactly as written.

use nx_kv_cache::{BlockTable, KvDtype, KvError, LayerWidths, PagedKv};

const BS: usize = 4;

fn pool(n_blocks: usize, dtype: KvDtype) -> PagedKv {
    let widths = [LayerWidths { k: 3, v: 2 }, LayerWidths { k: 3, v: 2 }];
    let bytes = PagedKv::block_bytes(&widths, BS, dtype) * n_blocks as u64;
    PagedKv::new(&widths, dtype, BS, 64, bytes).unwrap()
}

/// Distinct, exactly representable values for position `p` of sequence `s`.
fn row(s: u32, p: usize, width: usize, which: u32) -> Vec<f32> {
    (0..width)
        .map(|c| ((s * 37 + p as u32 * 10 + c as u32 + which * 7) % 500) as f32 / 8.0)
        .collect()
}

fn write(pool: &mut PagedKv, t: &mut BlockTable, s: u32, from: usize, to: usize) {
    pool.reserve(t, to).unwrap();
    for layer in 0..2 {
        let k: Vec<f32> = (from..to).flat_map(|p| row(s, p, 3, layer)).collect();
        let v: Vec<f32> = (from..to).flat_map(|p| row(s, p, 2, layer + 1)).collect();
        pool.write_rows(t, layer as usize, from, &k, &v).unwrap();
    }
    pool.set_len(t, to).unwrap();
}

fn read(
    pool: &PagedKv,
    t: &BlockTable,
    layer: usize,
    rows: std::ops::Range<usize>,
) -> (Vec<f32>, Vec<f32>) {
    let mut k = vec![0.0; rows.len() * 3];
    let mut v = vec![0.0; rows.len() * 2];
    pool.gather_f32(t, layer, rows, &mut k, &mut v).unwrap();
    (k, v)
}

fn expected(s: u32, rows: std::ops::Range<usize>, layer: u32) -> (Vec<f32>, Vec<f32>) {
    (
        rows.clone().flat_map(|p| row(s, p, 3, layer)).collect(),
        rows.flat_map(|p| row(s, p, 2, layer + 1)).collect(),
    )
}

#[test]
fn rows_read_back_exactly_across_block_boundaries() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let mut p = pool(8, dtype);
        let mut t = BlockTable::new();
        write(&mut p, &mut t, 1, 0, 3);
        write(&mut p, &mut t, 1, 3, 10);
        assert_eq!(t.len(), 10);
        assert_eq!(t.blocks().len(), 3);
        for layer in 0..2 {
            assert_eq!(read(&p, &t, layer, 2..9), expected(1, 2..9, layer as u32));
        }
    }
}

#[test]
fn exhaustion_is_an_error_and_release_frees_everything() {
    let mut p = pool(3, KvDtype::F16);
    let mut a = BlockTable::new();
    write(&mut p, &mut a, 1, 0, 12);
    let mut b = BlockTable::new();
    assert!(matches!(
        p.reserve(&mut b, 1),
        Err(KvError::OutOfBlocks {
            needed: 1,
            available: 0
        })
    ));
    assert!(b.blocks().is_empty(), "a failed reserve takes nothing");
    p.release(&mut a);
    assert_eq!(p.usage().free, 3);
    assert_eq!(p.usage().used, 0);
    write(&mut p, &mut b, 2, 0, 5);
    assert_eq!(p.usage().used, 2);
}

#[test]
fn a_fork_copies_its_shared_partial_block_on_write() {
    let mut p = pool(8, KvDtype::F32);
    let mut a = BlockTable::new();
    write(&mut p, &mut a, 1, 0, 6); // block 0 full, block 1 half
    let mut b = p.fork(&a);
    assert_eq!(p.usage().used, 2, "the fork shares both blocks");
    write(&mut p, &mut b, 2, 6, 8); // b writes into the shared half block
    assert_ne!(a.blocks()[1], b.blocks()[1], "the partial block was copied");
    assert_eq!(a.blocks()[0], b.blocks()[0], "the full block stays shared");
    write(&mut p, &mut a, 3, 6, 7);
    // Each sees the common rows and its own writes.
    assert_eq!(read(&p, &a, 0, 0..6), expected(1, 0..6, 0));
    assert_eq!(read(&p, &b, 0, 0..6), expected(1, 0..6, 0));
    assert_eq!(read(&p, &a, 1, 6..7), expected(3, 6..7, 1));
    assert_eq!(read(&p, &b, 1, 6..8), expected(2, 6..8, 1));
    p.release(&mut a);
    p.release(&mut b);
    assert_eq!(p.usage().used, 0);
}

#[test]
fn truncate_frees_the_blocks_past_the_new_end() {
    let mut p = pool(8, KvDtype::F16);
    let mut t = BlockTable::new();
    write(&mut p, &mut t, 1, 0, 13);
    assert_eq!(p.usage().used, 4);
    p.truncate(&mut t, 5);
    assert_eq!((t.len(), t.blocks().len(), p.usage().used), (5, 2, 2));
    write(&mut p, &mut t, 9, 5, 9);
    assert_eq!(read(&p, &t, 0, 0..5), expected(1, 0..5, 0));
    assert_eq!(read(&p, &t, 0, 5..9), expected(9, 5..9, 0));
}

fn tokens(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32).map(|i| i * 3 + salt).collect()
}

#[test]
fn the_prefix_cache_shares_whole_matching_blocks_only() {
    let mut p = pool(16, KvDtype::F16);
    let toks = tokens(11, 0);
    let mut a = BlockTable::new();
    write(&mut p, &mut a, 1, 0, 11);
    p.register(&mut a, &toks);
    // Same first 9 tokens, then different: two whole blocks match.
    let mut other = toks[..9].to_vec();
    other.extend([999, 998, 997]);
    let m = p.match_prefix(&other, other.len());
    assert_eq!(m.len(), 8);
    assert_eq!(m.blocks(), &a.blocks()[..2]);
    // A different first token matches nothing (the chain starts at block 0).
    let mut shifted = toks.clone();
    shifted[0] += 1;
    assert!(p.match_prefix(&shifted, 11).is_empty());
    // The limit is respected (the last token's logits are always computed).
    let limited = p.match_prefix(&toks, 7);
    assert_eq!(limited.len(), 4);
    let (mut m, mut limited) = (m, limited);
    p.release(&mut m);
    p.release(&mut limited);
    p.release(&mut a);
    // Released registered blocks stay cached (evictable), the partial one is free.
    let u = p.usage();
    assert_eq!((u.used, u.cached), (0, 2));
    let mut again = p.match_prefix(&toks, 10);
    assert_eq!(again.len(), 8);
    assert_eq!(read(&p, &again, 1, 0..8), expected(1, 0..8, 1));
    p.release(&mut again);
}

#[test]
fn cached_blocks_are_evicted_least_recently_used_first() {
    let mut p = pool(4, KvDtype::F16);
    let (ta, tb) = (tokens(8, 0), tokens(8, 100));
    for (toks, s) in [(&ta, 1), (&tb, 2)] {
        let mut t = BlockTable::new();
        write(&mut p, &mut t, s, 0, 8);
        p.register(&mut t, toks);
        p.release(&mut t);
    }
    assert_eq!(p.usage().cached, 4);
    // Touch A so B is the least recently used.
    let mut a = p.match_prefix(&ta, 8);
    p.release(&mut a);
    // Two new blocks evict B's two.
    let mut c = BlockTable::new();
    write(&mut p, &mut c, 3, 0, 8);
    assert_eq!(p.match_prefix(&tb, 8).len(), 0, "B was evicted");
    let mut a = p.match_prefix(&ta, 8);
    assert_eq!(a.len(), 8, "A survived");
    assert_eq!(read(&p, &a, 0, 0..8), expected(1, 0..8, 0));
    p.release(&mut a);
    p.release(&mut c);
}

#[test]
fn a_registered_block_is_never_written_in_place() {
    let mut p = pool(8, KvDtype::F32);
    let toks = tokens(8, 0);
    let mut a = BlockTable::new();
    write(&mut p, &mut a, 1, 0, 8);
    p.register(&mut a, &toks);
    let mut b = p.match_prefix(&toks, 8);
    // A rolls back into its second block and writes other rows there.
    p.truncate(&mut a, 6);
    write(&mut p, &mut a, 5, 6, 8);
    assert_eq!(
        read(&p, &b, 0, 0..8),
        expected(1, 0..8, 0),
        "the cached rows are intact"
    );
    assert_eq!(read(&p, &a, 0, 6..8), expected(5, 6..8, 0));
    p.release(&mut a);
    p.release(&mut b);
}

#[test]
fn registering_an_already_cached_prefix_shares_the_cached_block() {
    let mut p = pool(8, KvDtype::F16);
    let toks = tokens(8, 0);
    let mut a = BlockTable::new();
    write(&mut p, &mut a, 1, 0, 8);
    p.register(&mut a, &toks);
    let mut b = BlockTable::new();
    write(&mut p, &mut b, 1, 0, 8); // the same rows, computed again
    assert_eq!(p.usage().used, 4);
    p.register(&mut b, &toks);
    assert_eq!(b.blocks(), a.blocks());
    assert_eq!(p.usage().used, 2, "the duplicate blocks were freed");
    p.release(&mut a);
    p.release(&mut b);
}

#[test]
fn bad_shapes_are_errors() {
    let widths = [LayerWidths { k: 3, v: 2 }];
    assert!(
        PagedKv::new(&widths, KvDtype::F16, 4, 64, 1).is_err(),
        "not one block fits"
    );
    assert!(PagedKv::new(&[], KvDtype::F16, 4, 64, 1 << 20).is_err());
    assert!(PagedKv::new(&widths, KvDtype::F16, 0, 64, 1 << 20).is_err());
    let mut p = pool(4, KvDtype::F16);
    let mut t = BlockTable::new();
    assert!(matches!(
        p.reserve(&mut t, 65),
        Err(KvError::ContextFull {
            n_ctx: 64,
            requested: 65
        })
    ));
    p.reserve(&mut t, 4).unwrap();
    assert!(
        p.write_rows(&t, 0, 0, &[0.0; 4], &[0.0; 2]).is_err(),
        "K row width"
    );
    assert!(
        p.write_rows(&t, 5, 0, &[0.0; 3], &[0.0; 2]).is_err(),
        "layer"
    );
    assert!(
        p.write_rows(&t, 0, 2, &[0.0; 9], &[0.0; 6]).is_err(),
        "past the reserved blocks"
    );
}
