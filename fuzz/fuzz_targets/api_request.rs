//! libFuzzer entry point for [`nx_fuzz::api_request`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| nx_fuzz::api_request(data));
