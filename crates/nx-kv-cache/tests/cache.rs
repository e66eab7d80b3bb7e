//! KV cache tests: storage round trips in both dtypes, the written/committed rules,
//! rollback, byte accounting, and every error path (never a panic).

use nx_f32::f16;
use nx_kv_cache::*;
use proptest::prelude::*;

fn row(seed: usize, width: usize) -> Vec<f32> {
    (0..width)
        .map(|i| ((seed * 131 + i * 17) % 97) as f32 * 0.25 - 12.0)
        .collect()
}

fn rows_f32(rows: KvRows<'_>) -> Vec<Vec<f32>> {
    (0..rows.n_rows())
        .map(|j| {
            let mut out = vec![0.0; rows.width()];
            assert!(rows.row_to_f32(j, &mut out));
            out
        })
        .collect()
}

#[test]
fn f32_rows_round_trip_exactly() {
    let mut cache = KvCache::new(2, 8, 6, KvDtype::F32).unwrap();
    for pos in 0..3 {
        cache
            .write(1, pos, &row(pos, 6), &row(pos + 100, 6))
            .unwrap();
    }
    let (k, v) = cache.layer_rows(1, 3).unwrap();
    assert_eq!(k.dtype(), KvDtype::F32);
    assert_eq!(k.n_rows(), 3);
    match k {
        KvRows::F32 { data, width } => {
            assert_eq!(width, 6);
            assert_eq!(data, [row(0, 6), row(1, 6), row(2, 6)].concat());
        }
        KvRows::F16 { .. } => panic!("wrong dtype"),
    }
    assert_eq!(rows_f32(v), vec![row(100, 6), row(101, 6), row(102, 6)]);
}

#[test]
fn f16_rows_are_rounded_to_nearest_even() {
    let mut cache = KvCache::new(1, 4, 4, KvDtype::F16).unwrap();
    let k = [0.1f32, -3.0, 1.0 + 2f32.powi(-11), 70000.0];
    let v = [1.5f32, 2.0, -0.0, 1e-8];
    cache.write(0, 0, &k, &v).unwrap();
    let KvRows::F16 { data, width } = cache.keys(0, 1).unwrap() else {
        panic!("wrong dtype")
    };
    assert_eq!(width, 4);
    // Expected values from the `half` crate's own conversion (an independent routine).
    let want: Vec<f16> = k.iter().map(|&x| f16::from_f32(x)).collect();
    assert_eq!(data, &want[..]);
    assert_eq!(data[2].to_f32(), 1.0, "tie rounds to even");
    assert!(
        data[3].to_f32().is_infinite(),
        "beyond f16 range saturates to inf"
    );
    assert_eq!(
        rows_f32(cache.values(0, 1).unwrap()),
        vec![vec![1.5, 2.0, -0.0, 0.0]]
    );
}

#[test]
fn write_rows_equals_single_writes() {
    for dtype in [KvDtype::F16, KvDtype::F32] {
        let mut a = KvCache::new(1, 16, 5, dtype).unwrap();
        let mut b = KvCache::new(1, 16, 5, dtype).unwrap();
        let ks: Vec<f32> = (0..7).flat_map(|p| row(p, 5)).collect();
        let vs: Vec<f32> = (0..7).flat_map(|p| row(p + 50, 5)).collect();
        a.write_rows(0, 0, &ks[..15], &vs[..15]).unwrap();
        a.write_rows(0, 3, &ks[15..], &vs[15..]).unwrap();
        for p in 0..7 {
            b.write(0, p, &ks[p * 5..(p + 1) * 5], &vs[p * 5..(p + 1) * 5])
                .unwrap();
        }
        assert_eq!(a.written(0).unwrap(), 7);
        assert_eq!(
            rows_f32(a.keys(0, 7).unwrap()),
            rows_f32(b.keys(0, 7).unwrap())
        );
        assert_eq!(
            rows_f32(a.values(0, 7).unwrap()),
            rows_f32(b.values(0, 7).unwrap())
        );
    }
}

