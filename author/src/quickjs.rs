//! Puts a project's scripts into a built QuickJS engine, so that a
//! JavaScript project on QuickJS builds without any compiler.
//!
//! The engine (`plugins/js/engine-quickjs`) reserves a zero-initialised
//! area for scripts and describes it in a small static, the slot: 24 bytes
//! of [`MAGIC`], then the area's address, its capacity and the bundle's
//! length (`u32`s, little-endian, as wasm32 lays them out). [`inject`]
//! finds the one core module of the component whose data carries the slot
//! and writes a new component: every section copied as it is, but that
//! module's data section, where the slot's length is patched and one active
//! segment is added that writes the bundle into the area (and its data
//! count, one more). Nothing else moves, so no index or offset changes.

use std::ops::Range;

use wasm_encoder::{
    Component, ConstExpr, DataCountSection, DataSection, Module, ModuleSection, RawSection,
};
use wasmparser::{DataKind, Encoding, Operator, Parser, Payload};

/// The slot's first bytes: names the bundle format the engine reads. A
/// new format is a new version.
pub const MAGIC: &[u8; 24] = b"SLUICE-JS-SCRIPTS-v1\0\0\0\0";

/// What every version of the magic starts with.
const MAGIC_PREFIX: &[u8] = b"SLUICE-JS-SCRIPTS-v";

/// The slot: magic, area, capacity, length.
const SLOT_SIZE: usize = MAGIC.len() + 12;

/// Where the slot's length is.
const LEN_AT: usize = MAGIC.len() + 8;

/// The component-model section that holds a core module.
const CORE_MODULE_SECTION: u8 = 1;

/// Why a project's scripts cannot go into the engine.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// The scripts do not fit in the engine's area.
    #[error(
        "the project's scripts take {size} bytes bundled, more than the {capacity} bytes ({} MiB) \
         the QuickJS engine holds; keep the .js files under that, or build on SpiderMonkey \
         (`\"sluice\": {{ \"engine\": \"spidermonkey\" }}` in package.json)",
        capacity >> 20
    )]
    TooLarge {
        /// The bundle's size.
        size: usize,
        /// The area's size.
        capacity: u32,
    },
    /// No core module carries a slot.
    #[error(
        "the QuickJS engine has no script slot: it is not Sluice's QuickJS engine, or one built \
         before scripts were injected"
    )]
    NoSlot,
    /// More than one slot was found.
    #[error(
        "the QuickJS engine has {0} script slots where it must have one (were scripts injected \
         into it already?)"
    )]
    ManySlots(usize),
    /// The slot names another bundle format.
    #[error(
        "the QuickJS engine reads scripts in format {found:?}, this sluice writes {:?}: use the \
         engine and the sluice of one release",
        shown(MAGIC)
    )]
    Version {
        /// The engine's magic, printable.
        found: String,
    },
    /// The slot already holds scripts.
    #[error("the QuickJS engine's script slot is filled already: inject into the bare engine")]
    Filled,
    /// The engine is not a component, or not the shape the slot needs.
    #[error("the QuickJS engine cannot take scripts: {0}")]
    Malformed(String),
    /// The engine does not parse.
    #[error("the QuickJS engine does not parse: {0}")]
    Parse(#[from] wasmparser::BinaryReaderError),
}

/// The engine's bundle of a project's files, as (path relative to the
/// project with `/` separators, bytes): `count: u32`, then per file `name
/// length: u32`, the name, `length: u32` and the bytes, little-endian.
///
/// # Panics
///
/// On a file or name of 4 GiB or more (which [`inject`] could never take).
pub fn bundle(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let size: usize = files.iter().map(|(n, b)| 8 + n.len() + b.len()).sum();
    let mut out = Vec::with_capacity(4 + size);
    let u32_of = |n: usize| u32::try_from(n).expect("a script under 4 GiB");
    out.extend(u32_of(files.len()).to_le_bytes());
    for (name, bytes) in files {
        out.extend(u32_of(name.len()).to_le_bytes());
        out.extend(name.as_bytes());
        out.extend(u32_of(bytes.len()).to_le_bytes());
        out.extend(bytes);
    }
    out
}

