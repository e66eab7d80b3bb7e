//! Writes every target's seeds into `DIR/TARGET/seed-NNN` (used by `cargo xtask fuzz`
//! before a run, so the fuzzer starts from inputs that reach deep into each parser).

use std::path::PathBuf;

fn main() {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: nx-fuzz-seeds DIR");
        std::process::exit(2);
    };
    for target in nx_fuzz::TARGETS {
        let out = dir.join(target);
        if let Err(e) = std::fs::create_dir_all(&out) {
            eprintln!("error: cannot create {}: {e}", out.display());
            std::process::exit(1);
        }
        for (i, seed) in nx_fuzz::seeds::seeds(target).iter().enumerate() {
            let path = out.join(format!("seed-{i:03}"));
            if let Err(e) = std::fs::write(&path, seed) {
                eprintln!("error: cannot write {}: {e}", path.display());
                std::process::exit(1);
            }
        }
    }
}