#[test]
fn per_layer_widths_and_byte_accounting() {
    let widths = [
        LayerWidths { k: 4, v: 8 },
        LayerWidths::uniform(2),
        LayerWidths { k: 6, v: 3 },
    ];
    let mut cache = KvCache::with_layer_widths(10, &widths, KvDtype::F16).unwrap();
    assert_eq!(cache.n_layers(), 3);
    assert_eq!(cache.n_ctx(), 10);
    assert_eq!(cache.layer_widths(2).unwrap(), LayerWidths { k: 6, v: 3 });
    assert_eq!(cache.bytes_allocated(), (12 + 4 + 9) * 10 * 2);
    assert_eq!(cache.bytes_used(), 0);
    for (l, w) in widths.iter().enumerate() {
        for p in 0..4 {
            cache.write(l, p, &row(p, w.k), &row(p, w.v)).unwrap();
        }
    }
    cache.advance(4).unwrap();
    assert_eq!(cache.bytes_used(), (12 + 4 + 9) * 4 * 2);
    assert_eq!(cache.keys(0, 4).unwrap().width(), 4);
    assert_eq!(cache.values(0, 4).unwrap().width(), 8);
    assert_eq!(
        cache.write(1, 4, &row(0, 2), &row(0, 3)),
        Err(KvError::RowWidth {
            layer: 1,
            which: "V",
            width: 2,
            got: 3
        })
    );

    let f32_cache = KvCache::new(18, 512, 256, KvDtype::F32).unwrap();
    assert_eq!(f32_cache.bytes_allocated(), 18 * 2 * 512 * 256 * 4);
}

#[test]
fn context_full_is_an_error_not_a_panic() {
    let mut cache = KvCache::new(2, 4, 3, KvDtype::F16).unwrap();
    for p in 0..4 {
        for l in 0..2 {
            cache.write(l, p, &row(p, 3), &row(p, 3)).unwrap();
        }
    }
    cache.advance(4).unwrap();
    assert_eq!(
        cache.write(0, 4, &row(4, 3), &row(4, 3)),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: 5
        })
    );
    assert_eq!(
        cache.ensure_room(1),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: 5
        })
    );
    assert_eq!(
        cache.advance(1),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: 5
        })
    );
    assert_eq!(
        cache.advance(usize::MAX),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: usize::MAX
        })
    );
    cache.truncate(2);
    assert_eq!(cache.remaining(), 2);
    assert!(cache.ensure_room(2).is_ok());
    let three = [row(0, 3), row(1, 3), row(2, 3)].concat();
    assert_eq!(
        cache.write_rows(0, 2, &three, &three),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: 5
        })
    );
    assert_eq!(
        cache.write_rows(0, usize::MAX, &three, &three),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: usize::MAX
        })
    );
    assert_eq!(
        cache.set_len(9),
        Err(KvError::ContextFull {
            n_ctx: 4,
            requested: 9
        })
    );
    assert_eq!(cache.len(), 2, "failed requests change nothing");
}

#[test]
fn commits_need_every_layer_written() {
    let mut cache = KvCache::new(3, 8, 2, KvDtype::F32).unwrap();
    for p in 0..3 {
        cache.write(0, p, &row(p, 2), &row(p, 2)).unwrap();
        cache.write(1, p, &row(p, 2), &row(p, 2)).unwrap();
    }
    cache.write(2, 0, &row(0, 2), &row(0, 2)).unwrap();
    assert_eq!(
        cache.advance(3),
        Err(KvError::NotWritten {
            layer: 2,
            requested: 3,
            written: 1
        })
    );
    assert_eq!(cache.len(), 0);
    assert!(cache.is_empty());
    cache.set_len(1).unwrap();
    assert_eq!(cache.len(), 1);
    // Committing nothing is not a rollback: written-but-uncommitted rows stay.
    cache.advance(0).unwrap();
    cache.set_len(1).unwrap();
    assert_eq!(cache.written(0).unwrap(), 3);
    for p in 1..3 {
        cache.write(2, p, &row(p, 2), &row(p, 2)).unwrap();
    }
    cache.advance(2).unwrap();
    assert_eq!(cache.len(), 3);
}

