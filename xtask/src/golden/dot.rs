//! `cargo xtask golden dot`: the reference engine's own dot kernels on recorded inputs.
//!
//! Compiles `xtask/scripts/ref_vec_dot.c` against the cached llama.cpp build (its
//! `libggml-cpu`, built with `GGML_NATIVE`), feeds it weight rows and f32 activations, and
//! records what the CPU backend's one-token path computes from them: the activations
//! quantized by `from_float` of the weight's `vec_dot_type`, and the `vec_dot` result.
//! `crates/nx-lazy-weight/tests/dot_reference.rs` then requires nx's activation quantizers
//! to give the same bytes and every tier's kernel the same f32 bits. The inputs come from
//! a seeded generator: per type, rows of two lengths (one an odd number of blocks where
//! the format allows), weights both from nx's quantizers and from random block bytes
//! with finite scales, activations at several magnitudes with zeros and a spike.
//!
//! Output: `fixtures/dot/TYPE.json`, one per weight type; `--check` regenerates in memory
//! and compares. The kernels are the machine's: the committed files were recorded on the
//! CPU the note names (AVX-512), where llama.cpp's x86 kernels are the AVX2/AVX-512 ones.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use nx_gguf::GgmlType;
use serde_json::json;

use super::dequant::TempDir;
use crate::fetch::llama_src_dir;
use crate::reference::{build_dir, ensure_reference, DEFAULT_JOBS};
use crate::synth::SplitMix64;
use crate::util::{hex, run_checked, workspace_root};

/// Where the fixtures live, relative to the workspace root.
const FIXTURE_DIR: &str = "fixtures/dot";

/// The weight types recorded, with their two row lengths.
const CASES: &[(GgmlType, [usize; 2])] = &[
    (GgmlType::Q4_0, [256, 672]),
    (GgmlType::Q4_1, [256, 672]),
    (GgmlType::Q5_0, [256, 672]),
    (GgmlType::Q5_1, [256, 672]),
    (GgmlType::Q8_0, [256, 672]),
    (GgmlType::IQ4_NL, [256, 672]),
    // Even block counts only: ggml's scalar tail for an odd last block is `sumf += d·sumi`,
    // which GCC fuses or not depending on -mtune (fused on the machine that recorded
    // IQ4_NL's K = 672 cases, unfused under znver tuning), so it is no stable oracle.
    (GgmlType::MXFP4, [256, 640]),
    (GgmlType::Q2_K, [256, 768]),
    (GgmlType::Q3_K, [256, 768]),
    (GgmlType::Q4_K, [256, 768]),
    (GgmlType::Q5_K, [256, 768]),
    (GgmlType::Q6_K, [256, 768]),
    (GgmlType::IQ4_XS, [256, 768]),
    (GgmlType::TQ2_0, [256, 768]),
    (GgmlType::TQ1_0, [256, 768]),
    // The grid formats: nx has no quantizer for them (ggml's need an importance matrix
    // and a lattice search), so every case is random block bytes.
    (GgmlType::IQ2_XXS, [256, 768]),
    (GgmlType::IQ2_XS, [256, 768]),
    (GgmlType::IQ2_S, [256, 768]),
    (GgmlType::IQ3_XXS, [256, 768]),
    (GgmlType::IQ3_S, [256, 768]),
    (GgmlType::IQ1_S, [768, 2048]),
    (GgmlType::IQ1_M, [256, 768]),
    // F16 against F16-rounded activations: 672 leaves a 32-element tail past the kernel's
    // 64-element steps.
    (GgmlType::F16, [256, 672]),
    // BF16 likewise (`vdpbf16ps` on CPUs with AVX512_BF16), with tiny weights in two cases:
    // the instruction reads subnormals as zero, the tail's f32 products do not.
    (GgmlType::BF16, [256, 672]),
];

/// Cases per row length: weights from the quantizer for the even ones, raw bytes else.
const CASES_PER_LENGTH: usize = 4;

/// More cases for IQ1_S: whether the reference fuses its scalar `acc += d·sum` of the
/// offset part shows in the last bit of only some rows.
fn cases_per_length(ty: GgmlType) -> usize {
    if ty == GgmlType::IQ1_S {
        12
    } else {
        CASES_PER_LENGTH
    }
}

