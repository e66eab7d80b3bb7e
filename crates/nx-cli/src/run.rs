//! `nx run`: generate a completion of a prompt and stream it to stdout.
//!
//! `nx run [--model F] (--prompt TEXT | -f FILE | --prompt-ids 1,2,3) [-n N] [sampling
//! flags] [--stop STR]... [--json [--logprobs K]]` prints the generated text as it is
//! produced (flushed per token) and, at the end, prompt and generation speeds on
//! stderr. With `--json`, stdout carries one JSON object per generated token
//! (`{"id","text","logprob","top":[{"id","logprob"},…]}`) and a last object with the
//! stop reason and the statistics (`{"stop","text","prompt_tokens",…}`; its `text` is
//! any output held back until the end, usually empty).
//!
//! A text prompt gets BOS as the vocabulary asks (unless `--no-special`), and
//! special-token texts in it (e.g. `<start_of_turn>`) are read as those tokens, as
//! llama.cpp's tools do. The KV cache is sized for this one completion (prompt + `-n`),
//! at most `--ctx` positions, which is itself capped by the model's trained context.

use std::io::{Read, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use nx_bpe::{EncodeOptions, Tokenizer};
use nx_run::{Event, Model, Prompt, RunConfig, Runner, SamplerConfig, Stats, StopReason};
use serde_json::json;

use crate::models::{apply_threads, resolve_model, ModelUse};

/// Arguments of `nx run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// GGUF model file (default: $NX_CACHE/models/gemma-3-270m-q4_k_m.gguf, when fetched;
    /// with --chat $NX_CACHE/models/SmolLM2-135M-Instruct.Q4_1.gguf first).
    #[arg(long, short = 'm', value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long, short = 'p', value_name = "TEXT", conflicts_with_all = ["file", "prompt_ids"])]
    pub prompt: Option<String>,
    /// Read the prompt text from FILE (`-` for standard input).
    #[arg(
        long = "file",
        short = 'f',
        value_name = "FILE",
        conflicts_with = "prompt_ids"
    )]
    pub file: Option<PathBuf>,
    /// The prompt as comma-separated token ids, used as given (no BOS is added).
    #[arg(long, value_name = "IDS")]
    pub prompt_ids: Option<String>,
    /// Most tokens to generate.
    #[arg(
        long = "n-predict",
        short = 'n',
        value_name = "N",
        default_value_t = 128
    )]
    pub n_predict: usize,
    #[command(flatten)]
    pub sampling: crate::sampling::SamplingArgs,
    #[command(flatten)]
    pub weights: crate::weights::WeightsArgs,
    #[command(flatten)]
    pub prefill_chunk: crate::models::PrefillChunkArg,
    /// Context size in tokens (prompt + generation), capped by the model's trained context.
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub ctx: usize,
    /// Worker threads (passed on as NX_THREADS to the process-wide thread pool).
    #[arg(long, short = 't', value_name = "N")]
    pub threads: Option<usize>,
    /// Stop before this text (repeatable).
    #[arg(long, value_name = "STR")]
    pub stop: Vec<String>,
    /// Cap on the bytes of output text.
    #[arg(long, value_name = "N")]
    pub max_bytes: Option<usize>,
    /// Print one JSON object per token and a final statistics object.
    #[arg(long)]
    pub json: bool,
    /// With --json: report the K most likely alternatives of each token.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub logprobs: usize,
    /// Don't add BOS to a text prompt.
    #[arg(long)]
    pub no_special: bool,
    /// Wrap the prompt text as one user message in the model's chat template (see
    /// `nx chat`) and generate the assistant's answer.
    #[arg(long, conflicts_with_all = ["prompt_ids", "no_special"])]
    pub chat: bool,
    /// With --chat: chatml, llama3, gemma, or a Jinja file (default: the model's own,
    /// else the built-in one for its architecture).
    #[arg(long, value_name = "NAME|FILE", requires = "chat")]
    pub chat_template: Option<String>,
    #[command(flatten)]
    pub spec: crate::spec::SpecArgs,
}

