//! Thread and placement invariance of the whole forward pass on the real default model:
//! the logits of a prefill chunk and of a decode step are bit-identical on 1, 2 and 3
//! threads, and with the weights mapped or resident in huge-page memory.

use std::path::PathBuf;

use nx_llama_stack::{ForwardState, KvDtype, Model, Placement};

fn default_model() -> PathBuf {
    let cache = match std::env::var_os("NX_CACHE") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/nx"),
    };
    cache.join("models/gemma-3-270m-q4_k_m.gguf")
}

/// Logits of the last prompt token, then of one decode step, on `threads` threads.
fn logits(model: &mut Model, threads: usize) -> Vec<f32> {
    model.set_threads(threads);
    assert_eq!(model.threads(), threads);
    let prompt = [2u32, 818, 5279];
    let mut cache = model.new_cache(prompt.len() + 1, KvDtype::F16).unwrap();
    let mut state = ForwardState::default();
    let mut out = Vec::new();
    let mut step = Vec::new();
    model
        .forward(
            &prompt,
            0,
            &mut cache,
            &[prompt.len() - 1],
            &mut state,
            &mut step,
        )
        .unwrap();
    out.extend_from_slice(&step);
    model
        .forward(
            &[236761],
            prompt.len(),
            &mut cache,
            &[0],
            &mut state,
            &mut step,
        )
        .unwrap();
    out.extend_from_slice(&step);
    out
}

#[test]
fn real_model_logits_do_not_depend_on_the_thread_count() {
    let path = default_model();
    if !path.exists() {
        eprintln!("SKIP: {} not present", path.display());
        return;
    }
    let mut model = Model::open(&path).unwrap();
    let reference = logits(&mut model, 1);
    assert!(reference.iter().all(|v| v.is_finite()));
    for threads in [2, 3] {
        let got = logits(&mut model, threads);
        assert_eq!(got.len(), reference.len());
        let first_diff = got
            .iter()
            .zip(&reference)
            .position(|(a, b)| a.to_bits() != b.to_bits());
        assert_eq!(first_diff, None, "{threads} threads differ from 1 thread");
    }
}

#[test]
fn resident_weights_give_the_mapped_logits() {
    let path = default_model();
    if !path.exists() {
        eprintln!("SKIP: {} not present", path.display());
        return;
    }
    let mut mapped = Model::open_placed(&path, Placement::Mapped).unwrap();
    assert_eq!(mapped.gguf().placement(), Placement::Mapped);
    let mut resident = Model::open_placed(&path, Placement::Resident).unwrap();
    assert_eq!(resident.gguf().placement(), Placement::Resident);
    assert_eq!(mapped.gguf().bytes(), resident.gguf().bytes());
    let (a, b) = (logits(&mut mapped, 2), logits(&mut resident, 2));
    assert!(a.iter().all(|v| v.is_finite()));
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&a) == bits(&b), "resident weights changed the logits");
}