/// Regenerates (or, with `check`, verifies) the dot fixtures.
pub fn run(check: bool) -> Result<()> {
    ensure_reference(DEFAULT_JOBS)?;
    let tmp = TempDir::new("dot-golden")?;
    let harness = build_harness(tmp.path())?;
    let dir = workspace_root().join(FIXTURE_DIR);
    let mut stale = Vec::new();
    for &(ty, lengths) in CASES {
        let inputs = inputs_for(ty, lengths);
        let outputs = run_harness(&harness, &inputs)?;
        let doc = fixture_json(ty, &inputs, &outputs);
        let path = dir.join(format!("{}.json", ty.name().to_lowercase()));
        let text = serde_json::to_string_pretty(&doc)? + "\n";
        if check {
            let committed = std::fs::read_to_string(&path).unwrap_or_default();
            if committed != text {
                stale.push(ty.name());
            }
        } else {
            std::fs::create_dir_all(&dir)?;
            std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        }
    }
    if !stale.is_empty() {
        bail!(
            "fixtures/dot differs for {}; run `cargo xtask golden dot` to regenerate",
            stale.join(", ")
        );
    }
    eprintln!(
        "golden dot: {} {} types in {}",
        if check { "checked" } else { "wrote" },
        CASES.len(),
        dir.display()
    );
    Ok(())
}

/// Compiles the harness against the cached build.
fn build_harness(tmp: &Path) -> Result<PathBuf> {
    let src = workspace_root().join("xtask/scripts/ref_vec_dot.c");
    let out = tmp.join("ref_vec_dot");
    let lib_dir = build_dir().join("bin");
    let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cc.arg("-O2")
        .arg("-I")
        .arg(llama_src_dir().join("ggml/include"))
        .arg(&src)
        .arg("-L")
        .arg(&lib_dir)
        .args(["-lggml-cpu", "-lggml-base"])
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-o")
        .arg(&out);
    run_checked(&mut cc)?;
    Ok(out)
}

/// One recorded case.
struct Input {
    ty: GgmlType,
    row_len: usize,
    weights: Vec<u8>,
    acts: Vec<f32>,
    origin: &'static str,
}

/// The harness's answer to one case.
struct Output {
    acts_quantized: Vec<u8>,
    dot: f32,
}

/// Offsets of the f16 scale fields inside a block of `ty` (random bytes elsewhere;
/// MXFP4's byte scale is drawn in `random_blocks`).
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
        GgmlType::IQ4_XS => &[0],
        GgmlType::IQ2_XXS | GgmlType::IQ2_XS | GgmlType::IQ2_S => &[0],
        GgmlType::IQ3_XXS | GgmlType::IQ3_S | GgmlType::IQ1_S => &[0],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::TQ2_0 => &[64],
        GgmlType::TQ1_0 => &[52],
        _ => &[],
    }
}

/// nx's rounding of an f32 to a 16-bit float type's bits.
type HalfEncode = fn(f32) -> u16;

/// For the 16-bit float types, their [`HalfEncode`] and the name of the cases' origin.
fn half_float(ty: GgmlType) -> Option<(HalfEncode, &'static str)> {
    match ty {
        GgmlType::F16 => Some((nx_lazy_weight::formats::f32_to_f16, "f16-values")),
        GgmlType::BF16 => Some((nx_lazy_weight::formats::f32_to_bf16, "bf16-values")),
        _ => None,
    }
}

fn inputs_for(ty: GgmlType, lengths: [usize; 2]) -> Vec<Input> {
    let mut rng = SplitMix64(0x00D0_7000 + ty.id() as u64);
    let mut inputs = Vec::new();
    for row_len in lengths {
        for case in 0..cases_per_length(ty) {
            let scale = 2f32.powi((case % CASES_PER_LENGTH) as i32 * 3 - 6);
            let mut acts: Vec<f32> = (0..row_len).map(|_| rng.normal() * scale).collect();
            acts[1] = 0.0;
            acts[row_len / 3] *= 25.0;
            if case == 1 {
                // An all-zero block: the activation scale is 0.
                acts[32..64].fill(0.0);
            }
            let has_quantizer = nx_lazy_weight::formats::block_format(ty)
                .is_some_and(|f| f.quantize_block.is_some());
            let (weights, origin) = if let Some((encode, origin)) = half_float(ty) {
                // Finite values only (random bytes would hold NaNs and infinities); BF16's
                // cases 2 and 3 near and below its smallest normal value.
                let magnitude = match (ty, case % 4) {
                    (GgmlType::BF16, 2) => 2f32.powi(-122),
                    (GgmlType::BF16, 3) => 2f32.powi(-128),
                    _ => 0.05,
                };
                let bytes = (0..row_len)
                    .flat_map(|_| encode(rng.normal() * magnitude).to_le_bytes())
                    .collect();
                (bytes, origin)
            } else if case % 2 == 0 && has_quantizer {
                let values: Vec<f32> = (0..row_len).map(|_| rng.normal() * 0.05).collect();
                let mut bytes = vec![0u8; ty.row_bytes(row_len as u64).unwrap() as usize];
                nx_lazy_weight::quantize_row(ty, &values, &mut bytes)
                    .expect("every recorded type has a quantizer");
                (bytes, "quantized")
            } else {
                (random_blocks(&mut rng, ty, row_len), "random-bytes")
            };
            inputs.push(Input {
                ty,
                row_len,
                weights,
                acts,
                origin,
            });
        }
    }
    inputs
}

