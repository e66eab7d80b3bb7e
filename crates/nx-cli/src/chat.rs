//! `nx chat`: a terminal conversation with a model, reusing the KV cache between turns.
//!
//! `nx chat [--model F] [--system TEXT] [--chat-template NAME|FILE] [sampling flags]
//! [--ctx N] [-n N]` reads one user message per line from standard input (showing a
//! `> ` prompt only when standard input is a terminal), renders the whole conversation
//! with the chat template, prefills only the tokens that are new since the previous
//! turn, and streams the answer until the model ends its turn.
//!
//! - `/reset` starts a new conversation (the system message stays); `/exit` or end of
//!   input quits.
//! - Ctrl-C during an answer stops that answer (it is kept in the conversation);
//!   Ctrl-C at the prompt quits.
//! - When the context fills up, the answer ends with a note on stderr and the program
//!   keeps running; a turn that no longer fits is refused with a hint to `/reset`.
//! - `--verbose` prints, after each answer, how many prompt tokens came from the cache.
//!
//! The template is `--chat-template` (a built-in name — chatml, llama3, gemma — or a
//! Jinja file), else the GGUF's `tokenizer.chat_template`, else the built-in one for the
//! model's architecture. This module also builds `nx run --chat` prompts.

use std::io::{BufRead, IsTerminal, Write};
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use nx_bpe::Tokenizer;
use nx_run::{
    ChatError, ChatMessage, ChatSession, ChatTemplate, Event, Model, RunConfig, Runner,
    SamplerConfig, StopReason, TemplateChoice,
};

use crate::models::{apply_threads, resolve_model};
use crate::weights::open_model;

/// Arguments of `nx chat`.
#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    /// GGUF model file (default: $NX_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf, the
    /// default chat model, else $NX_CACHE/models/gemma-3-270m-q4_k_m.gguf, when fetched).
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// System message at the start of the conversation.
    #[arg(long, value_name = "TEXT")]
    pub system: Option<String>,
    /// Chat template: chatml, llama3, gemma, or a Jinja file (default: the model's own,
    /// else the built-in one for its architecture).
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Most tokens per answer (default: until the model ends its turn or the context
    /// is full).
    #[arg(long = "n-predict", short = 'n', value_name = "N")]
    pub n_predict: Option<usize>,
    #[command(flatten)]
    pub sampling: crate::sampling::SamplingArgs,
    #[command(flatten)]
    pub prefill_chunk: crate::models::PrefillChunkArg,
    /// Context size in tokens (the whole conversation), capped by the model's trained
    /// context.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub ctx: usize,
    /// Worker threads (passed on as NX_THREADS to the process-wide thread pool).
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub weights: crate::weights::WeightsArgs,
    /// After each answer, print token counts (cached / new) and speed on stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
}

impl ChatArgs {
    fn sampler(&self) -> SamplerConfig {
        self.sampling.config()
    }
}

/// The chat template for `model`: `--chat-template` if given, else the file's, else the
/// built-in one for its architecture.
pub fn template_for(
    model: &Model,
    tokenizer: &Tokenizer,
    chat_template: Option<&str>,
) -> Result<ChatTemplate> {
    let choice = chat_template.map(TemplateChoice::parse).transpose()?;
    Ok(ChatTemplate::for_model(
        model.gguf().metadata(),
        tokenizer,
        choice.as_ref(),
    )?)
}

/// `nx run --chat`: the token ids of a one-turn conversation (`user` as the user's
/// message) followed by the start of the assistant's turn.
pub fn single_turn_ids(
    model: &Model,
    tokenizer: &Tokenizer,
    chat_template: Option<&str>,
    user: &str,
) -> Result<Vec<u32>> {
    let template = template_for(model, tokenizer, chat_template)?;
    Ok(template.encode(tokenizer, &[ChatMessage::user(user)], true)?)
}

/// Set while an answer is being generated: Ctrl-C then stops the answer.
static GENERATING: AtomicBool = AtomicBool::new(false);
/// Set by Ctrl-C during an answer; the event callback turns it into a stop.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_sigint(_signal: libc::c_int) {
    // Only async-signal-safe work here: atomics, write(2) and _exit(2).
    if GENERATING.load(Ordering::SeqCst) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    } else {
        // SAFETY: write(2) and _exit(2) are async-signal-safe; the buffer is a static
        // byte string valid for its length.
        unsafe {
            libc::write(1, b"\n".as_ptr().cast(), 1);
            libc::_exit(130);
        }
    }
}

/// Installs the Ctrl-C handler (answers stop, the prompt quits).
#[cfg(unix)]
fn install_sigint_handler() -> Result<()> {
    // SAFETY: `action` is fully initialised (zeroed, then the handler, an empty mask and
    // SA_RESTART so reads at the prompt are not interrupted); `on_sigint` has the
    // signature sigaction expects and only does async-signal-safe work.
    let rc = unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        libc::sigaction(libc::SIGINT, &action, std::ptr::null_mut())
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("installing the Ctrl-C handler");
    }
    Ok(())
}

#[cfg(not(unix))]
fn install_sigint_handler() -> Result<()> {
    // Ctrl-C keeps its default meaning (quit) where there is no signal API.
    Ok(())
}

/// What a line of input asks for.
enum Input<'a> {
    Exit,
    Reset,
    Empty,
    Unknown(&'a str),
    Message(&'a str),
}

fn classify(line: &str) -> Input<'_> {
    let text = line.trim_end_matches(['\n', '\r']);
    match text.trim() {
        "/exit" | "/quit" => Input::Exit,
        "/reset" => Input::Reset,
        "" => Input::Empty,
        cmd if cmd.starts_with('/') && !cmd.contains(char::is_whitespace) => Input::Unknown(cmd),
        _ => Input::Message(text),
    }
}

