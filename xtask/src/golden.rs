//! `cargo xtask golden [--check] [WHAT]`: regenerate or verify golden reference data.
//!
//! Each kind of golden data is one submodule with `pub fn run(check: bool) -> Result<()>`:
//! without `check` it regenerates its files from the reference (llama.cpp or the pinned
//! vectors); with `check` it regenerates in memory and fails if the files on disk differ.
//! To add one: create `golden/NAME.rs`, add `pub mod NAME;` and one [`Golden`] line below.

pub mod dequant;
pub mod dot;
pub mod filetypes;
pub mod forward;
pub mod grids;
pub mod ppl;
pub mod pretok;
pub mod tokenizer;

use anyhow::{bail, Result};

/// One kind of golden data.
#[derive(Debug, Clone, Copy)]
pub struct Golden {
    /// Name accepted on the command line.
    pub name: &'static str,
    /// What it covers (for `--help` and listings).
    pub about: &'static str,
    /// Regenerates (`check == false`) or verifies (`check == true`).
    pub run: fn(bool) -> Result<()>,
}

/// All golden kinds, in the order `all` runs them.
pub const GOLDENS: &[Golden] = &[
    Golden {
        name: "dequant",
        about: "dequantized rows of the default model's tensors, one per type",
        run: dequant::run,
    },
    Golden {
        name: "dot",
        about: "llama.cpp's own activation quantizers and dot kernels on recorded rows, per type",
        run: dot::run,
    },
    Golden {
        name: "grids",
        about: "the IQ1-IQ3 lattice tables from ggml-common.h, as nx's generated source",
        run: grids::run,
    },
    Golden {
        name: "filetypes",
        about:
            "the tensor types llama-quantize picks for each tier-1 file type (llama-ft-* shapes)",
        run: filetypes::run,
    },
    Golden {
        name: "tokenizer",
        about: "token ids for the pinned vocabs and the default model",
        run: tokenizer::run,
    },
    Golden {
        name: "pretok",
        about: "token ids of every tokenizer.ggml.pre name, and EOG sets, from vocab-only files",
        run: pretok::run,
    },
    Golden {
        name: "forward",
        about: "greedy tokens and top-2 log-probs of llama-server on the tiny models and Gemma 3",
        run: forward::run,
    },
    Golden {
        name: "ppl",
        about: "llama-perplexity on the default model and /usr/share/common-licenses/GPL-3",
        run: ppl::run,
    },
];

/// The golden kinds `what` selects: `all` or one name.
pub fn select(what: &str) -> Result<Vec<Golden>> {
    if what == "all" {
        return Ok(GOLDENS.to_vec());
    }
    match GOLDENS.iter().find(|g| g.name == what) {
        Some(golden) => Ok(vec![*golden]),
        None => {
            let names: Vec<&str> = GOLDENS.iter().map(|g| g.name).collect();
            bail!("unknown golden {what:?}; choose all, {}", names.join(", "))
        }
    }
}

/// Entry point of `cargo xtask golden`: runs every selected kind, then fails if any did.
pub fn run(what: &str, check: bool) -> Result<()> {
    let selected = select(what)?;
    let mut failed = Vec::new();
    for golden in &selected {
        let mode = if check { "check" } else { "regenerate" };
        eprintln!("golden: {} ({mode})", golden.name);
        if let Err(err) = (golden.run)(check) {
            eprintln!("golden: {} FAILED: {err:#}", golden.name);
            failed.push(golden.name);
        }
    }
    if !failed.is_empty() {
        bail!("golden failed for: {}", failed.join(", "));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn select_all_one_and_unknown() {
        assert_eq!(select("all").unwrap().len(), GOLDENS.len());
        let one = select("tokenizer").unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].name, "tokenizer");
        let err = select("nope").unwrap_err().to_string();
        assert!(
            err.contains("dequant") && err.contains("tokenizer"),
            "{err}"
        );
    }

    #[test]
    fn names_are_unique_and_not_all() {
        for (i, golden) in GOLDENS.iter().enumerate() {
            assert_ne!(golden.name, "all");
            assert!(GOLDENS[..i].iter().all(|g| g.name != golden.name));
        }
    }
}
