//! One transformer block over a chunk of tokens at positions `pos..pos+n`.
//!
//! The key design choice: the block reads top to bottom in model order (norm → Q/K/V →
//! Q/K norm → RoPE → cache write → attention → output projection → residual → norm →
//! gated FFN → residual), and every reduction it performs is per output element in an
//! order fixed by the reduction length alone. A token's result therefore does not
//! depend on how many other tokens share its chunk: the engine's batch invariance.
//!
//! The block knows nothing of files or architectures by name: a [`LayerConfig`] says
//! which optional steps apply, and [`LayerWeights`] borrows the tensors.

mod block;
mod layer;
mod moe;
mod project;
mod rope_rows;

pub use block::{forward, forward_batch, BlockScratch};
pub use layer::{
    BlockError, FfnActivation, FfnWeights, LayerConfig, LayerWeights, MoeWeights, Segment,
};
pub use project::{Projection, Projector};
