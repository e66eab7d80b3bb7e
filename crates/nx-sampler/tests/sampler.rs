//! The SAMPLER gate: determinism, filter sets on hand-built logits, penalty scope,
//! the temperature distribution (chi-square), greedy ties, config validation, and the
//! log-probability helpers.

use nx_sampler::*;

fn cfg() -> SamplerConfig {
    // Everything off except temperature 1: each test turns on what it checks.
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    }
}

/// A fixed, reasonably spread logits row of `n` values (SplitMix64-derived).
fn logits_row(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed;
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 * 8.0 - 4.0
        })
        .collect()
}

fn run(config: SamplerConfig, n_tokens: usize) -> Vec<u32> {
    let mut s = Sampler::new(config).unwrap();
    (0..n_tokens)
        .map(|i| {
            let mut logits = logits_row(i as u64, 1000);
            s.sample_and_accept(&mut logits).unwrap()
        })
        .collect()
}

fn sorted(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v
}

// ---------------------------------------------------------------- determinism

#[test]
fn same_seed_gives_same_tokens() {
    let config = SamplerConfig {
        seed: 1234,
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    };
    let a = run(config.clone(), 200);
    let b = run(config.clone(), 200);
    assert_eq!(a, b);
    // reset() returns to the freshly seeded state.
    let mut s = Sampler::new(config).unwrap();
    let first: Vec<u32> = (0..50)
        .map(|i| s.sample_and_accept(&mut logits_row(i, 1000)).unwrap())
        .collect();
    s.reset();
    assert!(s.recent_tokens().is_empty());
    let again: Vec<u32> = (0..50)
        .map(|i| s.sample_and_accept(&mut logits_row(i, 1000)).unwrap())
        .collect();
    assert_eq!(first, again);
}

#[test]
fn different_seeds_give_different_tokens() {
    let config = SamplerConfig {
        temperature: 1.5,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::default()
    };
    let a = run(
        SamplerConfig {
            seed: 1,
            ..config.clone()
        },
        200,
    );
    let b = run(SamplerConfig { seed: 2, ..config }, 200);
    let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    assert!(same < 100, "seeds 1 and 2 agree on {same} of 200 draws");
}

// ---------------------------------------------------------------- filters

/// Logits whose softmax is exactly the given probabilities (up to f32 rounding).
fn logits_for(probs: &[f64]) -> Vec<f32> {
    probs.iter().map(|p| p.ln() as f32).collect()
}

#[test]
fn top_k_keeps_the_k_best_with_low_ids_winning_ties() {
    let logits = [1.0f32, 3.0, 3.0, 2.0, 3.0, -5.0];
    let k = |top_k| {
        Sampler::new(SamplerConfig { top_k, ..cfg() })
            .unwrap()
            .filtered_candidates(&logits)
            .unwrap()
    };
    assert_eq!(k(1), vec![1]);
    assert_eq!(k(2), vec![1, 2]);
    assert_eq!(k(3), vec![1, 2, 4]);
    assert_eq!(k(4), vec![1, 2, 4, 3]);
    assert_eq!(k(100), vec![1, 2, 4, 3, 0, 5]);
    assert_eq!(sorted(k(0)), vec![0, 1, 2, 3, 4, 5], "top_k 0 is off");
}

#[test]
fn top_p_keeps_the_smallest_prefix_reaching_p() {
    // Probabilities 0.5, 0.25, 0.125, 0.0625, 0.0625 (ids shuffled).
    let probs = [0.125, 0.5, 0.0625, 0.25, 0.0625];
    let logits = logits_for(&probs);
    let p = |top_p| {
        Sampler::new(SamplerConfig { top_p, ..cfg() })
            .unwrap()
            .filtered_candidates(&logits)
            .unwrap()
    };
    assert_eq!(p(0.3), vec![1], "0.5 alone reaches 0.3");
    assert_eq!(p(0.5 - 1e-4), vec![1]);
    assert_eq!(p(0.6), vec![1, 3], "0.5 + 0.25 reaches 0.6");
    assert_eq!(p(0.8), vec![1, 3, 0], "0.875 reaches 0.8");
    assert_eq!(
        p(0.9),
        vec![1, 3, 0, 2],
        "0.9375 reaches 0.9; tie goes to id 2"
    );
    assert_eq!(sorted(p(1.0)), vec![0, 1, 2, 3, 4], "top_p 1 is off");
}

