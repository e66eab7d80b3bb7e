//! The `nx` command-line tool: inspect, tokenize, run, chat, bench, perplexity.

fn main() {
    println!("nx");
}
