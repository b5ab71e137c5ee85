//! `sluice::fuzz::store_record` under libFuzzer; seeds in `fuzz/corpus/store_record`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::store_record(data));
