//! The handler author's tools, shared by the `sluice` binary (`sluice plugin
//! new`, `sluice plugin build`) and the repository's own build of its example
//! handlers (`cargo xtask plugins`), so both build a project the same way.
//!
//! - [`project`]: what a plugin project is, in each language, and how to tell.
//! - [`build`]: turning a project into a component with the language's own
//!   toolchain (cargo, componentize-py, componentize-js), naming a missing
//!   tool with the command that installs it, and skipping a rebuild when
//!   nothing changed (neither Python nor JS tooling gives the same bytes
//!   twice, and every new byte means a new compile in the daemon).
//! - [`js`]: what a JS project's modules import (the contract's version,
//!   its capabilities, `fetch`), so its build imports only those.
//! - [`quickjs`]: a JS project on QuickJS needs no toolchain: its scripts
//!   are injected into a prebuilt engine.
//! - [`scaffold`]: a new project that builds and passes its test cases.
//! - [`files`]: what this crate carries: the contract's WIT, the SDKs and
//!   the QuickJS engine.

pub mod build;
pub mod files;
pub mod js;
pub mod project;
pub mod python;
pub mod quickjs;
pub mod scaffold;
mod toolchain;

pub use build::{BuildReport, build};
pub use project::{JsEngine, Lang, Project, World};
pub use scaffold::scaffold;

/// Why an author's command failed. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum AuthorError {
    /// The directory holds no project this crate recognises.
    #[error("{0}")]
    NotAProject(String),
    /// A tool the build needs is not installed.
    #[error("{tool} was not found; install it with: {install}")]
    ToolMissing {
        /// The tool, e.g. `componentize-py`.
        tool: String,
        /// The command (or instruction) that installs it.
        install: String,
    },
    /// A tool is installed but does not start (a half-finished install, a
    /// package missing from `node_modules`).
    #[error("{tool} is installed but does not start: {detail}\nreinstall it with: {install}")]
    ToolBroken {
        /// The tool, e.g. `componentize-js`.
        tool: String,
        /// The first lines of what it printed.
        detail: String,
        /// The command that reinstalls it.
        install: String,
    },
    /// The language's build tool ran and failed; its own output went to
    /// stderr.
    #[error("`{command}` failed ({status}){}", hint.as_deref().map(|h| format!("\nhint: {h}")).unwrap_or_default())]
    BuildFailed {
        /// The command line, as a user could rerun it.
        command: String,
        /// Its exit status.
        status: String,
        /// What probably went wrong, when the output says.
        hint: Option<String>,
    },
    /// A JS project's scripts cannot go into the QuickJS engine.
    #[error(transparent)]
    QuickJs(#[from] quickjs::InjectError),
    /// A bad argument (a name, an existing directory).
    #[error("{0}")]
    Invalid(String),
    /// Reading or writing a file failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

impl From<toolchain::Missing> for AuthorError {
    fn from(m: toolchain::Missing) -> Self {
        AuthorError::ToolMissing {
            tool: m.tool,
            install: m.install,
        }
    }
}

/// Wraps an I/O error with what was being done.
pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> AuthorError {
    let context = context.into();
    move |source| AuthorError::Io { context, source }
}
