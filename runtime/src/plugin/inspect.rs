//! Reading a component's outline (its imports, its exports, the memory its
//! core modules declare) without compiling it.
//!
//! Compiling an 18 MB Python or JS component takes seconds; these checks
//! take milliseconds. So a component that imports what the sandbox does not
//! link (`wasi:http`, which componentize-js links by default), that names
//! the contract without its version, that implements another world, or
//! that needs more memory than it would get is refused before any compile,
//! naming the import or the number and what to do. `sluice validate` stops
//! here; `run` and `plugin test` go on to compile.

use std::path::Path;

use wasmparser::{Encoding, Parser, Payload};

use super::error::LoadError;
use super::{CONTRACT_VERSION, World};

/// What a component declares, read without compiling it.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The world it implements.
    pub world: World,
    /// The sum of the initial sizes of the memories its core modules
    /// define, in bytes: less than this and it cannot even start.
    pub min_memory: u64,
}

/// The interface every plugin may import: the contract's host functions.
const HOST_IMPORT: &str = "sluice:plugin/host";
/// The contract's shared types, which a component may import too.
const TYPES_IMPORT: &str = "sluice:plugin/types";
/// The WASI packages the sandbox links (with no files, environment,
/// arguments or sockets behind them).
const LINKED_WASI: &[&str] = &[
    "wasi:cli/",
    "wasi:io/",
    "wasi:clocks/",
    "wasi:random/",
    "wasi:filesystem/",
    "wasi:sockets/",
];

const SINGLE_EXPORT: &str = "sluice:plugin/message-handler";
const BATCH_EXPORT: &str = "sluice:plugin/batch-message-handler";

/// Reads the outline of the component in `bytes` (named `path` in errors).
///
/// # Errors
///
/// A [`LoadError`] saying what is wrong and what to do: not Wasm, a core
/// module, malformed, an import the sandbox does not link, another world or
/// contract version.
pub fn inspect(path: &Path, bytes: &[u8]) -> Result<Inspection, LoadError> {
    check_header(path, bytes)?;
    let malformed = |e: wasmparser::BinaryReaderError| LoadError::Compile {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    let mut imports = Vec::new();
    let mut exports = Vec::new();
    let mut min_memory = 0u64;
    // Nesting: 1 inside the outer component; deeper inside nested modules
    // and components, whose imports and exports are internal.
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        match payload.map_err(malformed)? {
            Payload::Version { encoding, .. } => {
                depth += 1;
                if depth == 1 && encoding != Encoding::Component {
                    return Err(LoadError::CoreModule {
                        path: path.to_owned(),
                        contract: CONTRACT_VERSION,
                    });
                }
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    imports.push(import.map_err(malformed)?.name.name.to_owned());
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    exports.push(export.map_err(malformed)?.name.name.to_owned());
                }
            }
            Payload::MemorySection(reader) => {
                for memory in reader {
                    let memory = memory.map_err(malformed)?;
                    let page = 1u64 << memory.page_size_log2.unwrap_or(16);
                    min_memory = min_memory.saturating_add(memory.initial.saturating_mul(page));
                }
            }
            _ => {}
        }
    }
    for import in &imports {
        check_import(path, import)?;
    }
    let world = world_of(path, &exports)?;
    Ok(Inspection { world, min_memory })
}

/// Tells non-components apart first, so each gets an error that says what
/// it is and what was expected.
fn check_header(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8; 4] = b"\0asm";
    const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];
    match bytes.get(..8) {
        Some(header) if header.starts_with(MAGIC) => {
            if header[4..] == CORE_MODULE_VERSION {
                Err(LoadError::CoreModule {
                    path: path.to_owned(),
                    contract: CONTRACT_VERSION,
                })
            } else {
                Ok(())
            }
        }
        _ => Err(LoadError::NotWasm {
            path: path.to_owned(),
        }),
    }
}

