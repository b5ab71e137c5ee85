//! `sluice schema`: the JSON Schema of pipeline files, for editors.

use std::io::Write;
use std::process::ExitCode;

pub(crate) fn run() -> ExitCode {
    let schema = crate::config::json_schema();
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
