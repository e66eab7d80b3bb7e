//! Files whose metadata lies about the model: a clear error before anything is sized by
//! the lie (the fuzzer's 4.7 KB file with `block_count = 536870913` aborted on a 339 GB
//! allocation before this check).

use nx_gguf::Gguf;
use nx_llama_stack::{tiny_fixture, Model, StackError};

/// The tiny model with the u32 value of metadata key `key` replaced by `value`.
fn with_u32(key: &str, value: u32) -> Vec<u8> {
    let mut bytes = tiny_fixture::tiny_gguf(Default::default());
    let needle = key.as_bytes();
    let at = bytes
        .windows(needle.len())
        .position(|w| w == needle)
        .expect("key present");
    // Key text, then the value type (u32 = 4), then the value.
    let type_at = at + needle.len();
    assert_eq!(&bytes[type_at..type_at + 4], &4u32.to_le_bytes());
    bytes[type_at + 4..type_at + 8].copy_from_slice(&value.to_le_bytes());
    bytes
}

fn open(bytes: Vec<u8>) -> Result<Model, StackError> {
    Model::from_gguf(Gguf::from_bytes(bytes).expect("the header still parses"))
}

#[test]
fn an_absurd_layer_count_is_an_error_not_an_abort() {
    for n in [536_870_913, u32::MAX, 1_000_000_000, 3] {
        let err = open(with_u32("llama.block_count", n))
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains("block_count") && err.contains(&n.to_string()),
            "{err}"
        );
    }
    assert!(
        open(with_u32("llama.block_count", 2)).is_ok(),
        "the true count loads"
    );
}

#[test]
fn a_layer_count_short_of_the_tensors_still_loads_only_what_it_names() {
    // One layer of two: a consistent (smaller) model, not an error.
    let model = open(with_u32("llama.block_count", 1)).expect("loads");
    assert_eq!(model.config().n_layers, 1);
}