fn random_blocks(rng: &mut SplitMix64, ty: GgmlType, row_len: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..row_len / ty.block_size() {
        let mut block: Vec<u8> = (0..ty.type_size())
            .map(|_| (rng.next_u64() >> 56) as u8)
            .collect();
        for &off in scale_offsets(ty) {
            // IQ1_S's scales stay within one octave, so that no one block outweighs the
            // others and the last bits of its offset sum stay visible.
            let magnitude = if ty == GgmlType::IQ1_S {
                (-7.0 + rng.uniform()).exp2()
            } else {
                (-12.0 + 12.0 * rng.uniform()).exp2()
            };
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            let bits = nx_lazy_weight::formats::f32_to_f16(sign * magnitude);
            block[off..off + 2].copy_from_slice(&bits.to_le_bytes());
        }
        if ty == GgmlType::MXFP4 {
            // The E8M0 scale byte, 2^(e-128) in 2^[-13, 0) like the f16 scales.
            block[0] = 115 + (rng.next_u64() >> 56) as u8 % 13;
        }
        if ty == GgmlType::IQ1_M {
            // The f16 scale's four nibbles are the top nibbles of the u16 words at 48..56.
            let magnitude = (-12.0 + 12.0 * rng.uniform()).exp2();
            let sign = if rng.next_u64() & 1 == 0 { 1.0 } else { -1.0 };
            let bits = nx_lazy_weight::formats::f32_to_f16(sign * magnitude);
            for k in 0..4 {
                let at = 49 + 2 * k;
                block[at] = (block[at] & 0x0f) | (((bits >> (4 * k)) & 0xf) as u8) << 4;
            }
        }
        out.extend_from_slice(&block);
    }
    out
}

fn run_harness(harness: &Path, inputs: &[Input]) -> Result<Vec<Output>> {
    let mut stdin = Vec::new();
    for input in inputs {
        stdin.extend_from_slice(&(input.ty.id() as i32).to_le_bytes());
        stdin.extend_from_slice(&(input.row_len as i32).to_le_bytes());
        stdin.extend_from_slice(&input.weights);
        for v in &input.acts {
            stdin.extend_from_slice(&v.to_le_bytes());
        }
    }
    let mut child = Command::new(harness)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("run {}", harness.display()))?;
    // Written from a thread: the harness answers as it reads, and once its answers fill
    // the pipe it would wait for us while we still wait to write.
    let mut pipe = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || pipe.write_all(&stdin));
    let out = child.wait_with_output()?;
    writer
        .join()
        .map_err(|_| anyhow::anyhow!("stdin writer panicked"))??;
    if !out.status.success() {
        bail!("{} failed: {}", harness.display(), out.status);
    }
    let mut at = 0;
    let mut outputs = Vec::new();
    for input in inputs {
        let act_type = nx_lazy_weight::vec_dot_type(input.ty).unwrap();
        let n = act_type.row_bytes(input.row_len as u64).unwrap() as usize;
        let Some(chunk) = out.stdout.get(at..at + n + 4) else {
            bail!("{}: output ended early", harness.display());
        };
        outputs.push(Output {
            acts_quantized: chunk[..n].to_vec(),
            dot: f32::from_le_bytes(chunk[n..].try_into().unwrap()),
        });
        at += n + 4;
    }
    Ok(outputs)
}

fn fixture_json(ty: GgmlType, inputs: &[Input], outputs: &[Output]) -> serde_json::Value {
    let cases: Vec<serde_json::Value> = inputs
        .iter()
        .zip(outputs)
        .map(|(input, output)| {
            let acts: Vec<u8> = input.acts.iter().flat_map(|v| v.to_le_bytes()).collect();
            json!({
                "row_len": input.row_len,
                "weights": input.origin,
                "weights_hex": hex(&input.weights),
                "acts_f32_le_hex": hex(&acts),
                "acts_quantized_hex": hex(&output.acts_quantized),
                "dot_f32_bits": format!("{:08x}", output.dot.to_bits()),
            })
        })
        .collect();
    json!({
        "type": ty.name(),
        "act_type": nx_lazy_weight::vec_dot_type(ty).unwrap().name(),
        "generator": "cargo xtask golden dot: llama.cpp ggml-cpu from_float + vec_dot (xtask/scripts/ref_vec_dot.c)",
        "cases": cases,
    })
}