#[test]
fn top_p_on_a_large_vocabulary_matches_a_full_sort() {
    // More than the first partial sort (256) is needed when the distribution is flat.
    let logits = logits_row(99, 5000);
    for top_p in [0.05f32, 0.5, 0.95, 0.999] {
        let got = Sampler::new(SamplerConfig { top_p, ..cfg() })
            .unwrap()
            .filtered_candidates(&logits)
            .unwrap();
        // Independent reference: full sort, f64 probabilities.
        let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
        ids.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        let max = f64::from(logits[ids[0] as usize]);
        let z: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
        let cum_at = |n: usize| -> f64 {
            ids[..n]
                .iter()
                .map(|&id| (f64::from(logits[id as usize]) - max).exp() / z)
                .sum()
        };
        // The sampler accumulates in f32 (as llama.cpp does); over n terms that sum is
        // off by at most about n·2^-24, so the cut may move by that much mass.
        let slack = logits.len() as f64 * 2f64.powi(-24);
        let kept = got.len();
        assert!(
            cum_at(kept) >= f64::from(top_p) - slack,
            "top_p {top_p}: kept {kept} tokens holding only {}",
            cum_at(kept)
        );
        assert!(
            cum_at(kept - 1) < f64::from(top_p) + slack,
            "top_p {top_p}: kept {kept} tokens, but {} already reach it",
            kept - 1
        );
        assert_eq!(
            got[..],
            ids[..got.len()],
            "top_p {top_p}: wrong order or set"
        );
    }
}

#[test]
fn min_p_keeps_tokens_at_least_min_p_times_the_best() {
    let probs = [0.125, 0.5, 0.0625, 0.25, 0.0625];
    let logits = logits_for(&probs);
    let m = |min_p| {
        sorted(
            Sampler::new(SamplerConfig { min_p, ..cfg() })
                .unwrap()
                .filtered_candidates(&logits)
                .unwrap(),
        )
    };
    assert_eq!(m(0.9), vec![1]);
    assert_eq!(m(0.4), vec![1, 3], "0.25 >= 0.4·0.5");
    assert_eq!(m(0.2), vec![0, 1, 3], "0.125 >= 0.1; 0.0625 < 0.1");
    assert_eq!(m(0.1), vec![0, 1, 2, 3, 4], "0.0625 >= 0.05");
    assert_eq!(m(0.0), vec![0, 1, 2, 3, 4], "min_p 0 is off");
    assert_eq!(m(1.0), vec![1], "min_p 1 keeps only the best");
}

#[test]
fn filters_run_in_order_top_k_then_top_p_then_min_p() {
    // p = 0.4, 0.3, 0.2, 0.1. Top-p alone at 0.5 keeps {0, 1} (0.4 < 0.5 <= 0.7), but
    // after top-k 2 the set is renormalised to 4/7, 3/7 and 4/7 >= 0.5 keeps only {0}.
    let logits = logits_for(&[0.4, 0.3, 0.2, 0.1]);
    let f = |top_k, top_p, min_p| {
        Sampler::new(SamplerConfig {
            top_k,
            top_p,
            min_p,
            ..cfg()
        })
        .unwrap()
        .filtered_candidates(&logits)
        .unwrap()
    };
    assert_eq!(f(0, 0.5, 0.0), vec![0, 1]);
    assert_eq!(f(2, 0.5, 0.0), vec![0]);
    // Min-p after top-p: top-p 0.95 keeps {0,1,2,3}; min-p 0.6 keeps p >= 0.24: {0,1}.
    assert_eq!(f(0, 0.95, 0.6), vec![0, 1]);
    // Sampling only ever returns filtered tokens.
    let mut s = Sampler::new(SamplerConfig {
        top_k: 2,
        top_p: 0.5,
        seed: 5,
        ..cfg()
    })
    .unwrap();
    for _ in 0..200 {
        assert_eq!(s.sample(&mut logits.clone()).unwrap(), 0);
    }
}

