//! `sluice plugin new` and `sluice plugin build`: the start of a handler
//! author's loop, in Rust, Python or JavaScript. The work is in the
//! `sluice-author` crate, which also builds this repository's examples.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use sluice_author::{AuthorError, Lang, Project};

#[derive(Debug, clap::Args)]
pub(crate) struct NewArgs {
    /// The plugin's name, and the directory created for it: lowercase letters, digits, `-`
    /// and `_`, starting with a letter.
    name: String,
    /// The handler's language: rust, python or js. A js project runs on QuickJS (`"sluice":
    /// { "engine": "quickjs" }` in its package.json), the faster engine, whose build needs
    /// nothing but sluice; set "engine" to "spidermonkey" for componentize-js (npm).
    #[arg(long, value_name = "LANG", value_parser = parse_lang)]
    lang: Lang,
    /// Where to create the project (default: the current directory).
    #[arg(long, value_name = "DIR", default_value = ".")]
    path: PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct BuildArgs {
    /// The project directory (default: the current directory).
    #[arg(default_value = ".")]
    dir: PathBuf,
}

fn parse_lang(s: &str) -> Result<Lang, String> {
    Lang::parse(s).ok_or_else(|| format!("unknown language {s:?}; use rust, python or js"))
}

/// `sluice plugin new NAME --lang LANG`.
pub(crate) fn new(args: NewArgs) -> ExitCode {
    match sluice_author::scaffold(&args.path, &args.name, args.lang) {
        Ok(dir) => {
            println!(
                "created {} ({} handler, README.md, cases.yaml)\n\nnext:\n  cd {}\n  \
                 sluice plugin build\n  sluice plugin test . --cases cases.yaml",
                dir.display(),
                args.lang,
                dir.display()
            );
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

/// `sluice plugin build [DIR]`: the last line of stdout is the component's
/// path.
pub(crate) fn build(args: BuildArgs) -> ExitCode {
    match build_dir(&args.dir) {
        Ok(wasm) => {
            println!("{}", wasm.display());
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the project in `dir`, saying on stderr what it does.
fn build_dir(dir: &Path) -> Result<PathBuf, AuthorError> {
    let project = Project::detect(dir)?;
    eprintln!(
        "building {} ({} handler in {})",
        project.name,
        project.lang,
        project.dir.display()
    );
    let report = sluice_author::build(&project)?;
    if !report.rebuilt {
        eprintln!("up to date");
    }
    Ok(report.wasm)
}

/// The component `path` names: the file itself, or the build of the
/// project when it is a directory.
pub(crate) fn component(path: &Path) -> Result<PathBuf, AuthorError> {
    if path.is_dir() {
        build_dir(path)
    } else {
        Ok(path.to_path_buf())
    }
}
