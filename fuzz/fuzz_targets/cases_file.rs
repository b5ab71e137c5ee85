//! `sluice::fuzz::cases_file` under libFuzzer; seeds in `fuzz/corpus/cases_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::cases_file(data));
