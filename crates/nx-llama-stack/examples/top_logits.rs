//! Debug aid: prints the top-5 next tokens after a list of token ids.
//! `cargo run --release -p nx-llama-stack --example top_logits -- MODEL 2,818,5279`

use nx_llama_stack::{ForwardState, KvDtype, Model};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::open(&args[1])?;
    let ids: Vec<u32> = args[2]
        .split(',')
        .map(|s| s.trim().parse())
        .collect::<Result<_, _>>()?;
    let dtype = if std::env::var("KV").as_deref() == Ok("f32") {
        KvDtype::F32
    } else {
        KvDtype::F16
    };
    let mut cache = model.new_cache(ids.len() + 8, dtype)?;
    let mut state = ForwardState::default();
    let mut logits = Vec::new();
    let t0 = std::time::Instant::now();
    model.forward(
        &ids,
        0,
        &mut cache,
        &[ids.len() - 1],
        &mut state,
        &mut logits,
    )?;
    let dt = t0.elapsed();
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let lse = max
        + logits
            .iter()
            .map(|&l| ((l - max) as f64).exp())
            .sum::<f64>()
            .ln() as f32;
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
    for &i in idx.iter().take(5) {
        println!("{i}\t{:.5}\t(logit {:.4})", logits[i] - lse, logits[i]);
    }
    eprintln!(
        "{} tokens in {:?} ({} threads)",
        ids.len(),
        dt,
        model.threads()
    );
    Ok(())
}
