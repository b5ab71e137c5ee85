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
use super::{Capability, Contract, IMPLEMENTED, World};

/// What a component declares, read without compiling it.
#[derive(Debug, Clone)]
pub struct Inspection {
    /// The world it implements.
    pub world: World,
    /// The contract version it was built against.
    pub contract: Contract,
    /// The capabilities it imports, each of which its stage must grant
    /// ([`Inspection::check_grants`]).
    pub capabilities: Vec<Capability>,
    /// The sum of the initial sizes of the memories its core modules
    /// define, in bytes: less than this and it cannot even start.
    pub min_memory: u64,
    /// The engine it is, when it is one that `sluice` builds for its
    /// users and that imports every capability (the QuickJS engine, whose
    /// core module has an [`ENGINE_SECTION`] custom section): its stage is
    /// not refused for a capability it does not grant; each call of one
    /// fails instead, naming the stage and the grant.
    pub engine: Option<String>,
}

/// The custom section that names an engine which imports every capability
/// (`plugins/js/engine-quickjs`: `quickjs`).
pub const ENGINE_SECTION: &str = "sluice-engine";

impl Inspection {
    /// Refuses a component that imports a capability `granted` lacks,
    /// naming the import, the stage and what to add to it. An engine
    /// ([`Inspection::engine`]) is not refused: the host answers each call
    /// of a capability its stage does not grant with an error that names
    /// the stage and the grant.
    ///
    /// # Errors
    ///
    /// [`LoadError::NotGranted`].
    pub fn check_grants(
        &self,
        path: &Path,
        stage: &str,
        granted: &[Capability],
    ) -> Result<(), LoadError> {
        if self.engine.is_some() {
            return Ok(());
        }
        match self.capabilities.iter().find(|c| !granted.contains(c)) {
            None => Ok(()),
            Some(missing) => Err(LoadError::NotGranted {
                path: path.to_owned(),
                import: missing.import(self.contract),
                stage: stage.to_owned(),
                grant: missing.how_to_grant().to_owned(),
            }),
        }
    }
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
    let mut engine = None;
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
                        contract: IMPLEMENTED,
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
            Payload::CustomSection(reader) if reader.name() == ENGINE_SECTION => {
                engine = Some(String::from_utf8_lossy(reader.data()).into_owned());
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
    let mut contract = None;
    let mut capabilities = Vec::new();
    for import in &imports {
        let (version, capability) = match check_import(path, import)? {
            Imported::Wasi => continue,
            Imported::Http => {
                if !capabilities.contains(&Capability::Http) {
                    capabilities.push(Capability::Http);
                }
                continue;
            }
            Imported::Contract(version) => (version, None),
            Imported::Capability(version, capability) => (version, Some(capability)),
        };
        if contract.is_some_and(|c| c != version) {
            return Err(LoadError::UnsupportedImport {
                path: path.to_owned(),
                import: import.clone(),
                hint: "it mixes versions of the contract; build it against one WIT".into(),
            });
        }
        contract = Some(version);
        capabilities.extend(capability);
    }
    let (world, exported) = world_of(path, &exports)?;
    if contract.is_some_and(|c| c != exported) {
        return Err(LoadError::IncompatibleContract {
            path: path.to_owned(),
            found: format!(
                "imports of sluice:plugin@{} with exports of sluice:plugin@{}",
                contract.map_or("", Contract::as_str),
                exported.as_str()
            ),
            contract: IMPLEMENTED,
        });
    }
    if capabilities.contains(&Capability::Http) && !exported.offers(Capability::Http) {
        return Err(LoadError::UnsupportedImport {
            path: path.to_owned(),
            import: "wasi:http/outgoing-handler".into(),
            hint: format!(
                "outbound HTTP is a capability of sluice:plugin@0.2.0, and this plugin is built \
                 against sluice:plugin@{}: rebuild it against the 0.2.0 WIT. If it does not \
                 mean to make requests: componentize-js links wasi:http unless told not to, so \
                 build with `componentize-js ... -d http -d fetch-event` (`sluice plugin build` \
                 does)",
                exported.as_str()
            ),
        });
    }
    Ok(Inspection {
        world,
        contract: exported,
        capabilities,
        min_memory,
        engine,
    })
}

fn check_header(path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
    const MAGIC: &[u8; 4] = b"\0asm";
    const CORE_MODULE_VERSION: [u8; 4] = [1, 0, 0, 0];
    match bytes.get(..8) {
        Some(header) if header.starts_with(MAGIC) => {
            if header[4..] == CORE_MODULE_VERSION {
                Err(LoadError::CoreModule {
                    path: path.to_owned(),
                    contract: IMPLEMENTED,
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

/// What an accepted import is.
#[derive(Debug)]
enum Imported {
    /// A WASI interface the sandbox links.
    Wasi,
    /// The contract's `host` or `types`, at this version.
    Contract(Contract),
    /// A capability of the contract at this version.
    Capability(Contract, Capability),
    /// `wasi:http`: outbound HTTP, a capability of contract 0.2.0.
    Http,
}

/// Accepts an import the host links, saying what it is; refuses any other,
/// naming it and what to do.
fn check_import(path: &Path, import: &str) -> Result<Imported, LoadError> {
    let (name, version) = match import.split_once('@') {
        Some((name, version)) => (name, Some(version)),
        None => (import, None),
    };
    // WASI's own interfaces carry WASI's version, not the contract's.
    if name == "wasi:http/outgoing-handler" || name == "wasi:http/types" {
        return Ok(Imported::Http);
    }
    let capability = Capability::ALL
        .iter()
        .find(|c| name == c.interface())
        .copied();
    if name == HOST_IMPORT || name == TYPES_IMPORT || capability.is_some() {
        let known = version.and_then(Contract::parse);
        match (known, capability) {
            (Some(contract), None) => return Ok(Imported::Contract(contract)),
            (Some(contract), Some(capability)) if contract.offers(capability) => {
                return Ok(Imported::Capability(contract, capability));
            }
            _ => {}
        }
        let newest = Contract::NEWEST.as_str();
        let hint = match (version, known) {
            (None, _) => format!(
                "the contract's interfaces carry their version: import `{name}@{newest}` \
                 (in JavaScript: `import {{ log }} from \"{HOST_IMPORT}@{newest}\"`)"
            ),
            (Some(v), Some(_)) => format!(
                "sluice:plugin@{v} has no `{name}`; it is new in sluice:plugin@{newest}: \
                 rebuild the plugin against that WIT"
            ),
            (Some(v), None) => format!(
                "it was built against sluice:plugin@{v}; this host implements \
                 sluice:plugin@0.1.0 and @0.2.0: rebuild it against one of them"
            ),
        };
        return Err(LoadError::UnsupportedImport {
            path: path.to_owned(),
            import: import.to_owned(),
            hint,
        });
    }
    if LINKED_WASI.iter().any(|p| name.starts_with(p)) {
        return Ok(Imported::Wasi);
    }
    let hint = if name.starts_with("wasi:http/") {
        "a handler may make outbound requests (`wasi:http/outgoing-handler`, granted by the \
         stage's `http:`), never serve them; componentize-js links the server side unless \
         told not to: build with `componentize-js ... -d fetch-event` (`sluice plugin build` \
         does)"
            .to_owned()
    } else {
        format!(
            "a handler may import only the contract's interfaces (`{HOST_IMPORT}`, and in \
             0.2.0 the capabilities its stage grants) and WASI's cli, io, clocks, random, \
             filesystem and sockets interfaces (linked empty: no files, environment or network)"
        )
    };
    Err(LoadError::UnsupportedImport {
        path: path.to_owned(),
        import: import.to_owned(),
        hint,
    })
}

fn world_of(path: &Path, exports: &[String]) -> Result<(World, Contract), LoadError> {
    let mut found: Vec<(World, Contract)> = Vec::new();
    let mut other_version = None;
    for export in exports {
        let Some((name, version)) = export.split_once('@') else {
            continue;
        };
        let world = match name {
            SINGLE_EXPORT => World::Handler,
            BATCH_EXPORT => World::BatchHandler,
            _ => continue,
        };
        match Contract::parse(version) {
            Some(contract) => found.push((world, contract)),
            None => other_version = Some(export.clone()),
        }
    }
    match found.as_slice() {
        [one] => return Ok(*one),
        [_, _, ..] => {
            return Err(LoadError::AmbiguousWorld {
                path: path.to_owned(),
            });
        }
        [] => {}
    }
    if let Some(found) = other_version {
        return Err(LoadError::IncompatibleContract {
            path: path.to_owned(),
            found,
            contract: IMPLEMENTED,
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
        contract: IMPLEMENTED,
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
        assert!(matches!(
            check_import(Path::new("p.wasm"), "wasi:http/outgoing-handler@0.2.12"),
            Ok(Imported::Http)
        ));
        let serving = refused("wasi:http/incoming-handler@0.2.3");
        assert!(
            serving.contains("`wasi:http/incoming-handler@0.2.3`")
                && serving.contains("-d fetch-event"),
            "{serving}"
        );
        let bare = refused("sluice:plugin/host");
        assert!(bare.contains("sluice:plugin/host@0.2.0"), "{bare}");
        let early = refused("sluice:plugin/secrets@0.1.0");
        assert!(early.contains("new in sluice:plugin@0.2.0"), "{early}");
        assert!(matches!(
            check_import(Path::new("p.wasm"), "sluice:plugin/secrets@0.2.0"),
            Ok(Imported::Capability(Contract::V0_2, Capability::Secrets))
        ));
        assert!(matches!(
            check_import(Path::new("p.wasm"), "sluice:plugin/host@0.2.0"),
            Ok(Imported::Contract(Contract::V0_2))
        ));
        let old = refused("sluice:plugin/host@0.0.9");
        assert!(old.contains("built against sluice:plugin@0.0.9"), "{old}");
        let other = refused("acme:kv/store@1.0.0");
        assert!(other.contains("may import only"), "{other}");
    }

    #[test]
    fn an_engine_is_not_refused_for_what_its_stage_does_not_grant() {
        let mut inspection = Inspection {
            world: World::Handler,
            contract: Contract::V0_2,
            capabilities: vec![Capability::Secrets, Capability::State, Capability::Http],
            min_memory: 0,
            engine: None,
        };
        let err = inspection
            .check_grants(Path::new("p.wasm"), "s", &[Capability::State])
            .expect_err("refused");
        assert!(
            err.to_string()
                .contains("`sluice:plugin/secrets@0.2.0`, which stage `s` does not grant"),
            "{err}"
        );
        inspection.engine = Some("quickjs".into());
        inspection
            .check_grants(Path::new("p.wasm"), "s", &[])
            .expect("an engine's calls fail instead");
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
