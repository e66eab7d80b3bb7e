//! Replays inputs through a fuzz target and prints how long each took:
//! `cargo run --release -p nx-fuzz --example replay -- TARGET FILE...` (for slow or
//! crashing inputs the fuzzer reports).

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(target) = args.next() else {
        eprintln!("usage: replay TARGET FILE...");
        std::process::exit(2);
    };
    for path in args {
        let data = match std::fs::read(&path) {
            Ok(d) => d,
            Err(e) => {
                eprintln!("error: {path}: {e}");
                std::process::exit(1);
            }
        };
        let start = std::time::Instant::now();
        if !nx_fuzz::run_target(&target, &data) {
            eprintln!("error: no fuzz target {target:?}");
            std::process::exit(2);
        }
        println!(
            "{path}: {} bytes, {:.3} s",
            data.len(),
            start.elapsed().as_secs_f64()
        );
    }
}
