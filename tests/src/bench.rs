//! What every connector bench shares: how many messages and samples a
//! run takes, and how a row of the side-by-side table is printed
//! (medians, and the ratio B/A).

/// N (`SLUICE_BENCH_N`, else `release` in a bench build and `debug` in
/// the debug test profile, which only checks that the bench works), and
/// the samples of each side (`release_samples`, or 1 in debug).
pub fn size(debug: usize, release: usize, release_samples: usize) -> (usize, usize) {
    let n = std::env::var("SLUICE_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if cfg!(debug_assertions) {
            debug
        } else {
            release
        });
    let samples = if cfg!(debug_assertions) {
        1
    } else {
        release_samples
    };
    (n, samples)
}

/// The median of `samples` (the upper one of an even count).
///
/// # Panics
///
/// When `samples` is empty.
pub fn median(samples: &[f64]) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

/// Prints one table row: `name`, the medians of A and B, and B/A.
pub fn report(name: &str, a: &[f64], b: &[f64]) {
    let (ma, mb) = (median(a), median(b));
    println!("| {name} | {ma:.0} | {mb:.0} | {:.2} |", mb / ma);
}
