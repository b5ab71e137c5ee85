//! `sluice schema`: the JSON Schema of pipeline files (or, with `--cases`,
//! of handler test-case files), for editors; with `--openapi`, the admin
//! API's OpenAPI document, for client generators.

use std::io::Write;
use std::process::ExitCode;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The schema of test-case files (`sluice plugin test --cases`) instead.
    #[arg(long, conflicts_with = "openapi")]
    cases: bool,
    /// The admin API's OpenAPI 3.1 document instead: what a daemon serves at
    /// GET /v1/openapi.json, for generating clients without running one.
    #[arg(long)]
    openapi: bool,
}

pub(crate) fn run(args: Args) -> ExitCode {
    let schema = if args.cases {
        super::cases::json_schema()
    } else if args.openapi {
        match serde_json::to_value(crate::admin::openapi_document()) {
            Ok(document) => document,
            Err(err) => {
                eprintln!("error: cannot render the OpenAPI document: {err}");
                return ExitCode::FAILURE;
            }
        }
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
