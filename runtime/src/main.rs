//! The `sluice` binary; everything lives in the library's [`sluice::cli`].

fn main() -> std::process::ExitCode {
    sluice::cli::main()
}