#[test]
fn non_finite_logits_are_never_candidates() {
    let logits = [f32::NAN, 1.0, f32::NEG_INFINITY, f32::INFINITY, 0.5];
    let c = Sampler::new(cfg())
        .unwrap()
        .filtered_candidates(&logits)
        .unwrap();
    assert_eq!(c, vec![1, 4]);
    let mut s = Sampler::new(SamplerConfig { seed: 9, ..cfg() }).unwrap();
    for _ in 0..100 {
        let t = s.sample(&mut logits.clone()).unwrap();
        assert!(t == 1 || t == 4);
    }
}

// ---------------------------------------------------------------- penalties

#[test]
fn penalties_change_exactly_the_tokens_in_the_window() {
    let config = SamplerConfig {
        repeat_penalty: 1.5,
        frequency_penalty: 0.25,
        presence_penalty: 0.5,
        penalty_last_n: 4,
        ..cfg()
    };
    let mut s = Sampler::new(config).unwrap();
    // Window of 4: token 9 falls out; 2 appears twice, 5 and 7 once.
    s.accept_all(&[9, 2, 5, 2, 7]);
    assert_eq!(s.recent_tokens(), vec![2, 5, 2, 7]);
    let base: Vec<f32> = vec![1.0, -1.0, 3.0, 0.5, -2.0, -0.5, 2.0, 0.0, 4.0, 6.0];
    let mut got = base.clone();
    s.apply_penalties(&mut got);
    for (i, (&b, &g)) in base.iter().zip(&got).enumerate() {
        let count = match i {
            2 => 2.0,
            5 | 7 => 1.0,
            _ => 0.0,
        };
        let want = if count == 0.0 {
            b
        } else {
            let repeated = if b <= 0.0 { b * 1.5 } else { b / 1.5 };
            repeated - (count * 0.25 + 0.5)
        };
        assert_eq!(g, want, "token {i}");
    }
    // Token 9 left the window, so its logit is untouched; 7's logit 0 only loses the
    // frequency and presence terms (0·1.5 = 0/1.5 = 0).
    assert_eq!(got[9], 6.0);
    assert_eq!(got[7], -0.75);
}

