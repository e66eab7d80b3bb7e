//! EQUIV-4: speculative decoding never changes the answer. With prompt lookup and with
//! a draft model, draft lengths 1 to 8, several prefill chunk sizes, 1 and 2 threads,
//! greedy and sampled, the token ids, log-probs and alternatives equal plain decoding
//! bit for bit — on the synthetic fixtures (another fixture with the same vocabulary as
//! the draft model: its drafts are mostly wrong) and on the default model (drafted by
//! itself, and by prompt lookup over grounded prompts).

#[path = "common/equiv3.rs"]
mod equiv3;

use equiv3::{cache_dir, check_speculation, open, request};
use nx_run::Request;

/// Half grounded (a passage given twice, so lookup finds what comes next), half not;
/// every third greedy without log-probabilities (its verification rows may then be
/// bounded instead of computed in full, `HeadChoice`).
fn requests(n: usize, n_vocab: usize, max_tokens: usize, salt: u32) -> Vec<Request> {
    equiv3::prompts(n, n_vocab, 300, salt)
        .into_iter()
        .enumerate()
        .map(|(i, mut p)| {
            if i % 2 == 0 {
                let again = p[p.len() / 2..].to_vec();
                p.extend(again);
            }
            let r = request(p, max_tokens, i % 3 == 1, 77 + i as u64);
            if i % 3 == 2 {
                Request {
                    logprobs: 0,
                    token_logprobs: false,
                    ..r
                }
            } else {
                r
            }
        })
        .collect()
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv4_synthetic_fixtures() {
    let synth = |name: &str| cache_dir().join("synth").join(format!("{name}.gguf"));
    for threads in [1, 2] {
        let (target, tok) = open(synth("qwen2-tiny"), threads);
        let (draft, _) = open(synth("qwen3-tiny"), threads);
        let reqs = requests(8, target.config().n_vocab, 12, threads as u32);
        let (drafted, accepted) = check_speculation(&target, Some(&draft), &tok, &reqs);
        eprintln!("EQUIV-4 qwen2-tiny (draft qwen3-tiny), {threads} threads: {accepted} of {drafted} drafts kept, every answer identical");
        assert!(
            drafted > accepted,
            "most drafts of an unrelated model are wrong"
        );
        // The target as its own draft model: greedy drafts are kept, sampled ones often not.
        let (drafted, accepted) = check_speculation(&target, Some(&target), &tok, &reqs);
        eprintln!("EQUIV-4 qwen2-tiny (drafting for itself), {threads} threads: {accepted} of {drafted} drafts kept, every answer identical");
        assert!(accepted > 0 && accepted < drafted);
    }
    for fixture in ["llama-tiny", "qwen3-tiny"] {
        let (model, tok) = open(synth(fixture), 2);
        let reqs = requests(6, model.config().n_vocab, 12, 9);
        let (drafted, accepted) = check_speculation(&model, None, &tok, &reqs);
        eprintln!("EQUIV-4 {fixture} (prompt lookup): {accepted} of {drafted} drafts kept, every answer identical");
    }
}

#[test]
#[ignore = "gate: run by cargo xtask gate"]
fn equiv4_default_model() {
    let path = cache_dir().join("models/gemma-3-270m-q4_k_m.gguf");
    for threads in [1, 2] {
        let (model, tok) = open(path.clone(), threads);
        let reqs = requests(4, model.config().n_vocab, 10, 50 + threads as u32);
        // The model as its own draft: drafts mostly right for greedy requests.
        let (drafted, accepted) = check_speculation(&model, Some(&model), &tok, &reqs);
        eprintln!("EQUIV-4 default model, {threads} threads: {accepted} of {drafted} drafts kept, every answer identical");
        assert!(accepted > 0);
    }
}
