//! The README's list of what nx reads (architectures, weight types, tokenizers) is made
//! from the code's own tables; this test fails when the two drift apart, and prints the
//! block the README should hold between its `support:begin` and `support:end` markers.

use nx_bpe::PRE_TOKENIZER_NAMES;
use nx_lazy_weight::{is_supported_weight, GgmlType};
use nx_llama_stack::Arch;

fn expected_block() -> String {
    let archs: Vec<String> = Arch::ALL
        .iter()
        .map(|a| format!("`{}`", a.name()))
        .collect();
    let types: Vec<&str> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|&t| is_supported_weight(t))
        .map(GgmlType::name)
        .collect();
    let pre: Vec<String> = PRE_TOKENIZER_NAMES
        .iter()
        .map(|c| format!("`{}`", c.name))
        .collect();
    format!(
        "<!-- support:begin (generated from the code's tables; crates/nx-cli/tests/readme_support.rs) -->\n\
         - Architectures: {}.\n\
         - Weight types: {}.\n\
         - Tokenizers: SentencePiece (`llama`), SentencePiece-style BPE (`gemma4`), and \
         byte-level BPE (`gpt2`) with the `tokenizer.ggml.pre` splits {}.\n\
         <!-- support:end -->",
        archs.join(", "),
        types.join(", "),
        pre.join(", ")
    )
}

#[test]
fn readme_lists_what_the_code_supports() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md");
    let readme = std::fs::read_to_string(path).unwrap();
    let want = expected_block();
    let begin = readme.find("<!-- support:begin");
    let end = readme.find("<!-- support:end -->");
    let found = match (begin, end) {
        (Some(b), Some(e)) if b < e => &readme[b..e + "<!-- support:end -->".len()],
        _ => "",
    };
    assert!(
        found == want,
        "README.md's support list is out of date; replace it with:\n\n{want}\n"
    );
}
