//! The table of named gates that `cargo xtask gate` runs after fmt, clippy, doc, fetch and tests.
//!
//! A named gate is one integration-test target whose tests are all marked
//! `#[ignore = "gate: run by cargo xtask gate"]` (they need fetched files, so plain
//! `cargo test` skips them). The gate runs
//! `cargo test --release -p PACKAGE --test TEST -- --include-ignored` with `env` added.
//!
//! To add a gate: write the test target, then append one line below, e.g.
//! `Gate::new("GOLD-TOK-VECTORS", "nx-bpe", "gold_tok_vectors"),` or, with environment,
//! `Gate::new("DECODE-SCALAR", "nx-run", "decode_parity").with_env(&[("NX_TIER", "scalar")]),`.
//! `tests/gates_table.rs` checks that each entry names a real test target that uses the
//! ignore marker.

/// The reason string every gate test's `#[ignore]` carries.
pub const IGNORE_REASON: &str = "gate: run by cargo xtask gate";

/// One named gate: an integration-test target run in release mode, ignored tests included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gate {
    /// Upper-case name used in reports and by `--only` (e.g. `GOLD-TOK-VECTORS`).
    pub name: &'static str,
    /// Cargo package that owns the test target.
    pub package: &'static str,
    /// Test target name (`tests/<test>.rs`).
    pub test: &'static str,
    /// Extra environment for the test process.
    pub env: &'static [(&'static str, &'static str)],
}

impl Gate {
    /// A gate with no extra environment.
    pub const fn new(name: &'static str, package: &'static str, test: &'static str) -> Gate {
        Gate {
            name,
            package,
            test,
            env: &[],
        }
    }

    /// The same gate with `env` set for its test process.
    pub const fn with_env(self, env: &'static [(&'static str, &'static str)]) -> Gate {
        Gate { env, ..self }
    }
}

