//! libFuzzer entry point for [`nx_fuzz::model_open`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::model_open(data));
