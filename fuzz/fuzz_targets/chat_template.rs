//! libFuzzer entry point for [`nx_fuzz::chat_template`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::chat_template(data));