/// Parses `1,2,3` (spaces allowed).
pub fn parse_ids(list: &str) -> Result<Vec<u32>> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .map_err(|_| anyhow!("--prompt-ids: {s:?} is not a token id"))
        })
        .collect()
}

fn read_prompt_file(path: &Path) -> Result<String> {
    let mut bytes = Vec::new();
    if path == Path::new("-") {
        std::io::stdin()
            .read_to_end(&mut bytes)
            .context("reading the prompt from standard input")?;
    } else {
        bytes = std::fs::read(path).with_context(|| format!("{}", path.display()))?;
    }
    String::from_utf8(bytes).map_err(|e| {
        anyhow!(
            "the prompt is not valid UTF-8 (byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

impl RunArgs {
    fn sampler(&self) -> SamplerConfig {
        self.sampling.config()
    }
}

pub fn run(args: &RunArgs) -> Result<()> {
    apply_threads(args.threads)?;
    // Check the cheap things before opening anything.
    let sampler = args.sampler();
    sampler.validate()?;
    let speculation = args.spec.speculation()?;
    let text_prompt = checked_prompt_text(args)?;

    let purpose = if args.chat {
        ModelUse::Chat
    } else {
        ModelUse::Text
    };
    let path = resolve_model(args.model.as_deref(), purpose)?;
    let model = crate::weights::open_model(&path, &args.weights)?;
    let tokenizer = Arc::new(
        Tokenizer::from_gguf(model.gguf())
            .with_context(|| format!("tokenizer of {}", path.display()))?,
    );
    let ids = prompt_ids(args, &model, &tokenizer, text_prompt.as_deref())?;
    let ctx_cap = args.ctx.min(model.config().n_ctx_train.max(1));
    let needed = ids.len().saturating_add(args.n_predict);
    let config = RunConfig {
        prefill_chunk: args.prefill_chunk.for_model(&model),
        // Big enough for this completion; an overflow is reported by the runner.
        n_ctx: needed.clamp(1, ctx_cap),
        max_tokens: args.n_predict,
        max_bytes: args.max_bytes,
        stop_strings: args.stop.clone(),
        logprobs: if args.json { args.logprobs } else { 0 },
        // Only the JSON lines report them.
        token_logprobs: args.json,
        sampler,
        json_object: args.sampling.json_object,
        speculation,
        ..RunConfig::default()
    };
    let runner = Runner::new(model, Some(tokenizer), config)?;
    let mut runner = args.spec.attach(runner, &args.weights)?;

    let stdout = std::io::stdout();
    let mut printer = Printer {
        out: stdout.lock(),
        json: args.json,
        write_error: None,
        last_text: String::new(),
        done: None,
    };
    runner.generate(Prompt::Ids(ids), |event| printer.on_event(event))?;
    printer.finish(args.spec.spec.is_some())
}

/// The flags' numeric checks, then the prompt text (`--prompt` or `-f`; `None` for
/// `--prompt-ids`).
fn checked_prompt_text(args: &RunArgs) -> Result<Option<String>> {
    args.prefill_chunk.check()?;
    if args.ctx == 0 {
        bail!("--ctx must be at least 1");
    }
    Ok(match (&args.prompt, &args.file, &args.prompt_ids) {
        (Some(p), _, _) => Some(p.clone()),
        (None, Some(f), _) => Some(read_prompt_file(f)?),
        (None, None, Some(_)) => None,
        (None, None, None) => bail!("no prompt: give --prompt TEXT, -f FILE or --prompt-ids IDS"),
    })
}

/// ` | drafts: accepted/drafted (rate)` when speculating.
fn spec_text(speculating: bool, s: &Stats) -> String {
    if !speculating {
        return String::new();
    }
    let rate = if s.drafted_tokens > 0 {
        100.0 * s.accepted_tokens as f64 / s.drafted_tokens as f64
    } else {
        0.0
    };
    format!(
        " | drafts: {} of {} accepted ({rate:.0} %)",
        s.accepted_tokens, s.drafted_tokens
    )
}

/// The prompt's token ids: encoded here (as the runner would) to size the cache for this
/// one completion.
fn prompt_ids(
    args: &RunArgs,
    model: &Model,
    tokenizer: &Tokenizer,
    text: Option<&str>,
) -> Result<Vec<u32>> {
    Ok(match (text, &args.prompt_ids) {
        (Some(text), _) if args.chat => {
            crate::chat::single_turn_ids(model, tokenizer, args.chat_template.as_deref(), text)?
        }
        (Some(text), _) => tokenizer.encode(
            text,
            EncodeOptions {
                add_special: !args.no_special,
                parse_special: true,
            },
        )?,
        (None, Some(list)) => parse_ids(list)?,
        (None, None) => bail!("no prompt: give --prompt TEXT, -f FILE or --prompt-ids IDS"),
    })
}

/// Writes the runner's events to stdout: text as it comes, or one JSON object per token
/// and a final statistics object.
struct Printer<W: Write> {
    out: W,
    json: bool,
    write_error: Option<std::io::Error>,
    last_text: String,
    done: Option<(StopReason, Stats)>,
}

impl<W: Write> Printer<W> {
    /// After the run: a closed pipe (`nx run … | head`) just ends the output, another
    /// write error is the error; then, for text output, the one-line summary on stderr
    /// (`spec`: speculation was on, so its acceptance is reported).
    fn finish(self, spec: bool) -> Result<()> {
        if let Some(e) = self.write_error {
            if e.kind() != std::io::ErrorKind::BrokenPipe {
                return Err(e).context("writing the output");
            }
            return Ok(());
        }
        if let (false, Some((reason, s))) = (self.json, self.done) {
            let newline = if self.last_text.ends_with('\n') {
                ""
            } else {
                "\n"
            };
            eprintln!(
                "{newline}prompt: {} tokens in {:.2} s ({:.1} tok/s) | generation: {} tokens, \
                 {:.1} tok/s | ttft {:.0} ms{} | stop: {}",
                s.prompt_tokens,
                s.prefill_secs,
                s.prompt_tps,
                s.generated_tokens,
                s.gen_tps,
                s.ttft_ms,
                spec_text(spec, &s),
                reason
            );
        }
        Ok(())
    }

    fn on_event(&mut self, event: Event) -> ControlFlow<()> {
        let written = match event {
            Event::Token {
                id,
                text,
                logprob,
                top,
            } => self.token(id, text, logprob, &top),
            Event::Done {
                reason,
                stats,
                flushed,
            } => self.done(reason, stats, flushed),
        };
        match written.and_then(|_| self.out.flush()) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => {
                self.write_error = Some(e);
                ControlFlow::Break(())
            }
        }
    }

    fn token(
        &mut self,
        id: u32,
        text: String,
        logprob: f32,
        top: &[(u32, f32)],
    ) -> std::io::Result<()> {
        let r = if self.json {
            let top: Vec<_> = top
                .iter()
                .map(|&(id, logprob)| json!({ "id": id, "logprob": logprob }))
                .collect();
            let line = json!({ "id": id, "text": text, "logprob": logprob, "top": top });
            writeln!(self.out, "{line}")
        } else {
            self.out.write_all(text.as_bytes())
        };
        if !text.is_empty() {
            self.last_text = text;
        }
        r
    }

    fn done(&mut self, reason: StopReason, stats: Stats, flushed: String) -> std::io::Result<()> {
        self.done = Some((reason, stats));
        let r = if self.json {
            let line = json!({
                "stop": reason.as_str(),
                "text": flushed,
                "prompt_tokens": stats.prompt_tokens,
                "generated_tokens": stats.generated_tokens,
                "prefill_secs": stats.prefill_secs,
                "decode_secs": stats.decode_secs,
                "prompt_tps": stats.prompt_tps,
                "gen_tps": stats.gen_tps,
                "ttft_ms": stats.ttft_ms,
                "drafted_tokens": stats.drafted_tokens,
                "accepted_tokens": stats.accepted_tokens,
            });
            writeln!(self.out, "{line}")
        } else {
            self.out.write_all(flushed.as_bytes())
        };
        if !flushed.is_empty() {
            self.last_text = flushed;
        }
        r
    }
}
