//! The model: `ModelConfig` from GGUF metadata, token embeddings, the block stack, the
//! final norm and the LM head.
//!
//! The key design choice: `forward(tokens, pos, cache, rows)` computes LM-head logits only
//! for the rows the caller asks for, so prefill of a long prompt pays for one vocabulary
//! projection, and memory stays bounded by the chunk size. Opening a model maps the file
//! and reads its header; weights are first touched by the forward pass
//! ([`Model::open_placed`] can instead read them into huge-page memory up front).

mod config;
mod model;
pub mod traffic;

pub use config::{Arch, FfnActivation, ModelConfig, MoeConfig, QkNormSpan, RopeStyle};
/// The tiny random-weight llama model of the tests, for doctests downstream.
#[doc(hidden)]
#[path = "../../nx-run/tests/common/tiny_model.rs"]
pub mod tiny_fixture;

pub use model::{BatchItem, ForwardState, HeadChoice, Model};
pub use nx_kv_cache::{BlockTable, KvCache, KvDtype, KvSegments, PagedBatch, PagedKv};
pub use nx_syscalls::Placement;

/// Why a model could not be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Gguf(#[from] nx_gguf::GgufError),
    #[error("unsupported architecture {0:?} (nx runs {names})", names = crate::config::arch_names())]
    UnsupportedArch(String),
    #[error("missing tensor {0:?}")]
    MissingTensor(String),
    #[error("tensor {name:?} has shape {ne:?}, expected {expected}")]
    TensorShape {
        name: String,
        ne: Vec<u64>,
        expected: String,
    },
    #[error("bad model config: {0}")]
    BadConfig(String),
    #[error(transparent)]
    Weight(#[from] nx_lazy_weight::LazyWeightError),
    #[error(transparent)]
    Block(#[from] nx_llama_block::BlockError),
    #[error(transparent)]
    Cache(#[from] nx_kv_cache::KvError),
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    TokenOutOfRange { id: u32, n_vocab: usize },
    #[error("chunk starts at position {pos} but the cache holds {cache_len} positions")]
    PositionMismatch { pos: usize, cache_len: usize },
    #[error("requested logits row {row} of a chunk of {n} tokens")]
    RowOutOfRange { row: usize, n: usize },
    #[error("a batch of {items} items over KV storage of {segments} sequences")]
    BatchShape { items: usize, segments: usize },
}
