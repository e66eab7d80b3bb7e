//! Bytes a decode step reads: what decode speed is measured against.
//!
//! Decoding streams every weight once per token (an expert's only when it is routed to),
//! so `decode_bytes_per_token × tokens/s` set beside a plain read's bandwidth
//! (`nx_syscalls::read_bandwidth`) says how close decoding is to its bound.

use nx_gguf::{Gguf, TensorInfo};

/// `(expert_used_count, expert_count)` of a mixture-of-experts file.
pub fn active_experts(gguf: &Gguf) -> Option<(u64, u64)> {
    let md = gguf.metadata();
    let arch = md.get_str("general.architecture").ok()?;
    let used = md.get_u64(&format!("{arch}.expert_used_count")).ok()?;
    let count = md.get_u64(&format!("{arch}.expert_count")).ok()?;
    (count > 0 && used <= count).then_some((used, count))
}

/// Weight bytes one decode step reads: every tensor in full except the token embedding,
/// of which it reads one row, plus the LM head: `output.weight` when present (already in
/// the sum), else the tied embedding table, read in full. Of the experts' 3-D tensors
/// (`*_exps.weight`) a token reads the `used` of `count` experts it is routed to.
pub fn decode_bytes_per_token(tensors: &[TensorInfo], experts: Option<(u64, u64)>) -> u64 {
    const EMBD: &str = "token_embd.weight";
    let mut total: u64 = tensors
        .iter()
        .filter(|t| t.name != EMBD)
        .map(|t| match experts {
            Some((used, count)) if t.name.ends_with("_exps.weight") => t.n_bytes / count * used,
            _ => t.n_bytes,
        })
        .sum();
    if let Some(embd) = tensors.iter().find(|t| t.name == EMBD) {
        total += embd.n_bytes / embd.n_rows().max(1);
        if !tensors.iter().any(|t| t.name == "output.weight") {
            total += embd.n_bytes;
        }
    }
    total
}