/// The engine component `engine` with `bundle` (see [`bundle`]) in its
/// script area.
///
/// # Errors
///
/// [`InjectError`]: the bundle is larger than the area, the engine has no
/// slot or two, another format's, or one already filled.
pub fn inject(engine: &[u8], bundle: &[u8]) -> Result<Vec<u8>, InjectError> {
    let sections = top_level_sections(engine)?;
    let mut found = Vec::new();
    for (i, (id, range)) in sections.iter().enumerate() {
        if *id == CORE_MODULE_SECTION {
            for slot in slots(&engine[range.clone()])? {
                found.push((i, slot));
            }
        }
    }
    let (module_at, slot) = match found.len() {
        0 => return Err(InjectError::NoSlot),
        1 => found.remove(0),
        n => return Err(InjectError::ManySlots(n)),
    };
    if slot.len != 0 {
        return Err(InjectError::Filled);
    }
    if bundle.len() > slot.capacity as usize {
        return Err(InjectError::TooLarge {
            size: bundle.len(),
            capacity: slot.capacity,
        });
    }
    let mut component = Component::new();
    for (i, (id, range)) in sections.iter().enumerate() {
        let bytes = &engine[range.clone()];
        if i == module_at {
            component.section(&ModuleSection(&filled(bytes, &slot, bundle)?));
        } else {
            component.section(&RawSection {
                id: *id,
                data: bytes,
            });
        }
    }
    Ok(component.finish())
}

