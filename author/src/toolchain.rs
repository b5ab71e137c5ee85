//! Finding the tools a Wasm build needs: cargo with the `wasm32-wasip2`
//! target, and a C compiler for wasm (QuickJS is C).
//!
//! Standard library only: the crate's build script includes this file too
//! (`#[path]`), to build the prebuilt QuickJS engine the way `sluice plugin
//! build` builds it on a machine without one.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Rust target components are built for.
pub const RUST_TARGET: &str = "wasm32-wasip2";

/// Variables of a calling cargo that must not leak into a plugin's cargo:
/// host rustflags or wrappers (coverage, sccache) would be applied to Wasm
/// code, an outer jobserver would not be ours, and neither would its target
/// directory.
pub const SCRUBBED_ENV: &[&str] = &[
    "RUSTFLAGS",
    "CARGO_ENCODED_RUSTFLAGS",
    "CARGO_BUILD_RUSTFLAGS",
    "RUSTC_WRAPPER",
    "RUSTC_WORKSPACE_WRAPPER",
    "CARGO_BUILD_TARGET",
    "CARGO_MAKEFLAGS",
    "CARGO_TARGET_DIR",
];

/// A tool that is not installed, and how to install it.
#[derive(Debug, Clone)]
pub struct Missing {
    /// The tool, e.g. `clang`.
    pub tool: String,
    /// The command (or instruction) that installs it.
    pub install: String,
}

fn missing(tool: &str, install: &str) -> Missing {
    Missing {
        tool: tool.to_owned(),
        install: install.to_owned(),
    }
}

/// How QuickJS's C sources are compiled for `wasm32-wasip2`.
pub enum WasmC {
    /// A wasi-sdk (`$WASI_SDK`): rquickjs-sys uses its clang and sysroot.
    WasiSdk,
    /// The system's clang, with the wasi-libc headers in `include`.
    Clang {
        /// wasi-libc's headers.
        include: PathBuf,
    },
}

impl WasmC {
    /// `$WASI_SDK`, else clang and wasi-libc's headers (`$WASI_SYSROOT`,
    /// or where Debian, Ubuntu, Fedora and Arch install them).
    pub fn find() -> Result<WasmC, Missing> {
        const INSTALL: &str = "`apt install clang wasi-libc` (Debian, Ubuntu; `dnf install clang \
             wasi-libc-devel` on Fedora), or a wasi-sdk with WASI_SDK set to it";
        if std::env::var_os("WASI_SDK").is_some_and(|d| Path::new(&d).join("bin/clang").is_file()) {
            return Ok(WasmC::WasiSdk);
        }
        if tool_version(Command::new("clang").arg("--version")).is_none() {
            return Err(missing("clang (to compile QuickJS for wasm)", INSTALL));
        }
        let sysroot = std::env::var_os("WASI_SYSROOT").map(PathBuf::from);
        let candidates = sysroot
            .iter()
            .flat_map(|s| [s.join("include/wasm32-wasi"), s.join("include")])
            .chain(SYSTEM_WASI_INCLUDES.iter().map(PathBuf::from));
        for include in candidates {
            if include.join("wasi/api.h").is_file() {
                return Ok(WasmC::Clang { include });
            }
        }
        Err(missing(
            "the wasi-libc headers (to compile QuickJS for wasm)",
            INSTALL,
        ))
    }

    /// Sets the variables rquickjs-sys's build reads.
    pub fn apply(&self, cmd: &mut Command) {
        if let WasmC::Clang { include } = self {
            // rquickjs-sys would download a wasi-sdk otherwise.
            cmd.env("RQUICKJS_SYS_NO_WASI_SDK", "1")
                .env("CC_wasm32_wasip2", "clang")
                // No sysroot, so that clang never reads the host's headers.
                .env(
                    "CFLAGS_wasm32_wasip2",
                    format!("--sysroot=/nonexistent -isystem {}", include.display()),
                );
            if tool_version(Command::new("llvm-ar").arg("--version")).is_some() {
                cmd.env("AR_wasm32_wasip2", "llvm-ar");
            }
        }
    }
}

/// Where Debian, Ubuntu, Fedora and Arch install wasi-libc's headers.
pub const SYSTEM_WASI_INCLUDES: &[&str] = &[
    "/usr/include/wasm32-wasi",
    "/usr/share/wasi-sysroot/include/wasm32-wasi",
    "/usr/share/wasi-sysroot/include",
];

/// `$CARGO` or `cargo`, with the wasm target installed.
pub fn cargo() -> Result<OsString, Missing> {
    let cargo = std::env::var_os("CARGO")
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "cargo".into());
    if tool_version(Command::new(&cargo).arg("--version")).is_none() {
        return Err(missing("cargo", "rustup, from https://rustup.rs"));
    }
    if let Some(installed) =
        tool_version(Command::new("rustup").args(["target", "list", "--installed"]))
        && !installed.lines().any(|l| l.trim() == RUST_TARGET)
    {
        return Err(missing(
            &format!("the Rust target {RUST_TARGET}"),
            &format!("rustup target add {RUST_TARGET}"),
        ));
    }
    Ok(cargo)
}

/// What `cmd` prints (trimmed), or None when it cannot run.
pub fn tool_version(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
