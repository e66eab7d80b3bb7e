//! Project automation: `cargo xtask gate|fetch|reference|golden|synth|bench|demo`.

fn main() {
    println!("xtask");
}