/// The sections of the component `engine`, as (id, contents), not those of
/// the modules and components nested in it.
fn top_level_sections(engine: &[u8]) -> Result<Vec<(u8, Range<usize>)>, InjectError> {
    let mut sections = Vec::new();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(engine) {
        let payload = payload?;
        match &payload {
            Payload::Version { encoding, .. } if depth == 0 && *encoding != Encoding::Component => {
                return Err(InjectError::Malformed(
                    "it is a core module, not a component".into(),
                ));
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
        if depth == 0
            && let Some(section) = payload.as_section()
        {
            sections.push(section);
        }
        if matches!(
            payload,
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. }
        ) {
            depth += 1;
        }
    }
    Ok(sections)
}

/// A slot found in a core module's data.
#[derive(Debug)]
struct Slot {
    /// Where its length is, in the module's bytes.
    len_at: usize,
    /// The memory and the offset instruction of its segment.
    memory: u32,
    wide: bool,
    /// What it says.
    area: u32,
    capacity: u32,
    len: u32,
}

/// The slots in the data segments of `module`.
fn slots(module: &[u8]) -> Result<Vec<Slot>, InjectError> {
    let mut found = Vec::new();
    for payload in Parser::new(0).parse_all(module) {
        let Payload::DataSection(reader) = payload? else {
            continue;
        };
        for segment in reader {
            let segment = segment?;
            let data_at = segment.range.end - segment.data.len();
            let mut from = 0;
            while let Some(pos) = find(&segment.data[from..], MAGIC_PREFIX) {
                let at = from + pos;
                from = at + 1;
                let Some(slot) = segment.data.get(at..at + SLOT_SIZE) else {
                    return Err(InjectError::Malformed(
                        "its script slot is cut short".into(),
                    ));
                };
                if slot[..MAGIC.len()] != MAGIC[..] {
                    return Err(InjectError::Version {
                        found: shown(&slot[..MAGIC.len()]),
                    });
                }
                let word = |i: usize| {
                    let at = MAGIC.len() + 4 * i;
                    u32::from_le_bytes([slot[at], slot[at + 1], slot[at + 2], slot[at + 3]])
                };
                let DataKind::Active {
                    memory_index,
                    offset_expr,
                } = &segment.kind
                else {
                    return Err(InjectError::Malformed(
                        "its script slot is in a passive data segment".into(),
                    ));
                };
                let wide = match offset_expr.get_operators_reader().read()? {
                    Operator::I32Const { .. } => false,
                    Operator::I64Const { .. } => true,
                    other => {
                        return Err(InjectError::Malformed(format!(
                            "its script slot's segment is placed by {other:?}, not a constant"
                        )));
                    }
                };
                found.push(Slot {
                    len_at: data_at + at + LEN_AT,
                    memory: *memory_index,
                    wide,
                    area: word(0),
                    capacity: word(1),
                    len: word(2),
                });
            }
        }
    }
    Ok(found)
}

/// `module` with `bundle` written into the area `slot` describes.
fn filled(module: &[u8], slot: &Slot, bundle: &[u8]) -> Result<Module, InjectError> {
    let len = u32::try_from(bundle.len()).unwrap_or(u32::MAX);
    let mut out = Module::new();
    for payload in Parser::new(0).parse_all(module) {
        match payload? {
            Payload::DataSection(reader) => {
                let mut data = DataSection::new();
                for segment in reader {
                    let range = segment?.range;
                    let mut raw = module[range.clone()].to_vec();
                    if range.contains(&slot.len_at) {
                        let at = slot.len_at - range.start;
                        raw[at..at + 4].copy_from_slice(&len.to_le_bytes());
                    }
                    data.raw(&raw);
                }
                let offset = if slot.wide {
                    ConstExpr::i64_const(i64::from(slot.area))
                } else {
                    ConstExpr::i32_const(slot.area.cast_signed())
                };
                data.active(slot.memory, &offset, bundle.iter().copied());
                out.section(&data);
            }
            Payload::DataCountSection { count, .. } => {
                out.section(&DataCountSection { count: count + 1 });
            }
            Payload::ModuleSection { .. } | Payload::ComponentSection { .. } => {
                return Err(InjectError::Malformed(
                    "its module holds a nested module".into(),
                ));
            }
            other => {
                if let Some((id, range)) = other.as_section() {
                    out.section(&RawSection {
                        id,
                        data: &module[range],
                    });
                }
            }
        }
    }
    Ok(out)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A magic as text, without its padding.
fn shown(magic: &[u8]) -> String {
    String::from_utf8_lossy(magic)
        .trim_end_matches('\0')
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasm_encoder::{MemorySection, MemoryType};

    /// A component of one core module whose data holds `slots` (each with
    /// its own magic and length) after a few other bytes, and a custom
    /// section, as the engine's would.
    fn engine(slots: &[(&[u8; 24], u32)], capacity: u32) -> Vec<u8> {
        let mut memories = MemorySection::new();
        memories.memory(MemoryType {
            minimum: 2,
            maximum: None,
            memory64: false,
            shared: false,
            page_size_log2: None,
        });
        let mut data = DataSection::new();
        data.active(0, &ConstExpr::i32_const(16), b"other data".iter().copied());
        for (magic, len) in slots {
            let mut slot = magic.to_vec();
            slot.extend(1024u32.to_le_bytes());
            slot.extend(capacity.to_le_bytes());
            slot.extend(len.to_le_bytes());
            data.active(0, &ConstExpr::i32_const(64), slot);
        }
        let mut module = Module::new();
        module.section(&memories);
        module.section(&DataCountSection { count: data.len() });
        module.section(&data);
        let mut component = Component::new();
        component.section(&ModuleSection(&module));
        component.section(&wasm_encoder::CustomSection {
            name: "kept".into(),
            data: b"as it was".into(),
        });
        component.finish()
    }

    fn valid(component: &[u8]) {
        wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all())
            .validate_all(component)
            .expect("a valid component");
    }

    /// The data segments of the one module in `component`, as (offset,
    /// bytes).
    fn segments(component: &[u8]) -> Vec<(i64, Vec<u8>)> {
        let mut out = Vec::new();
        for payload in Parser::new(0).parse_all(component) {
            if let Payload::DataSection(reader) = payload.expect("parses") {
                for segment in reader {
                    let segment = segment.expect("parses");
                    let DataKind::Active { offset_expr, .. } = segment.kind else {
                        panic!("passive")
                    };
                    let offset = match offset_expr.get_operators_reader().read().expect("op") {
                        Operator::I32Const { value } => i64::from(value),
                        other => panic!("{other:?}"),
                    };
                    out.push((offset, segment.data.to_vec()));
                }
            }
        }
        out
    }

    #[test]
    fn a_bundle_lists_its_files_with_their_lengths() {
        let files = vec![
            ("handler.js".to_owned(), b"export {}".to_vec()),
            ("lib/a.mjs".to_owned(), Vec::new()),
        ];
        let mut wanted = 2u32.to_le_bytes().to_vec();
        wanted.extend(10u32.to_le_bytes());
        wanted.extend(b"handler.js");
        wanted.extend(9u32.to_le_bytes());
        wanted.extend(b"export {}");
        wanted.extend(9u32.to_le_bytes());
        wanted.extend(b"lib/a.mjs");
        wanted.extend(0u32.to_le_bytes());
        assert_eq!(bundle(&files), wanted);
    }

    #[test]
    fn the_bundle_lands_in_the_area_and_the_length_in_the_slot() {
        let engine = engine(&[(MAGIC, 0)], 4096);
        valid(&engine);
        let bundle = bundle(&[("handler.js".to_owned(), b"export {}".to_vec())]);
        let out = inject(&engine, &bundle).expect("injects");
        valid(&out);
        let segments = segments(&out);
        assert_eq!(segments.len(), 3);
        assert_eq!(segments[0], (16, b"other data".to_vec()));
        let (at, slot) = &segments[1];
        assert_eq!(*at, 64);
        assert_eq!(&slot[..24], MAGIC);
        assert_eq!(slot[24..28], 1024u32.to_le_bytes(), "area");
        assert_eq!(slot[28..32], 4096u32.to_le_bytes(), "capacity");
        assert_eq!(slot[32..36], (bundle.len() as u32).to_le_bytes(), "len");
        assert_eq!(segments[2], (1024, bundle));
        assert!(
            find(&out, b"as it was").is_some(),
            "the other sections are kept"
        );
        // The same inputs give the same bytes.
        assert_eq!(inject(&engine, &segments[2].1).expect("injects"), out);
    }

    #[test]
    fn what_cannot_work_is_refused_with_its_reason() {
        let bundle = vec![7u8; 101];
        let err = inject(&engine(&[(MAGIC, 0)], 100), &bundle).expect_err("too large");
        assert!(
            matches!(
                err,
                InjectError::TooLarge {
                    size: 101,
                    capacity: 100
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("101 bytes"), "{err}");
        inject(&engine(&[(MAGIC, 0)], 101), &bundle).expect("exactly fits");

        let err = inject(&engine(&[], 100), &bundle).expect_err("no slot");
        assert!(matches!(err, InjectError::NoSlot), "{err}");
        let err = inject(&engine(&[(MAGIC, 0), (MAGIC, 0)], 1000), &bundle).expect_err("two");
        assert!(matches!(err, InjectError::ManySlots(2)), "{err}");
        let v2 = b"SLUICE-JS-SCRIPTS-v2\0\0\0\0";
        let err = inject(&engine(&[(v2, 0)], 1000), &bundle).expect_err("v2");
        assert!(
            err.to_string().contains("\"SLUICE-JS-SCRIPTS-v2\""),
            "{err}"
        );
        let err = inject(&engine(&[(MAGIC, 5)], 1000), &bundle).expect_err("filled");
        assert!(matches!(err, InjectError::Filled), "{err}");

        let filled = inject(&engine(&[(MAGIC, 0)], 1000), &bundle).expect("injects");
        let err = inject(&filled, &bundle).expect_err("twice");
        assert!(matches!(err, InjectError::Filled), "{err}");
        let err = inject(b"\0asm\x01\0\0\0", &bundle).expect_err("a core module");
        assert!(err.to_string().contains("not a component"), "{err}");
    }

    /// The engine this binary carries, when the machine that built it
    /// could build one.
    #[test]
    fn the_prebuilt_engines_take_scripts_and_stay_valid() {
        for world in [crate::World::Handler, crate::World::BatchHandler] {
            let Some(engine) = crate::files::quickjs_prebuilt(world) else {
                eprintln!("no prebuilt QuickJS engine in this build: skipped");
                return;
            };
            valid(engine);
            let bundle = bundle(&[("handler.js".to_owned(), b"export {}".to_vec())]);
            let out = inject(engine, &bundle).expect("injects");
            valid(&out);
            assert!(
                out.len() < engine.len() + bundle.len() + 64,
                "{}",
                out.len()
            );
            let err = inject(engine, &vec![0; 8 << 20 | 1]).expect_err("too large");
            assert!(err.to_string().contains("(8 MiB)"), "{err}");
        }
    }
}
