//! `sluice::fuzz::pipeline_file` under libFuzzer; seeds in `fuzz/corpus/pipeline_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::pipeline_file(data));
