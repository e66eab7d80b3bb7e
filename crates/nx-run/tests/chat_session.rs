//! Chat sessions on the tiny model: later turns prefill only what is new and still
//! answer exactly as a fresh runner given the whole rendered conversation; answers the
//! template re-renders differently, answers stopped by the caller, `reset` and a full
//! context all keep that true.

mod common;

use std::ops::ControlFlow;

use common::{load, TinyOptions};
use nx_run::{
    ChatError, ChatMessage, ChatSession, ChatTemplate, Event, Prompt, RunConfig, Runner,
    SamplerConfig, StopReason,
};

/// One line per message, `u`/`a`/`s` for the role (characters of the tiny vocabulary).
const PLAIN: &str = "{% for m in messages %}{{ m.role[0] }} {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}a {% endif %}";

/// Like [`PLAIN`], but every assistant message is rendered as `the`, so an answer is
/// never a prefix of the next rendering.
const FORGETFUL: &str = "{% for m in messages %}{% if m.role == 'assistant' %}a the\n{% else %}{{ m.role[0] }} {{ m.content }}\n{% endif %}{% endfor %}{% if add_generation_prompt %}a {% endif %}";

fn config(n_ctx: usize) -> RunConfig {
    RunConfig {
        n_ctx,
        prefill_chunk: 5,
        sampler: SamplerConfig::greedy(),
        ..RunConfig::default()
    }
}

fn session(template: &str, n_ctx: usize, max_answer: Option<usize>) -> ChatSession {
    let (model, tok) = load(TinyOptions::default());
    let runner = Runner::new(model, Some(tok), config(n_ctx)).unwrap();
    let template = ChatTemplate::new(template, "test", "<s>", "</s>").unwrap();
    let mut s = ChatSession::new(runner, template, Some("the sky".into())).unwrap();
    s.set_max_answer_tokens(max_answer);
    s
}

/// Greedy answer of a fresh runner to the whole conversation `messages` (ending with
/// the user's turn), rendered by the session's template.
fn fresh_answer(s: &ChatSession, messages: &[ChatMessage], max_tokens: usize) -> Vec<u32> {
    let tok = s.runner().tokenizer().unwrap();
    let ids = s.template().encode(tok, messages, true).unwrap();
    let (model, tok) = load(TinyOptions::default());
    let mut cfg = config(256);
    cfg.max_tokens = max_tokens;
    cfg.prefill_chunk = 64;
    let mut r = Runner::new(model, Some(tok), cfg).unwrap();
    r.generate(Prompt::Ids(ids), |_| ControlFlow::Continue(()))
        .unwrap()
        .tokens
}

fn say(s: &mut ChatSession, user: &str) -> nx_run::ChatTurn {
    s.respond(user, |_| ControlFlow::Continue(())).unwrap()
}

/// The conversation before the last answer.
fn before_answer(s: &ChatSession) -> Vec<ChatMessage> {
    let m = s.messages();
    m[..m.len() - 1].to_vec()
}

#[test]
fn later_turns_reuse_the_cache_and_answer_as_a_fresh_run() {
    let mut s = session(PLAIN, 256, Some(6));
    let t1 = say(&mut s, "the cat sat");
    assert_eq!(t1.reused_tokens, 0);
    assert_eq!(
        t1.completion.tokens,
        fresh_answer(&s, &before_answer(&s), 6)
    );
    assert_eq!(s.messages().len(), 3);
    assert_eq!(s.messages()[2], ChatMessage::assistant(t1.text.clone()));

    let in_cache = s.runner().tokens().len();
    let t2 = say(&mut s, "the dog ran");
    // Everything of turn 1 up to its answer was reused; only the rest was prefilled.
    // (The answer itself may be re-tokenized differently: the tiny model's output is
    // not text that SentencePiece would produce.)
    assert!(
        t2.reused_tokens >= in_cache - t1.completion.tokens.len(),
        "{t2:?}"
    );
    assert_eq!(t2.completion.stats.prompt_tokens, t2.new_tokens);
    assert_eq!(
        t2.completion.tokens,
        fresh_answer(&s, &before_answer(&s), 6)
    );

    let t3 = say(&mut s, "it was good");
    assert!(t3.reused_tokens > t2.reused_tokens);
    assert_eq!(
        t3.completion.tokens,
        fresh_answer(&s, &before_answer(&s), 6)
    );
}

