//! The `nx` command-line tool: inspect, tokenize, run, chat, serve, bench, perplexity.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod batched;
mod bench;
mod chat;
mod inspect;
mod kernel_plan;
mod models;
mod perplexity;
mod run;
mod sampling;
mod serve;
mod spec;
mod stats;
mod tokenize;
mod weights;

/// nx runs GGUF language models (Gemma 3, Qwen2/2.5, Qwen3, Llama) on the CPU, with
/// logits that are bit-identical whatever the prefill chunk size or thread count.
#[derive(Parser)]
#[command(name = "nx", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a GGUF file's metadata and tensor table without reading tensor data.
    Inspect(inspect::InspectArgs),
    /// Print the token ids of a text (or, with --decode, the text of ids) using a GGUF
    /// file's tokenizer.
    Tokenize(tokenize::TokenizeArgs),
    /// Generate a completion of a prompt, streamed to stdout.
    Run(run::RunArgs),
    /// Chat with a model in the terminal (one message per line; /reset, /exit).
    Chat(chat::ChatArgs),
    /// Serve the model over HTTP with an OpenAI-compatible API (/v1/chat/completions,
    /// /v1/completions, /v1/models, /health, /tokenize, /detokenize, /metrics).
    Serve(serve::ServeArgs),
    /// Measure prompt-processing and generation speed (like llama-bench).
    Bench(bench::BenchArgs),
    /// Compute a model's perplexity on a text file (like llama-perplexity).
    Perplexity(perplexity::PerplexityArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version are not errors; `nx` alone shows the help (and fails).
        Err(e)
            if !e.use_stderr()
                || e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand =>
        {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
        Err(e) => {
            // One line, as every other error: clap's first line names the problem (its
            // usage and hint lines follow it).
            let text = e.render().to_string();
            let first = text
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("error");
            eprintln!("{first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let result = match &cli.command {
        Command::Inspect(args) => inspect::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Run(args) => run::run(args),
        Command::Chat(args) => chat::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Perplexity(args) => perplexity::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // One line naming the problem: the chain of causes joined, no backtrace.
            eprintln!("error: {}", one_line(&e));
            ExitCode::from(2)
        }
    }
}

/// Joins an error and its causes on one line.
fn one_line(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let s = cause.to_string();
        if !parts.iter().any(|p| p.contains(&s)) {
            parts.push(s);
        }
    }
    parts.join(": ").replace('\n', " ")
}