/// Refuses an import the sandbox does not link, saying how to build without
/// it.
fn check_import(path: &Path, import: &str) -> Result<(), LoadError> {
    let (name, version) = match import.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (import, None),
    };
    if name == HOST_IMPORT || name == TYPES_IMPORT {
        if version == Some(CONTRACT_VERSION) {
            return Ok(());
        }
        let hint = match version {
            None => format!(
                "the contract's interfaces carry their version: import `{name}@{CONTRACT_VERSION}` \
                 (in JavaScript: `import {{ log }} from \"{HOST_IMPORT}@{CONTRACT_VERSION}\"`)"
            ),
            Some(v) => format!(
                "it was built against sluice:plugin@{v}; this host implements \
                 sluice:plugin@{CONTRACT_VERSION}: rebuild it against that WIT"
            ),
        };
        return Err(LoadError::UnsupportedImport {
            path: path.to_owned(),
            import: import.to_owned(),
            hint,
        });
    }
    if LINKED_WASI.iter().any(|p| name.starts_with(p)) {
        return Ok(());
    }
    let hint = if name.starts_with("wasi:http/") {
        "handlers get no network, so Sluice links no wasi:http. componentize-js links it \
         unless told not to: build with `componentize-js ... -d http -d fetch-event` \
         (`sluice plugin build` does)"
            .to_owned()
    } else {
        format!(
            "a handler may import only `{HOST_IMPORT}@{CONTRACT_VERSION}` and WASI's cli, io, \
             clocks, random, filesystem and sockets interfaces (linked empty: no files, \
             environment or network)"
        )
    };
    Err(LoadError::UnsupportedImport {
        path: path.to_owned(),
        import: import.to_owned(),
        hint,
    })
}

/// Which of the two worlds the component implements, from its export
/// names; other worlds and other contract versions are refused.
fn world_of(path: &Path, exports: &[String]) -> Result<World, LoadError> {
    let at_version = |name: &str| format!("{name}@{CONTRACT_VERSION}");
    let single = exports.iter().any(|e| *e == at_version(SINGLE_EXPORT));
    let batch = exports.iter().any(|e| *e == at_version(BATCH_EXPORT));
    match (single, batch) {
        (true, true) => {
            return Err(LoadError::AmbiguousWorld {
                path: path.to_owned(),
            });
        }
        (true, false) => return Ok(World::Handler),
        (false, true) => return Ok(World::BatchHandler),
        (false, false) => {}
    }
    let other_version = exports.iter().find(|e| {
        e.strip_prefix(SINGLE_EXPORT)
            .or_else(|| e.strip_prefix(BATCH_EXPORT))
            .is_some_and(|rest| rest.starts_with('@'))
    });
    if let Some(found) = other_version {
        return Err(LoadError::IncompatibleContract {
            path: path.to_owned(),
            found: found.clone(),
            contract: CONTRACT_VERSION,
        });
    }
    let found = if exports.is_empty() {
        "nothing".to_owned()
    } else {
        exports
            .iter()
            .map(|e| format!("`{e}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    Err(LoadError::NotAPlugin {
        path: path.to_owned(),
        found,
        contract: CONTRACT_VERSION,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(import: &str) -> String {
        check_import(Path::new("p.wasm"), import)
            .expect_err("refused")
            .to_string()
    }

    #[test]
    fn the_sandbox_imports_pass_and_others_are_named_with_what_to_do() {
        for ok in [
            "sluice:plugin/host@0.1.0",
            "sluice:plugin/types@0.1.0",
            "wasi:cli/environment@0.2.3",
            "wasi:io/streams@0.2.0",
            "wasi:random/random@0.2.6",
        ] {
            check_import(Path::new("p.wasm"), ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        let http = refused("wasi:http/types@0.2.3");
        assert!(
            http.contains("`wasi:http/types@0.2.3`") && http.contains("-d http -d fetch-event"),
            "{http}"
        );
        let bare = refused("sluice:plugin/host");
        assert!(bare.contains("sluice:plugin/host@0.1.0"), "{bare}");
        let old = refused("sluice:plugin/host@0.0.9");
        assert!(old.contains("built against sluice:plugin@0.0.9"), "{old}");
        let other = refused("acme:kv/store@1.0.0");
        assert!(other.contains("may import only"), "{other}");
    }

    #[test]
    fn garbage_and_core_modules_are_told_apart() {
        let err = inspect(Path::new("x"), b"hello world").expect_err("refused");
        assert!(matches!(err, LoadError::NotWasm { .. }), "{err}");
        let core = b"\0asm\x01\0\0\0";
        let err = inspect(Path::new("x"), core).expect_err("refused");
        assert!(matches!(err, LoadError::CoreModule { .. }), "{err}");
    }
}