#[test]
fn a_differently_rendered_answer_is_re_prefilled() {
    let mut s = session(FORGETFUL, 256, Some(6));
    say(&mut s, "the cat sat");
    let in_cache = s.runner().tokens();
    let t2 = say(&mut s, "the dog ran");
    // The rendering of the answer differs, so less than the whole sequence was kept...
    assert!(t2.reused_tokens < in_cache.len(), "{t2:?}");
    assert!(t2.reused_tokens > 0);
    // ...and the answer is still that of a fresh run.
    assert_eq!(
        t2.completion.tokens,
        fresh_answer(&s, &before_answer(&s), 6)
    );
}

#[test]
fn an_answer_stopped_by_the_caller_is_kept_and_the_next_turn_is_right() {
    let mut s = session(PLAIN, 256, Some(6));
    let mut streamed = String::new();
    let mut n = 0;
    let t1 = s
        .respond("the cat sat", |e| {
            match e {
                Event::Token { text, .. } => {
                    streamed.push_str(text);
                    n += 1;
                }
                Event::Done { flushed, .. } => streamed.push_str(flushed),
            }
            if n == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
    assert_eq!(t1.completion.reason, StopReason::Callback);
    assert_eq!(t1.completion.tokens.len(), 2);
    assert!(!t1.context_full);
    assert_eq!(t1.text, streamed);
    assert_eq!(
        s.messages().last().unwrap(),
        &ChatMessage::assistant(streamed)
    );

    let t2 = say(&mut s, "the dog ran");
    assert_eq!(
        t2.completion.tokens,
        fresh_answer(&s, &before_answer(&s), 6)
    );
}

#[test]
fn reset_forgets_the_conversation_but_keeps_the_system_message() {
    let mut s = session(PLAIN, 256, Some(5));
    let first = say(&mut s, "the cat sat");
    say(&mut s, "the dog ran");
    s.reset();
    assert_eq!(s.messages(), &[ChatMessage::system("the sky")]);
    assert_eq!(s.runner().cached_len(), 0);
    assert!(s.runner().tokens().is_empty());
    let again = say(&mut s, "the cat sat");
    assert_eq!(again.reused_tokens, 0);
    assert_eq!(again.completion.tokens, first.completion.tokens);
    assert_eq!(again.text, first.text);
}

#[test]
fn a_full_context_ends_the_answer_and_then_refuses_new_turns() {
    let n_ctx = 48;
    let mut s = session(PLAIN, n_ctx, None);
    let mut saw_full_answer = false;
    for turn in 0..20 {
        let before = s.messages().to_vec();
        let cached = s.runner().tokens();
        match s.respond("the cat sat on the mat", |_| ControlFlow::Continue(())) {
            Ok(t) => {
                assert!(t.reused_tokens + t.new_tokens + t.completion.tokens.len() <= n_ctx);
                if t.completion.reason == StopReason::MaxTokens {
                    // Without an answer cap, only the context stops an answer this way.
                    assert!(t.context_full, "{t:?}");
                    assert_eq!(
                        t.reused_tokens + t.new_tokens + t.completion.tokens.len(),
                        n_ctx
                    );
                    saw_full_answer = true;
                } else {
                    assert!(!t.context_full);
                }
            }
            Err(ChatError::ContextFull { needed, n_ctx: n }) => {
                assert_eq!(n, n_ctx);
                assert!(needed > n_ctx);
                // Nothing changed: neither the conversation nor the cache.
                assert_eq!(s.messages(), &before[..]);
                assert_eq!(s.runner().tokens(), cached);
                assert!(turn > 0, "the first turn fits");
                // After a reset the same turn fits again.
                s.reset();
                assert!(s
                    .respond("the cat sat on the mat", |_| ControlFlow::Continue(()))
                    .is_ok());
                assert!(
                    saw_full_answer,
                    "some answer should have hit the context first"
                );
                return;
            }
            Err(e) => panic!("{e}"),
        }
    }
    panic!("the context never filled");
}

#[test]
fn an_answer_cap_is_not_a_full_context() {
    let mut s = session(PLAIN, 256, Some(3));
    let t = say(&mut s, "the cat sat");
    if t.completion.reason == StopReason::MaxTokens {
        assert_eq!(t.completion.tokens.len(), 3);
    }
    assert!(!t.context_full);
}

#[test]
fn a_session_needs_a_tokenizer() {
    let (model, _) = load(TinyOptions::default());
    let runner = Runner::new(model, None, config(64)).unwrap();
    let template = ChatTemplate::new(PLAIN, "test", "", "").unwrap();
    assert!(matches!(
        ChatSession::new(runner, template, None),
        Err(ChatError::NoTokenizer)
    ));
}