#[test]
fn penalties_are_applied_before_greedy_and_ignore_out_of_range_ids() {
    let mut s = Sampler::new(SamplerConfig {
        repeat_penalty: 2.0,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    s.accept(0);
    s.accept(1000); // beyond the vocabulary: ignored
    let mut logits = vec![3.0f32, 2.0, 1.0];
    assert_eq!(s.sample(&mut logits).unwrap(), 1, "3/2 = 1.5 < 2");
    assert_eq!(
        logits,
        vec![1.5, 2.0, 1.0],
        "sample applies penalties in place"
    );
}

#[test]
fn disabled_penalties_change_nothing() {
    for config in [
        SamplerConfig {
            penalty_last_n: 0,
            repeat_penalty: 1.3,
            ..cfg()
        },
        SamplerConfig {
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            ..cfg()
        },
    ] {
        let mut s = Sampler::new(config).unwrap();
        s.accept_all(&[0, 1, 2, 3]);
        let base = logits_row(3, 8);
        let mut got = base.clone();
        s.apply_penalties(&mut got);
        assert_eq!(got, base);
    }
    let mut off = Sampler::new(SamplerConfig {
        penalty_last_n: 0,
        ..cfg()
    })
    .unwrap();
    off.accept(3);
    assert!(off.recent_tokens().is_empty());
}

// ---------------------------------------------------------------- temperature

/// Pearson chi-square statistic of `counts` against probabilities `p`.
fn chi_square(counts: &[usize], p: &[f64]) -> f64 {
    let n: usize = counts.iter().sum();
    counts
        .iter()
        .zip(p)
        .map(|(&c, &pi)| {
            let e = pi * n as f64;
            (c as f64 - e).powi(2) / e
        })
        .sum()
}

fn softmax64(logits: &[f32], t: f64) -> Vec<f64> {
    let z: Vec<f64> = logits.iter().map(|&l| f64::from(l) / t).collect();
    let max = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = z.iter().map(|v| (v - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

#[test]
fn temperature_draws_follow_softmax_of_logits_over_t() {
    // 3 degrees of freedom: P(chi² > 16.27) = 0.001.
    const CRITICAL: f64 = 16.27;
    const N: usize = 20_000;
    let logits = [1.0f32, 2.0, 0.5, -1.0];
    for (t, seed) in [(0.7f32, 11u64), (1.0, 12), (1.8, 13)] {
        let mut s = Sampler::new(SamplerConfig {
            temperature: t,
            seed,
            ..cfg()
        })
        .unwrap();
        let mut counts = [0usize; 4];
        for _ in 0..N {
            counts[s.sample(&mut logits.to_vec()).unwrap() as usize] += 1;
        }
        let chi = chi_square(&counts, &softmax64(&logits, f64::from(t)));
        assert!(chi < CRITICAL, "T={t}: counts {counts:?}, chi² {chi}");
        // The test has power: the same counts are far from a wrong temperature.
        let wrong = chi_square(&counts, &softmax64(&logits, f64::from(t) * 1.5));
        assert!(wrong > CRITICAL, "T={t}: chi² against T·1.5 only {wrong}");
    }
}

// ---------------------------------------------------------------- greedy

#[test]
fn greedy_takes_the_lowest_id_among_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(s.sample(&mut [0.0, 5.0, 1.0, 5.0]).unwrap(), 1);
    assert_eq!(s.sample(&mut [7.0, 7.0]).unwrap(), 0);
    assert_eq!(s.sample(&mut [-3.0]).unwrap(), 0);
    assert_eq!(
        s.sample(&mut [f32::NAN, -1.0, f32::INFINITY, -0.5])
            .unwrap(),
        3,
        "non-finite logits are skipped"
    );
    assert_eq!(s.filtered_candidates(&[1.0, 4.0, 4.0]).unwrap(), vec![1]);
    assert!(SamplerConfig::greedy().is_greedy());
    assert!(!SamplerConfig::default().is_greedy());
}

#[test]
fn greedy_consumes_no_randomness() {
    // Temperature 0 ignores the seed entirely.
    let a = run(
        SamplerConfig {
            seed: 1,
            ..SamplerConfig::greedy()
        },
        50,
    );
    let b = run(
        SamplerConfig {
            seed: 2,
            ..SamplerConfig::greedy()
        },
        50,
    );
    assert_eq!(a, b);
    for (i, &t) in a.iter().enumerate() {
        let logits = logits_row(i as u64, 1000);
        let best = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
        assert_eq!(logits[t as usize], best);
    }
}

// ---------------------------------------------------------------- errors

#[test]
fn empty_or_non_finite_logits_are_errors() {
    let mut s = Sampler::new(SamplerConfig::default()).unwrap();
    assert_eq!(s.sample(&mut []), Err(SamplerError::EmptyLogits));
    assert_eq!(
        s.sample(&mut [f32::NAN, f32::NEG_INFINITY]),
        Err(SamplerError::NoFiniteLogits { n_vocab: 2 })
    );
    let mut g = Sampler::new(SamplerConfig::greedy()).unwrap();
    assert_eq!(g.sample(&mut []), Err(SamplerError::EmptyLogits));
    assert_eq!(
        g.sample(&mut [f32::NAN]),
        Err(SamplerError::NoFiniteLogits { n_vocab: 1 })
    );
    assert_eq!(s.filtered_candidates(&[]), Err(SamplerError::EmptyLogits));
}

#[test]
fn invalid_configs_are_rejected() {
    let bad = |c: SamplerConfig| Sampler::new(c).unwrap_err();
    assert_eq!(
        bad(SamplerConfig {
            temperature: -0.1,
            ..cfg()
        }),
        SamplerError::Config(ConfigError::NegativeTemperature(-0.1))
    );
    assert!(matches!(
        bad(SamplerConfig {
            temperature: f32::NAN,
            ..cfg()
        }),
        SamplerError::Config(ConfigError::NotFinite {
            field: "temperature",
            ..
        })
    ));
    for top_p in [0.0f32, -0.5, 1.01] {
        assert_eq!(
            bad(SamplerConfig { top_p, ..cfg() }),
            SamplerError::Config(ConfigError::TopPOutOfRange(top_p))
        );
    }
    for min_p in [-0.01f32, 1.5] {
        assert_eq!(
            bad(SamplerConfig { min_p, ..cfg() }),
            SamplerError::Config(ConfigError::MinPOutOfRange(min_p))
        );
    }
    for repeat_penalty in [0.0f32, -1.0] {
        assert_eq!(
            bad(SamplerConfig {
                repeat_penalty,
                ..cfg()
            }),
            SamplerError::Config(ConfigError::RepeatPenaltyNotPositive(repeat_penalty))
        );
    }
    for (field, c) in [
        (
            "frequency_penalty",
            SamplerConfig {
                frequency_penalty: f32::NAN,
                ..cfg()
            },
        ),
        (
            "presence_penalty",
            SamplerConfig {
                presence_penalty: f32::INFINITY,
                ..cfg()
            },
        ),
        (
            "top_p",
            SamplerConfig {
                top_p: f32::NAN,
                ..cfg()
            },
        ),
        (
            "min_p",
            SamplerConfig {
                min_p: f32::NAN,
                ..cfg()
            },
        ),
        (
            "repeat_penalty",
            SamplerConfig {
                repeat_penalty: f32::NAN,
                ..cfg()
            },
        ),
    ] {
        match bad(c) {
            SamplerError::Config(ConfigError::NotFinite { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: unexpected {other:?}"),
        }
    }
    // The boundaries that are allowed.
    for c in [
        SamplerConfig::default(),
        SamplerConfig::greedy(),
        SamplerConfig {
            top_p: 1.0,
            min_p: 1.0,
            frequency_penalty: -0.5,
            presence_penalty: -0.5,
            ..cfg()
        },
    ] {
        assert!(c.validate().is_ok(), "{c:?}");
    }
}

#[test]
fn defaults_match_llama_cpp_cli() {
    let d = SamplerConfig::default();
    assert_eq!(d.temperature, 0.8);
    assert_eq!(d.top_k, 40);
    assert_eq!(d.top_p, 0.95);
    assert_eq!(d.min_p, 0.05);
    assert_eq!(d.repeat_penalty, 1.0);
    assert_eq!(d.frequency_penalty, 0.0);
    assert_eq!(d.presence_penalty, 0.0);
    assert_eq!(d.penalty_last_n, 64);
    assert_eq!(d.seed, 0);
    assert!(!d.penalties_enabled());
}

#[test]
fn tiny_temperature_behaves_like_greedy() {
    // logit / 1e-38 overflows to +inf for the best token; it must still be chosen.
    let mut s = Sampler::new(SamplerConfig {
        temperature: 1e-38,
        ..cfg()
    })
    .unwrap();
    for _ in 0..20 {
        assert_eq!(s.sample(&mut [1.0, 3.0, 2.0]).unwrap(), 1);
    }
}

// ---------------------------------------------------------------- log-probabilities

#[test]
fn log_probabilities_match_f64_reference() {
    let logits = [2.0f32, -1.0, 0.5, 2.0, f32::NEG_INFINITY];
    let max = 2.0f64;
    let lse = max
        + logits
            .iter()
            .map(|&l| (f64::from(l) - max).exp())
            .sum::<f64>()
            .ln();
    let top = log_softmax_top(&logits, 3);
    assert_eq!(top.len(), 3);
    assert_eq!(top[0].0, 0, "tie: lower id first");
    assert_eq!(top[1].0, 3);
    assert_eq!(top[2].0, 2);
    for &(id, lp) in &top {
        assert!((f64::from(lp) - (f64::from(logits[id as usize]) - lse)).abs() < 1e-6);
    }
    let all = log_softmax_top(&logits, 10);
    assert_eq!(all.len(), 5);
    assert_eq!(all[4], (4, f32::NEG_INFINITY));
    let total: f64 = all.iter().map(|&(_, lp)| f64::from(lp).exp()).sum();
    assert!((total - 1.0).abs() < 1e-6);

    assert!((f64::from(log_prob(&logits, 1).unwrap()) - (-1.0 - lse)).abs() < 1e-6);
    assert_eq!(log_prob(&logits, 4), Some(f32::NEG_INFINITY));
    assert_eq!(log_prob(&logits, 5), None);
    assert_eq!(log_prob(&[f32::NAN, 1.0], 0), None);
    assert_eq!(log_prob(&[f32::NAN, 1.0], 1), Some(0.0));
    assert!(log_softmax_top(&[], 3).is_empty());
    assert!(log_softmax_top(&[f32::NAN], 3).is_empty());
    assert!(log_softmax_top(&[1.0, 2.0], 0).is_empty());
}

#[test]
fn log_probabilities_are_stable_for_large_logits() {
    // Naive exp() would overflow; f64 log-sum-exp handles it.
    let logits = [1000.0f32, 999.0, 0.0];
    let lp = log_prob(&logits, 0).unwrap();
    let want = -(1.0f64 + (-1.0f64).exp() + (-1000.0f64).exp()).ln();
    assert!((f64::from(lp) - want).abs() < 1e-6);
}

#[test]
fn a_position_keyed_draw_depends_only_on_seed_and_position() {
    let logits = logits_row(3, 500);
    let config = SamplerConfig { seed: 11, ..cfg() };
    let pick = |s: &mut Sampler, pos: u64| s.sample_at(&mut logits.clone(), pos).unwrap();
    // In order, backwards, or after unrelated draws: the same token per position.
    let mut a = Sampler::new(config.clone()).unwrap();
    let forward: Vec<u32> = (0..64).map(|p| pick(&mut a, p)).collect();
    let mut b = Sampler::new(config.clone()).unwrap();
    for _ in 0..5 {
        b.sample(&mut logits.clone()).unwrap();
    }
    let mut backward: Vec<u32> = (0..64).rev().map(|p| pick(&mut b, p)).collect();
    backward.reverse();
    assert_eq!(forward, backward);
    // Positions differ from each other, and another seed differs.
    assert!(
        sorted(forward.clone())
            .windows(2)
            .filter(|w| w[0] != w[1])
            .count()
            > 10
    );
    let mut c = Sampler::new(SamplerConfig { seed: 12, ..config }).unwrap();
    let other: Vec<u32> = (0..64).map(|p| pick(&mut c, p)).collect();
    assert_ne!(forward, other);
}

#[test]
fn position_keyed_draws_follow_the_softmax() {
    // The draws over positions 0..N are uniform: token frequencies match the softmax.
    let logits: Vec<f32> = vec![0.0, 0.5, 1.0, -1.0, 2.0];
    let p = softmax64(&logits, 1.0);
    let mut s = Sampler::new(SamplerConfig { seed: 5, ..cfg() }).unwrap();
    let mut counts = vec![0usize; logits.len()];
    for pos in 0..20_000u64 {
        counts[s.sample_at(&mut logits.clone(), pos).unwrap() as usize] += 1;
    }
    // 4 degrees of freedom: 18.47 is the 0.999 quantile.
    assert!(chi_square(&counts, &p) < 18.47, "{counts:?}");
}

/// `sample_among_at` on candidates that hold a row's top `top_k` (with ties and a few
/// more, in a scrambled order) draws what `sample_at` draws from the whole row, for
/// greedy and top-k configurations; penalties or top-k off refuse.
#[test]
fn candidates_of_the_top_k_draw_what_the_whole_row_does() {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut checked = 0;
    for case in 0..300u64 {
        let n = 50 + (case as usize % 7) * 40;
        // Few distinct values: ties at the k-th place are common.
        let logits: Vec<f32> = (0..n).map(|_| (next() % 23) as f32 * 0.25 - 3.0).collect();
        let config = SamplerConfig {
            temperature: [0.0, 0.7, 1.0][case as usize % 3],
            top_k: [1, 5, 40][(case as usize / 3) % 3],
            top_p: if case % 2 == 0 { 1.0 } else { 0.9 },
            min_p: if case % 5 == 0 { 0.05 } else { 0.0 },
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            penalty_last_n: 64,
            seed: case,
            logit_bias: Vec::new(),
        };
        let mut full = Sampler::new(config.clone()).unwrap();
        let mut among = Sampler::new(config.clone()).unwrap();
        let k = among.top_needed().unwrap();
        let mut sorted = logits.clone();
        sorted.sort_unstable_by(|a, b| b.total_cmp(a));
        let kth = sorted[k.min(n) - 1];
        let mut cands: Vec<(u32, f32)> = (0..n as u32)
            .map(|i| (i, logits[i as usize]))
            .filter(|c| c.1 >= kth - 0.3)
            .collect();
        for i in (1..cands.len()).rev() {
            cands.swap(i, next() as usize % (i + 1));
        }
        for position in 0..8 {
            let mut row = logits.clone();
            let want = full.sample_at(&mut row, position).unwrap();
            assert_eq!(
                among.sample_among_at(&cands, position).unwrap(),
                want,
                "case {case}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 2400);
    let mut penalised = Sampler::new(SamplerConfig {
        repeat_penalty: 1.1,
        ..SamplerConfig::default()
    })
    .unwrap();
    assert_eq!(penalised.top_needed(), None);
    assert!(penalised.sample_among_at(&[(0, 1.0)], 0).is_err());
    let mut no_top_k = Sampler::new(SamplerConfig {
        top_k: 0,
        ..SamplerConfig::default()
    })
    .unwrap();
    assert_eq!(no_top_k.top_needed(), None);
    assert!(no_top_k.sample_among_at(&[(0, 1.0)], 0).is_err());
    let mut biased = Sampler::new(SamplerConfig {
        logit_bias: vec![(3, -100.0)],
        ..SamplerConfig::greedy()
    })
    .unwrap();
    assert_eq!(biased.top_needed(), None);
    assert!(!biased.is_stateless_greedy());
    assert!(biased.stateless_choice(&[1.0, 2.0]).is_none());
    assert!(biased.sample_among_at(&[(0, 1.0)], 0).is_err());
}

/// The logit bias is added before anything else (before the penalties, as llama.cpp's
/// chain does): it bans and favours tokens, greedy and sampled, adds up when a token is
/// listed twice, ignores ids past the row, and must be finite.
#[test]
fn logit_bias_moves_logits_before_the_penalties() {
    let logits = [1.0f32, 3.0, 2.0, 0.5];
    let greedy = |logit_bias: Vec<(u32, f32)>| {
        let mut s = Sampler::new(SamplerConfig {
            logit_bias,
            ..SamplerConfig::greedy()
        })
        .unwrap();
        s.sample(&mut logits.to_vec()).unwrap()
    };
    assert_eq!(greedy(vec![]), 1);
    assert_eq!(greedy(vec![(1, -100.0)]), 2);
    assert_eq!(greedy(vec![(3, 2.6)]), 3);
    assert_eq!(greedy(vec![(3, 1.3), (3, 1.3)]), 3);
    assert_eq!(greedy(vec![(1, -100.0), (2, -100.0), (9, 50.0)]), 0);
    // The row the chain sees: bias, then the penalty (2.0 + 1.0 = 3.0, divided by 2).
    let mut s = Sampler::new(SamplerConfig {
        logit_bias: vec![(2, 1.0)],
        repeat_penalty: 2.0,
        ..SamplerConfig::greedy()
    })
    .unwrap();
    s.accept(2);
    let mut row = logits.to_vec();
    assert_eq!(s.sample(&mut row).unwrap(), 1);
    assert_eq!(row, [1.0, 3.0, 1.5, 0.5]);
    // Sampling never draws a banned token.
    let mut s = Sampler::new(SamplerConfig {
        logit_bias: vec![(1, -100.0), (2, -100.0)],
        top_k: 0,
        min_p: 0.0,
        ..SamplerConfig::default()
    })
    .unwrap();
    for position in 0..200 {
        let id = s.sample_at(&mut logits.to_vec(), position).unwrap();
        assert!(id == 0 || id == 3, "drew banned token {id}");
    }
    let bad = SamplerConfig {
        logit_bias: vec![(0, f32::NAN)],
        ..SamplerConfig::default()
    };
    assert!(matches!(
        bad.validate(),
        Err(ConfigError::NotFinite {
            field: "logit_bias",
            ..
        })
    ));
    assert!(Sampler::new(bad).is_err());
}
