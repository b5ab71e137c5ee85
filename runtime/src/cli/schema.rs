//! `sluice schema`: the JSON Schema of pipeline files (or, with `--cases`,
//! of handler test-case files), for editors.

use std::io::Write;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The schema of test-case files (`sluice plugin test --cases`) instead.
    #[arg(long)]
    cases: bool,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let schema = if args.cases {
        super::cases::json_schema()
    } else {
        crate::config::json_schema()
    };
    let text = match serde_json::to_string_pretty(&schema) {
        Ok(text) => text,
        Err(err) => {
            eprintln!("error: cannot render the schema: {err}");
            return ExitCode::FAILURE;
        }
    };
    match writeln!(std::io::stdout().lock(), "{text}") {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: cannot write the schema: {err}");
            ExitCode::FAILURE
        }
    }
}
