//! `sluice::fuzz::journal` under libFuzzer; seeds in `fuzz/corpus/journal`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::journal(data));