#[test]
fn reads_and_writes_respect_written_rows() {
    let mut cache = KvCache::new(1, 8, 2, KvDtype::F16).unwrap();
    assert_eq!(
        cache.write(0, 1, &row(1, 2), &row(1, 2)),
        Err(KvError::Gap {
            layer: 0,
            pos: 1,
            written: 0
        })
    );
    cache.write(0, 0, &row(0, 2), &row(0, 2)).unwrap();
    assert_eq!(
        cache.keys(0, 2).unwrap_err(),
        KvError::NotWritten {
            layer: 0,
            requested: 2,
            written: 1
        }
    );
    // Uncommitted rows are readable: a block attends to its own chunk's rows before the
    // runner commits them.
    assert_eq!(cache.len(), 0);
    assert_eq!(cache.keys(0, 1).unwrap().n_rows(), 1);
    assert_eq!(cache.values(0, 0).unwrap().n_rows(), 0);
    // Rewriting a written row replaces it.
    cache.write(0, 0, &row(9, 2), &row(9, 2)).unwrap();
    assert_eq!(
        rows_f32(cache.keys(0, 1).unwrap()),
        vec![row(9, 2)
            .iter()
            .map(|&x| f16::from_f32(x).to_f32())
            .collect::<Vec<_>>()]
    );
}

#[test]
fn truncate_rolls_back_and_allows_rewrite() {
    let mut cache = KvCache::new(2, 16, 3, KvDtype::F32).unwrap();
    for p in 0..10 {
        for l in 0..2 {
            cache.write(l, p, &row(p, 3), &row(p + 1, 3)).unwrap();
        }
    }
    cache.advance(8).unwrap();
    cache.truncate(5);
    assert_eq!(cache.len(), 5);
    assert_eq!(cache.written(0).unwrap(), 5);
    assert_eq!(cache.written(1).unwrap(), 5);
    assert!(matches!(
        cache.keys(1, 6),
        Err(KvError::NotWritten { written: 5, .. })
    ));
    assert_eq!(
        cache.write(0, 6, &row(0, 3), &row(0, 3)),
        Err(KvError::Gap {
            layer: 0,
            pos: 6,
            written: 5
        })
    );
    for l in 0..2 {
        cache.write(l, 5, &row(77, 3), &row(78, 3)).unwrap();
    }
    cache.advance(1).unwrap();
    let k = rows_f32(cache.keys(1, 6).unwrap());
    assert_eq!(k[4], row(4, 3), "rows below the cut survive");
    assert_eq!(k[5], row(77, 3), "the rewritten row is the new one");

    cache.truncate(100);
    assert_eq!(cache.len(), 6, "truncating beyond len changes nothing");
    cache.set_len(2).unwrap();
    assert_eq!(cache.len(), 2);
    assert_eq!(cache.written(0).unwrap(), 2);

    cache.clear();
    assert!(cache.is_empty());
    assert_eq!(cache.written(1).unwrap(), 0);
    assert_eq!(cache.bytes_used(), 0);
    assert_eq!(cache.bytes_allocated(), 2 * 6 * 16 * 4);
}

#[test]
#[cfg_attr(
    miri,
    ignore = "Miri stops at an allocation the machine cannot hold instead of failing it, \
              and this test checks that such an allocation is refused"
)]
fn bad_requests_are_typed_errors() {
    let mut cache = KvCache::new(2, 4, 4, KvDtype::F32).unwrap();
    assert_eq!(
        cache.write(2, 0, &row(0, 4), &row(0, 4)),
        Err(KvError::LayerOutOfRange {
            layer: 2,
            n_layers: 2
        })
    );
    assert!(matches!(
        cache.keys(5, 0),
        Err(KvError::LayerOutOfRange { layer: 5, .. })
    ));
    assert!(matches!(
        cache.written(9),
        Err(KvError::LayerOutOfRange { .. })
    ));
    assert_eq!(
        cache.write(0, 0, &row(0, 3), &row(0, 4)),
        Err(KvError::RowWidth {
            layer: 0,
            which: "K",
            width: 4,
            got: 3
        })
    );
    assert_eq!(
        cache.write_rows(0, 0, &row(0, 8), &row(0, 4)),
        Err(KvError::RowCountMismatch {
            layer: 0,
            k_rows: 2,
            v_rows: 1
        })
    );
    assert_eq!(cache.written(0).unwrap(), 0, "failed writes store nothing");

    assert_eq!(
        KvCache::new(0, 4, 4, KvDtype::F32).unwrap_err(),
        KvError::InvalidShape("no layers")
    );
    assert_eq!(
        KvCache::new(1, 0, 4, KvDtype::F32).unwrap_err(),
        KvError::InvalidShape("n_ctx is 0")
    );
    assert!(matches!(
        KvCache::new(1, 4, 0, KvDtype::F16),
        Err(KvError::InvalidShape(_))
    ));
    assert!(matches!(
        KvCache::new(4, usize::MAX / 2, 1 << 20, KvDtype::F32),
        Err(KvError::Allocation { .. })
    ));
    assert!(matches!(
        KvCache::new(1, 1 << 40, 1 << 20, KvDtype::F16),
        Err(KvError::Allocation { .. })
    ));
}