/// Named gates, run in this order.
pub const GATES: &[Gate] = &[
    // The fetched model and llama.cpp vocabs/test vectors match their pins, hashed in full
    // (no stamps), and the model starts with a GGUF v3 header.
    Gate::new("FETCH-PINS", "xtask", "fetched_pins"),
    // The default model's header parses and matches reference.md (types, shapes, vocab).
    Gate::new("GGUF-DEFAULT-MODEL", "nx-gguf", "real_model"),
    // llama.cpp's tokenizer test vectors of the fourteen vocabularies nx reads (648 cases).
    Gate::new("GOLD-TOK-VECTORS", "nx-bpe", "gold_tok_vectors"),
    // Every tokenizer.ggml.pre name nx reads, and every vocab file's EOG set, against the
    // reference's tokenizer on derived vocab-only files (`cargo xtask golden pretok`).
    Gate::new("GOLD-TOK-PRE", "nx-bpe", "gold_tok_pre"),
    // The default model's vocab against llama-server's /tokenize answers.
    Gate::new("GOLD-TOK-GEMMA", "nx-bpe", "gold_tok_gemma"),
    // Teacher-forced and free-running greedy against llama-server's answers on the three
    // synthetic fixtures: top-1 where the margin is >= 0.05 nats, log-probs within 0.05.
    Gate::new("GOLD-FWD", "nx-llama-stack", "gold_fwd"),
    // The same on the default model (12 prompts x 48 tokens, one past the sliding window).
    Gate::new("GOLD-FWD-GEMMA", "nx-llama-stack", "gold_fwd_gemma"),
    // Both again on the lower tiers (the default here is AVX-512): every tier's kernels
    // must give llama.cpp's numbers.
    Gate::new("GOLD-FWD-AVX2", "nx-llama-stack", "gold_fwd").with_env(&[("NX_TIER", "avx2")]),
    Gate::new("GOLD-FWD-SCALAR", "nx-llama-stack", "gold_fwd").with_env(&[("NX_TIER", "scalar")]),
    Gate::new("GOLD-FWD-GEMMA-AVX2", "nx-llama-stack", "gold_fwd_gemma")
        .with_env(&[("NX_TIER", "avx2")]),
    Gate::new("GOLD-FWD-GEMMA-SCALAR", "nx-llama-stack", "gold_fwd_gemma")
        .with_env(&[("NX_TIER", "scalar")]),
    // The default chat model (SmolLM2-135M-Instruct, a published Q4_1 file) against
    // llama-server's answers, on the default tier and AVX2. (Its scalar run takes minutes;
    // the scalar Q4_1 kernels are gated by GOLD-FWD-SCALAR on the llama-q4_1 fixture.)
    Gate::new("GOLD-FWD-CHAT", "nx-llama-stack", "gold_fwd_chat"),
    Gate::new("GOLD-FWD-CHAT-AVX2", "nx-llama-stack", "gold_fwd_chat")
        .with_env(&[("NX_TIER", "avx2")]),
    // The multi-token matmul paths of the AVX2 tier (its token groups, the four-token
    // kernels) against the single-token kernel, bit for bit (the default run tests the
    // AVX-512 tiles).
    Gate::new("TOKENS-AVX2", "nx-lazy-weight", "multi_token").with_env(&[("NX_TIER", "avx2")]),
    // The LM head's bounded pass on the AVX2 tier (AVX-VNNI, where the CPU has it): the
    // candidates hold the top rows with the matmul's bits.
    Gate::new("BOUNDED-AVX2", "nx-lazy-weight", "bounded_head").with_env(&[("NX_TIER", "avx2")]),
    // Bit-identical logits for prefill chunks 1, 7, 32, whole prompt and 1 or 2 threads.
    Gate::new("EQUIV-1", "nx-llama-stack", "equiv"),
    // The same on the AVX2 tier (the default here is AVX-512): tiers must not break it.
    Gate::new("EQUIV-1-AVX2", "nx-llama-stack", "equiv").with_env(&[("NX_TIER", "avx2")]),
    // And on the portable kernels (several minutes: no SIMD).
    Gate::new("EQUIV-1-SCALAR", "nx-llama-stack", "equiv").with_env(&[("NX_TIER", "scalar")]),
    // The engine (batching, joining, prefix cache, preemption) gives every request the
    // ids and log-probs of plain decoding, bit for bit, on every tier.
    Gate::new("EQUIV-3", "nx-run", "equiv_engine"),
    Gate::new("EQUIV-3-AVX2", "nx-run", "equiv_engine").with_env(&[("NX_TIER", "avx2")]),
    Gate::new("EQUIV-3-SCALAR", "nx-run", "equiv_engine").with_env(&[("NX_TIER", "scalar")]),
    // Speculative decoding (prompt lookup, draft model; draft lengths 1-8) gives the
    // ids and log-probs of plain decoding, bit for bit.
    Gate::new("EQUIV-4", "nx-run", "spec_equiv"),
    // Seeded sampling reproducible; filters and penalties exact; temperature statistics.
    Gate::new("SAMPLER", "nx-sampler", "sampler"),
    // The same through the runner: seeds across chunk sizes.
    Gate::new("SAMPLER-RUNNER", "nx-run", "sampler_runner"),
    // Perplexity of the default model on GPL-3 within 0.5% of llama-perplexity's.
    Gate::new("GOLD-PPL", "nx-run", "gold_ppl"),
    // `nx serve` driven by the pinned openai Python client (tiny and default model) and
    // curl -N, then a soak of 500 mixed requests that must leave the server clean.
    Gate::new("SERVE-OPENAI", "nx-cli", "serve_openai"),
    // Every fuzz target over its seeds, the committed crash regressions and 400 seeded
    // mutations (the long coverage-guided runs are `cargo xtask fuzz`).
    Gate::new("FUZZ-SMOKE", "nx-fuzz", "corpus"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_names_are_unique_upper_kebab() {
        for (i, gate) in GATES.iter().enumerate() {
            assert!(
                !gate.name.is_empty()
                    && gate
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'-'),
                "gate name {:?} is not UPPER-KEBAB",
                gate.name
            );
            assert!(
                GATES[..i].iter().all(|g| g.name != gate.name),
                "duplicate gate {}",
                gate.name
            );
        }
    }

    #[test]
    fn with_env_keeps_the_rest() {
        const G: Gate = Gate::new("X", "p", "t").with_env(&[("A", "1")]);
        assert_eq!((G.name, G.package, G.test), ("X", "p", "t"));
        assert_eq!(G.env, &[("A", "1")]);
    }
}
