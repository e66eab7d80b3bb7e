//! libFuzzer entry point for [`nx_fuzz::sampler`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::sampler(data));
