//! libFuzzer entry point for [`nx_fuzz::gguf_header`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::gguf_header(data));
