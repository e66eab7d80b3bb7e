//! Project automation behind `cargo xtask`: fetching pinned artifacts, building the
//! reference engine, golden data, the gate, benchmarks and the demo. `main.rs` is only the CLI.

pub mod bench;
pub mod bench_spec;
pub mod demo;
pub mod fetch;
pub mod fuzz;
pub mod gate;
pub mod gates;
pub mod golden;
pub mod http;
pub mod llama_server;
pub mod loadtest;
pub mod machine;
pub mod miri;
pub mod pins;
pub mod reference;
pub mod sections;
pub mod synth;
pub mod util;
