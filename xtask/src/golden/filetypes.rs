//! `cargo xtask golden filetypes`: the tensor types the pinned `llama-quantize` picks for
//! each tier-1 file type on the two-layer file-type shape, into
//! `fixtures/synth/filetypes.txt`, which the `llama-ft-*` synthetic shapes follow.
//!
//! For each type of [`crate::synth::FILE_TYPES`] it makes (or reuses) the `llama-ftref-*`
//! file, which llama-quantize quantizes from an all-Q8_0 source, and reads the type of
//! every tensor back from it. The choice depends on tensor names, shapes and the file
//! type alone, so the synthetic files of CI, quantized by nx, carry exactly the types a
//! llama-quantize file of that type has, fallbacks for the 672-wide rows included.

use anyhow::{bail, Context, Result};
use nx_gguf::Gguf;

use crate::synth::{ensure, FILE_TYPES};
use crate::util::workspace_root;

const OUT: &str = "fixtures/synth/filetypes.txt";

/// Entry point (see the module docs).
pub fn run(check: bool) -> Result<()> {
    let mut text = String::from(
        "# The tensor types the pinned llama-quantize picks per file type for the two-layer\n\
         # file-type shape (`cargo xtask golden filetypes`; do not edit). Lines: FILE_TYPE\n\
         # general.file_type N, then FILE_TYPE TENSOR TYPE.\n",
    );
    for ftype in FILE_TYPES {
        let path = ensure(&format!("llama-ftref-{ftype}"))?;
        let gguf = Gguf::open(&path).with_context(|| format!("cannot open {}", path.display()))?;
        let number = gguf
            .metadata()
            .get_u32("general.file_type")
            .with_context(|| format!("{} has no general.file_type", path.display()))?;
        text.push_str(&format!("{ftype} general.file_type {number}\n"));
        for tensor in gguf.tensors() {
            text.push_str(&format!(
                "{ftype} {} {}\n",
                tensor.name,
                tensor.ggml_type.name()
            ));
        }
    }
    let path = workspace_root().join(OUT);
    if check {
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed != text {
            bail!(
                "{OUT} differs from what llama-quantize picks; run `cargo xtask golden filetypes`, \
                 then `cargo xtask synth --update-hashes` and `cargo xtask golden forward`"
            );
        }
    } else {
        std::fs::write(&path, &text).with_context(|| format!("write {}", path.display()))?;
    }
    eprintln!(
        "golden filetypes: {} the types of {} file types in {OUT}",
        if check { "checked" } else { "wrote" },
        FILE_TYPES.len()
    );
    Ok(())
}