#[test]
fn dtype_metadata() {
    assert_eq!(KvDtype::F16.size_bytes(), 2);
    assert_eq!(KvDtype::F32.size_bytes(), 4);
    assert_eq!(KvDtype::F16.name(), "f16");
    let cache = KvCache::new(1, 2, 2, KvDtype::F16).unwrap();
    assert_eq!(cache.dtype(), KvDtype::F16);
    let mut bad = vec![0.0; 3];
    let rows = cache.keys(0, 0).unwrap();
    assert!(!rows.row_to_f32(0, &mut bad), "out-of-range row is refused");
}

#[derive(Debug, Clone)]
enum Op {
    Write {
        layer: usize,
        pos: usize,
        seed: usize,
    },
    Truncate(usize),
    Advance(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..2, 0usize..12, 0usize..1000).prop_map(|(layer, pos, seed)| Op::Write { layer, pos, seed }),
        1 => (0usize..12).prop_map(Op::Truncate),
        1 => (0usize..4).prop_map(Op::Advance),
    ]
}

proptest! {
    // Miri runs each case thousands of times slower; a few still check every access.
    #![proptest_config(ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 }))]

    /// Any sequence of operations keeps the cache equal to a plain shadow model, and
    /// every refused operation is refused for the reason the model predicts.
    #[test]
    fn cache_matches_a_shadow_model(ops in prop::collection::vec(op(), 0..60)) {
        const N_CTX: usize = 10;
        const W: usize = 3;
        let mut cache = KvCache::new(2, N_CTX, W, KvDtype::F32).unwrap();
        let mut shadow: Vec<Vec<Vec<f32>>> = vec![vec![], vec![]];
        let mut len = 0usize;
        for op in ops {
            match op {
                Op::Write { layer, pos, seed } => {
                    let r = cache.write(layer, pos, &row(seed, W), &row(seed + 1, W));
                    if pos >= N_CTX {
                        prop_assert!(matches!(r, Err(KvError::ContextFull { .. })), "{:?}", r);
                    } else if pos > shadow[layer].len() {
                        prop_assert!(matches!(r, Err(KvError::Gap { .. })), "{:?}", r);
                    } else {
                        prop_assert!(r.is_ok());
                        if pos == shadow[layer].len() {
                            shadow[layer].push(row(seed, W));
                        } else {
                            shadow[layer][pos] = row(seed, W);
                        }
                    }
                }
                Op::Truncate(n) => {
                    cache.truncate(n);
                    len = len.min(n);
                    for s in &mut shadow {
                        s.truncate(n);
                    }
                }
                Op::Advance(n) => {
                    let r = cache.advance(n);
                    let target = len + n;
                    if target > N_CTX {
                        prop_assert!(matches!(r, Err(KvError::ContextFull { .. })), "{:?}", r);
                    } else if shadow.iter().any(|s| s.len() < target) {
                        prop_assert!(matches!(r, Err(KvError::NotWritten { .. })), "{:?}", r);
                    } else {
                        prop_assert!(r.is_ok());
                        len = target;
                    }
                }
            }
            prop_assert_eq!(cache.len(), len);
            for (l, s) in shadow.iter().enumerate() {
                prop_assert_eq!(cache.written(l).unwrap(), s.len());
                prop_assert_eq!(&rows_f32(cache.keys(l, s.len()).unwrap()), s);
            }
        }
    }
}