pub fn run(args: &ChatArgs) -> Result<()> {
    apply_threads(args.threads)?;
    let sampler = args.sampler();
    sampler.validate()?;
    args.prefill_chunk.check()?;
    if args.ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    if args.n_predict == Some(0) {
        bail!("--n-predict must be at least 1");
    }
    // A bad template name fails before the model is opened.
    let choice = args
        .chat_template
        .as_deref()
        .map(TemplateChoice::parse)
        .transpose()?;

    let path = resolve_model(args.model.as_deref(), crate::models::ModelUse::Chat)?;
    let model = open_model(&path, &args.weights)?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("tokenizer of {}", path.display()))?,
    );
    let template = ChatTemplate::for_model(model.gguf().metadata(), &tokenizer, choice.as_ref())?;
    let n_ctx = args.ctx.min(model.config().n_ctx_train.max(1));
    let config = RunConfig {
        prefill_chunk: args.prefill_chunk.for_model(&model),
        n_ctx,
        token_logprobs: false,
        sampler,
        json_object: args.sampling.json_object,
        ..RunConfig::default()
    };
    let runner = Runner::new(model, Some(tokenizer), config)?;
    let mut session = ChatSession::new(runner, template, args.system.clone())?;
    session.set_max_answer_tokens(args.n_predict);
    install_sigint_handler()?;
    if args.verbose {
        eprintln!(
            "[model {} | chat template: {} | context {} tokens]",
            path.display(),
            session.template().origin(),
            n_ctx
        );
    }

    converse(&mut session, args.verbose)
}

/// Reads messages from standard input, one per line, and answers each, until the end of
/// input, `/exit`, or a closed standard output; `/reset` starts over.
fn converse(session: &mut ChatSession, verbose: bool) -> Result<()> {
    let stdin = std::io::stdin();
    let interactive = stdin.is_terminal();
    let mut input = stdin.lock();
    let stdout = std::io::stdout();
    let mut line = String::new();
    loop {
        if interactive {
            let mut out = stdout.lock();
            if write!(out, "> ").and_then(|_| out.flush()).is_err() {
                return Ok(());
            }
        }
        line.clear();
        if input
            .read_line(&mut line)
            .context("reading standard input")?
            == 0
        {
            break; // end of input
        }
        let message = match classify(&line) {
            Input::Exit => break,
            Input::Empty => continue,
            Input::Reset => {
                session.reset();
                eprintln!("[conversation reset]");
                continue;
            }
            Input::Unknown(cmd) => {
                eprintln!("[unknown command {cmd}: /reset starts over, /exit quits]");
                continue;
            }
            Input::Message(text) => text,
        };
        match answer(session, message, verbose)? {
            Flow::Continue => {}
            Flow::OutputClosed => return Ok(()),
        }
    }
    Ok(())
}

enum Flow {
    Continue,
    /// Standard output was closed (`nx chat | head`): stop quietly.
    OutputClosed,
}

/// One turn: streams the answer to stdout and reports how it ended on stderr.
fn answer(session: &mut ChatSession, message: &str, verbose: bool) -> Result<Flow> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut write_error: Option<std::io::Error> = None;
    let mut ends_with_newline = true;
    INTERRUPTED.store(false, Ordering::SeqCst);
    GENERATING.store(true, Ordering::SeqCst);
    let result = session.respond(message, |event| {
        let text = match event {
            Event::Token { text, .. } => text,
            Event::Done { flushed, .. } => flushed,
        };
        if !text.is_empty() {
            ends_with_newline = text.ends_with('\n');
            if let Err(e) = out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
                write_error = Some(e);
                return ControlFlow::Break(());
            }
        }
        if INTERRUPTED.load(Ordering::SeqCst) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    GENERATING.store(false, Ordering::SeqCst);
    if let Some(e) = write_error {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Ok(Flow::OutputClosed);
        }
        return Err(e).context("writing the answer");
    }
    let turn = match result {
        Ok(turn) => turn,
        Err(ChatError::ContextFull { needed, n_ctx }) => {
            eprintln!(
                "[context full: this turn needs {needed} of {n_ctx} positions; \
                 /reset starts a new conversation (or raise --ctx)]"
            );
            return Ok(Flow::Continue);
        }
        // The template refused or failed on this conversation: say so, keep running.
        Err(
            e @ (ChatError::Raised { .. } | ChatError::Render { .. } | ChatError::TooLong { .. }),
        ) => {
            eprintln!("[{e}]");
            return Ok(Flow::Continue);
        }
        Err(e) => return Err(e.into()),
    };
    if !ends_with_newline && writeln!(out).and_then(|_| out.flush()).is_err() {
        return Ok(Flow::OutputClosed);
    }
    if turn.context_full {
        eprintln!(
            "[context full ({} tokens): the answer was cut short; /reset starts a new \
             conversation]",
            session.runner().n_ctx()
        );
    } else if turn.completion.reason == StopReason::Callback {
        eprintln!("[answer interrupted]");
    }
    if verbose {
        let s = &turn.completion.stats;
        eprintln!(
            "[prompt: {} tokens ({} reused from cache, {} new) in {:.2} s | answer: {} \
             tokens, {:.1} tok/s | stop: {}]",
            turn.reused_tokens + turn.new_tokens,
            turn.reused_tokens,
            turn.new_tokens,
            s.prefill_secs,
            s.generated_tokens,
            s.gen_tps,
            turn.completion.reason
        );
    }
    Ok(Flow::Continue)
}
