//! libFuzzer entry point for [`nx_fuzz::tokenizer`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::tokenizer(data));
