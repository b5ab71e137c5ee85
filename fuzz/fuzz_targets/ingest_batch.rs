//! `sluice::fuzz::ingest_batch` under libFuzzer; seeds in `fuzz/corpus/ingest_batch`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::ingest_batch(data));
