//! A Sluice handler written in JavaScript, run by QuickJS inside this
//! component.
//!
//! The engine is built once, with no project in it: it reserves an area
//! for scripts ([`SCRIPTS`]) and describes it in [`SLOT`], which `sluice
//! plugin build` finds in the component's data and fills in (the author
//! crate's `quickjs` module), so a project's build needs no compiler. The
//! first call reads the project's files from the area, evaluates
//! `handler.js` and keeps the engine; every call then converts the message
//! into the same JavaScript values componentize-js gives a handler, calls
//! `messageHandler.handle` (or `batchMessageHandler.handleBatch` with the
//! `batch` feature), and converts its `{ tag, val }` result back. So the SDK (`sluice.js`) and
//! handlers on the raw bindings run unchanged on either engine, and the
//! call path is Rust's, not a generic lifting layer's.
//!
//! The capabilities of contract 0.2.0 (state, secrets and outbound HTTP)
//! are in [`capabilities`]: the engine imports all of its world's, so a
//! project uses any of them with no build of its own, and a stage that does
//! not grant one answers each call with an error naming the stage and the
//! grant (componentize-js imports only what a project uses, and such a
//! stage refuses that component at load).

mod capabilities;

use std::cell::RefCell;
use std::sync::OnceLock;

use rquickjs::function::This;
use rquickjs::loader::{Loader, Resolver};
use rquickjs::module::{Declared, Exports, ModuleDef};
use rquickjs::{
    Array, BigInt, CatchResultExt, CaughtError, Context, Ctx, Exception, Function, Module, Object,
    Persistent, Runtime, TypedArray, Value,
};
use sluice_sdk::bindings::handler::sluice::plugin::host::{self, Level};
use sluice_sdk::{Emit, HandlerError, Message, Outcome};

/// The most bytes of scripts a build can inject: the size of [`SCRIPTS`].
/// It is zero-initialised, so it costs no byte of the component and no
/// resident page until a build writes into it; it adds to the memory the
/// component declares.
const CAPACITY: usize = 8 << 20;

/// The project's files, as `sluice plugin build` writes them: a bundle of
/// `count: u32`, then per file `name length: u32`, the UTF-8 path relative
/// to the project, `length: u32` and the bytes (integers little-endian).
static mut SCRIPTS: [u8; CAPACITY] = [0; CAPACITY];

/// Where the scripts are, for the injector: on wasm32, 24 bytes of magic
/// (naming the bundle's format), then `area`, `capacity` and `len` as u32.
/// The injector patches `len` and writes the bundle at `area` with a data
/// segment of its own.
#[repr(C)]
struct Slot {
    magic: [u8; 24],
    area: *const u8,
    capacity: u32,
    len: u32,
}

// SAFETY: the slot is never written at run time; it is read only.
unsafe impl Sync for Slot {}

#[used]
static SLOT: Slot = Slot {
    magic: *b"SLUICE-JS-SCRIPTS-v1\0\0\0\0",
    area: (&raw const SCRIPTS).cast::<u8>(),
    capacity: CAPACITY as u32,
    len: 0,
};

/// Marks this component as Sluice's QuickJS engine for the runtime, which
/// then links each capability its stage does not grant to an error naming
/// the grant, instead of refusing the component at load (the engine imports
/// every capability, whatever the project's scripts use).
#[used]
#[cfg_attr(target_family = "wasm", unsafe(link_section = "sluice-engine"))]
static ENGINE_MARKER: [u8; 7] = *b"quickjs";

/// The project's files, read from [`SCRIPTS`] by the first call.
static FILES: OnceLock<Vec<(&'static str, &'static [u8])>> = OnceLock::new();

/// The module the handler is exported from.
const ENTRY: &str = "handler.js";
/// The contract's host interface, as componentize-js names it, at each
/// version: the SDK of a project names one. The engine implements
/// `sluice:plugin@0.2.0`, whose `host` is 0.1.0's; its capabilities are
/// [`capabilities::STATE_MODULE`] and [`capabilities::SECRETS_MODULE`].
const HOST_MODULES: [&str; 2] = ["sluice:plugin/host@0.1.0", "sluice:plugin/host@0.2.0"];
/// QuickJS's own stack guard, below the 1 MiB shadow stack Rust gives a
/// wasm32 program: deep recursion throws a RangeError instead of running
/// off the stack into the heap.
const MAX_STACK: usize = 512 << 10;
/// The export and method the world calls.
#[cfg(not(feature = "batch"))]
const EXPORT: (&str, &str) = ("messageHandler", "handle");
#[cfg(feature = "batch")]
const EXPORT: (&str, &str) = ("batchMessageHandler", "handleBatch");

/// What a raw handler must return, quoted when it returns something else.
const SHAPE_HINT: &str = "hint: a JavaScript handler on the raw bindings must return { tag: \"ok\", \
     val: [emits] } or { tag: \"err\", val: { tag: \"reject\", val: reason } }; with the SDK \
     (sluice.js) it returns its emits and throws Reject or Retry";

/// Globals that componentize-js (SpiderMonkey) has and QuickJS lacks:
/// `console`, and UTF-8 `TextEncoder`/`TextDecoder` over native code.
const PRELUDE: &str = r#"(native) => {
  const show = (v) => {
    if (typeof v === "string") return v;
    if (v instanceof Error) return `${v.name}: ${v.message}`;
    try {
      const json = JSON.stringify(v, (_, x) => (typeof x === "bigint" ? x.toString() : x));
      return json === undefined ? String(v) : json;
    } catch {
      return String(v);
    }
  };
  const out = (...args) => native.print(false, args.map(show).join(" "));
  const err = (...args) => native.print(true, args.map(show).join(" "));
  globalThis.console = { log: out, info: out, debug: out, trace: out, warn: err, error: err };
  const bytes = (input) => {
    if (input instanceof Uint8Array) return input;
    if (ArrayBuffer.isView(input)) return new Uint8Array(input.buffer, input.byteOffset, input.byteLength);
    if (input instanceof ArrayBuffer) return new Uint8Array(input);
    throw new TypeError("TextDecoder.decode takes an ArrayBuffer or an ArrayBuffer view");
  };
  globalThis.TextEncoder = class TextEncoder {
    get encoding() { return "utf-8"; }
    encode(text = "") { return native.encode(String(text)); }
  };
  globalThis.TextDecoder = class TextDecoder {
    constructor(label = "utf-8", options = {}) {
      const name = String(label).trim().toLowerCase();
      if (name !== "utf-8" && name !== "utf8" && name !== "unicode-1-1-utf-8") {
        throw new RangeError(`TextDecoder: only utf-8 is supported, not ${label}`);
      }
      this.fatal = Boolean(options.fatal);
      this.ignoreBOM = Boolean(options.ignoreBOM);
    }
    get encoding() { return "utf-8"; }
    decode(input = new Uint8Array(0)) { return native.decode(bytes(input), this.fatal, this.ignoreBOM); }
  };
}"#;

/// The engine, made by the first call and kept for the instance's life.
struct Engine {
    /// Dropped last: the context and values below belong to it.
    runtime: Runtime,
    context: Context,
    /// The exported handler object and its method.
    target: Persistent<Object<'static>>,
    method: Persistent<Function<'static>>,
}

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
}

/// Runs `f` with the handler; a JavaScript error or a wrong result is
/// printed to stderr (the runtime quotes it in the trap) and traps.
fn with_handler<R>(
    f: impl for<'js> FnOnce(&Ctx<'js>, Object<'js>, Function<'js>) -> Result<R, Failure<'js>>,
) -> R {
    ENGINE.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot = Some(Engine::start().unwrap_or_else(|e| fail(&e)));
        }
        let engine = slot.as_ref().expect("started above");
        let result = engine.context.with(|ctx| {
            let target = engine
                .target
                .clone()
                .restore(&ctx)
                .map_err(|e| e.to_string())?;
            let method = engine
                .method
                .clone()
                .restore(&ctx)
                .map_err(|e| e.to_string())?;
            f(&ctx, target, method).map_err(|e| e.to_string())
        });
        drain_jobs(&engine.runtime);
        result.unwrap_or_else(|e| fail(&e))
    })
}

/// Microtasks a call queued run before it returns, as they would in
/// componentize-js's event loop.
fn drain_jobs(runtime: &Runtime) {
    while runtime.is_job_pending() {
        if runtime.execute_pending_job().is_err() {
            break;
        }
    }
}

fn fail(message: &str) -> ! {
    eprintln!("{message}");
    panic!("the JavaScript handler failed (see above)");
}

/// Why a call failed: a JavaScript exception, or a result of the wrong shape.
enum Failure<'js> {
    Thrown(CaughtError<'js>),
    Shape(String),
}

impl std::fmt::Display for Failure<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Thrown(CaughtError::Exception(e)) => {
                let name = e
                    .get::<_, String>("name")
                    .unwrap_or_else(|_| "Error".into());
                write!(f, "{name}: {}", e.message().unwrap_or_default())?;
                match e.stack() {
                    Some(stack) if !stack.is_empty() => write!(f, "\n{}", stack.trim_end()),
                    _ => Ok(()),
                }
            }
            Failure::Thrown(CaughtError::Value(v)) => write!(f, "thrown: {v:?}"),
            Failure::Thrown(CaughtError::Error(e)) => write!(f, "{e}"),
            Failure::Shape(what) => write!(f, "{what}\n{SHAPE_HINT}"),
        }
    }
}

trait Caught<'js, T> {
    fn thrown(self, ctx: &Ctx<'js>) -> Result<T, Failure<'js>>;
}

impl<'js, T> Caught<'js, T> for rquickjs::Result<T> {
    fn thrown(self, ctx: &Ctx<'js>) -> Result<T, Failure<'js>> {
        self.catch(ctx).map_err(Failure::Thrown)
    }
}

fn shape<'js, T>(what: impl Into<String>) -> Result<T, Failure<'js>> {
    Err(Failure::Shape(what.into()))
}

impl Engine {
    fn start() -> Result<Engine, String> {
        if FILES.get().is_none() {
            let _ = FILES.set(injected()?);
        }
        let runtime = Runtime::new().map_err(|e| e.to_string())?;
        runtime.set_max_stack_size(MAX_STACK);
        runtime.set_loader(Scripts, Scripts);
        let context = Context::full(&runtime).map_err(|e| e.to_string())?;
        let (target, method) = context.with(|ctx| {
            let exported = || -> rquickjs::Result<_> {
                let prelude: Function<'_> = ctx.eval(PRELUDE)?;
                prelude.call::<_, ()>((natives(&ctx)?,))?;
                let fetch: Function<'_> = ctx.eval(capabilities::FETCH)?;
                fetch.call::<_, ()>((natives(&ctx)?,))?;
                let source = file(ENTRY).ok_or_else(|| {
                    Exception::throw_message(&ctx, &format!("the project has no {ENTRY}"))
                })?;
                let (module, promise) = Module::declare(ctx.clone(), ENTRY, source)?.eval()?;
                promise.finish::<()>()?;
                let (export, method) = EXPORT;
                let target: Value<'_> = module.get(export)?;
                let Some(target) = target.into_object() else {
                    return Err(Exception::throw_type(
                        &ctx,
                        &format!("{ENTRY} must export `{export}`, an object with `{method}`"),
                    ));
                };
                let func: Function<'_> = target.get(method).map_err(|_| {
                    Exception::throw_type(&ctx, &format!("`{export}.{method}` is not a function"))
                })?;
                Ok((Persistent::save(&ctx, target), Persistent::save(&ctx, func)))
            };
            exported()
                .thrown(&ctx)
                .map_err(|e| format!("loading {ENTRY} failed: {e}"))
        })?;
        Ok(Engine {
            runtime,
            context,
            target,
            method,
        })
    }
}

fn file(path: &str) -> Option<&'static [u8]> {
    FILES
        .get()?
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, source)| *source)
}

/// The files `sluice plugin build` injected.
fn injected() -> Result<Vec<(&'static str, &'static [u8])>, String> {
    // SAFETY: volatile reads of an immutable static, so that the compiler
    // reads what the injector wrote rather than folding the `0` it sees.
    let (area, len) = unsafe {
        (
            std::ptr::read_volatile(&raw const SLOT.area),
            std::ptr::read_volatile(&raw const SLOT.len),
        )
    };
    if len == 0 {
        let why = "no scripts were injected into this QuickJS engine: build the project \
                   with `sluice plugin build`";
        return Err(why.into());
    }
    let len = usize::try_from(len).unwrap_or(usize::MAX).min(CAPACITY);
    // SAFETY: `area` is SCRIPTS, which nothing writes at run time, and
    // `len` is within it.
    let bundle: &'static [u8] = unsafe { std::slice::from_raw_parts(area, len) };
    parse_bundle(bundle).ok_or_else(|| {
        "the scripts injected into this QuickJS engine are damaged: rebuild the project with \
         `sluice plugin build`"
            .into()
    })
}

/// The files of a bundle (see [`SCRIPTS`]), or None when it is malformed.
fn parse_bundle(mut bundle: &[u8]) -> Option<Vec<(&str, &[u8])>> {
    fn take<'a>(bundle: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = bundle.split_at_checked(n)?;
        *bundle = rest;
        Some(head)
    }
    fn number(bundle: &mut &[u8]) -> Option<usize> {
        let bytes = take(bundle, 4)?.try_into().ok()?;
        usize::try_from(u32::from_le_bytes(bytes)).ok()
    }
    let count = number(&mut bundle)?;
    let mut files = Vec::with_capacity(count.min(bundle.len() / 8));
    for _ in 0..count {
        let name = number(&mut bundle)?;
        let name = std::str::from_utf8(take(&mut bundle, name)?).ok()?;
        let len = number(&mut bundle)?;
        files.push((name, take(&mut bundle, len)?));
    }
    bundle.is_empty().then_some(files)
}

/// The native half of [`PRELUDE`].
fn natives<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Object<'js>> {
    let native = Object::new(ctx.clone())?;
    native.set(
        "print",
        Function::new(ctx.clone(), |to_stderr: bool, text: String| {
            if to_stderr {
                eprintln!("{text}");
            } else {
                println!("{text}");
            }
        }),
    )?;
    native.set(
        "encode",
        Function::new(ctx.clone(), |ctx: Ctx<'js>, text: String| {
            TypedArray::<u8>::new(ctx, text.into_bytes())
        }),
    )?;
    native.set(
        "decode",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'js>, input: TypedArray<'js, u8>, fatal: bool, ignore_bom: bool| {
                let bytes = bytes_of(&input);
                let bytes = match bytes.strip_prefix(b"\xEF\xBB\xBF") {
                    Some(rest) if !ignore_bom => rest,
                    _ => bytes,
                };
                match std::str::from_utf8(bytes) {
                    Ok(text) => rquickjs::String::from_str(ctx, text),
                    Err(_) if fatal => Err(Exception::throw_type(
                        &ctx,
                        "The encoded data was not valid for encoding utf-8",
                    )),
                    Err(_) => rquickjs::String::from_str(ctx, &String::from_utf8_lossy(bytes)),
                }
            },
        ),
    )?;
    native.set("fetch", capabilities::native_fetch(ctx)?)?;
    Ok(native)
}

/// Resolves `./x.js` and `../x.js` against the importing module, and loads
/// the injected scripts and the host module.
struct Scripts;

impl Resolver for Scripts {
    fn resolve<'js>(
        &mut self,
        _ctx: &Ctx<'js>,
        base: &str,
        name: &str,
        _attributes: Option<rquickjs::loader::ImportAttributes<'js>>,
    ) -> rquickjs::Result<String> {
        if !name.starts_with("./") && !name.starts_with("../") {
            return Ok(name.to_owned());
        }
        let mut parts: Vec<&str> = base.split('/').collect();
        parts.pop();
        for part in name.split('/') {
            match part {
                "." | "" => {}
                ".." => {
                    parts.pop();
                }
                _ => parts.push(part),
            }
        }
        Ok(parts.join("/"))
    }
}

impl Loader for Scripts {
    fn load<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        name: &str,
        _attributes: Option<rquickjs::loader::ImportAttributes<'js>>,
    ) -> rquickjs::Result<Module<'js, Declared>> {
        if HOST_MODULES.contains(&name) {
            return Module::declare_def::<HostModule, _>(ctx.clone(), name);
        }
        if name == capabilities::SECRETS_MODULE {
            return Module::declare_def::<capabilities::SecretsModule, _>(ctx.clone(), name);
        }
        #[cfg(not(feature = "batch"))]
        if name == capabilities::STATE_MODULE {
            return Module::declare_def::<capabilities::StateModule, _>(ctx.clone(), name);
        }
        #[cfg(feature = "batch")]
        if name == capabilities::STATE_MODULE {
            return Err(Exception::throw_reference(
                ctx,
                &format!(
                    "a batch handler cannot use state (`{name}` is in the `handler` world only: \
                     a batch's items settle one by one); export a `messageHandler` instead"
                ),
            ));
        }
        match file(name) {
            Some(source) => Module::declare(ctx.clone(), name, source),
            None => Err(Exception::throw_reference(
                ctx,
                &format!(
                    "cannot find module `{name}`: only the project's .js and .mjs files are built in"
                ),
            )),
        }
    }
}

/// `sluice:plugin/host`: `log(level, text)` and `configGet(key)`.
struct HostModule;

impl ModuleDef for HostModule {
    fn declare(decl: &rquickjs::module::Declarations<'_>) -> rquickjs::Result<()> {
        decl.declare("log")?;
        decl.declare("configGet")?;
        Ok(())
    }

    fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
        exports.export(
            "log",
            Function::new(ctx.clone(), |ctx: Ctx<'js>, level: String, text: String| {
                let level = match level.as_str() {
                    "trace" => Level::Trace,
                    "debug" => Level::Debug,
                    "info" => Level::Info,
                    "warn" => Level::Warn,
                    "error" => Level::Error,
                    _ => {
                        return Err(Exception::throw_type(
                            &ctx,
                            &format!(
                                "log level must be trace, debug, info, warn or error, not {level:?}"
                            ),
                        ));
                    }
                };
                host::log(level, &text);
                Ok(())
            }),
        )?;
        exports.export(
            "configGet",
            Function::new(ctx.clone(), |key: String| host::config_get(&key)),
        )?;
        Ok(())
    }
}

/// The message as componentize-js gives it to a handler.
fn message<'js>(ctx: &Ctx<'js>, msg: Message) -> rquickjs::Result<Object<'js>> {
    let raw = Object::new(ctx.clone())?;
    raw.set("id", msg.id)?;
    raw.set("topic", msg.topic)?;
    raw.set("key", msg.key)?;
    let headers = Array::new(ctx.clone())?;
    for (i, (name, value)) in msg.headers.into_iter().enumerate() {
        let pair = Array::new(ctx.clone())?;
        pair.set(0, name)?;
        pair.set(1, value)?;
        headers.set(i, pair)?;
    }
    raw.set("headers", headers)?;
    raw.set("payload", TypedArray::<u8>::new(ctx.clone(), msg.payload)?)?;
    raw.set("attempt", msg.attempt)?;
    raw.set(
        "publishedAt",
        BigInt::from_u64(ctx.clone(), msg.published_at)?,
    )?;
    Ok(raw)
}

/// Calls the handler's method on `arg`; a returned Promise is run to its end.
fn call<'js>(
    ctx: &Ctx<'js>,
    target: Object<'js>,
    method: Function<'js>,
    arg: Value<'js>,
) -> Result<Value<'js>, Failure<'js>> {
    let result: Value<'js> = method.call((This(target), arg)).thrown(ctx)?;
    match result.as_promise() {
        Some(promise) => promise.finish::<Value<'js>>().thrown(ctx),
        None => Ok(result),
    }
}

/// `{ tag: "ok", val: [emits] }` or `{ tag: "err", val: { tag, val } }`.
fn outcome<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<Outcome, Failure<'js>> {
    let Some(result) = value.as_object() else {
        return shape(format!("the handler returned {}", kind(&value)));
    };
    let tag: Option<String> = result.get("tag").thrown(ctx)?;
    let val: Value<'js> = result.get("val").thrown(ctx)?;
    match tag.as_deref() {
        Some("ok") => {
            let Some(list) = val.as_array() else {
                return shape(format!(
                    "`val` of an ok result is {}, not an array of emits",
                    kind(&val)
                ));
            };
            list.iter::<Value<'js>>()
                .map(|item| emit(ctx, item.thrown(ctx)?))
                .collect::<Result<Vec<_>, _>>()
                .map(Ok)
        }
        Some("err") => error(ctx, val).map(Err),
        _ => shape(format!("the handler returned {}", kind(&value))),
    }
}

fn error<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<HandlerError, Failure<'js>> {
    let Some(error) = value.as_object() else {
        return shape(format!("`val` of an err result is {}", kind(&value)));
    };
    let tag: Option<String> = error.get("tag").thrown(ctx)?;
    let val: Value<'js> = error.get("val").thrown(ctx)?;
    match tag.as_deref() {
        Some("reject") => match val.as_string() {
            Some(reason) => Ok(HandlerError::Reject(reason.to_string().thrown(ctx)?)),
            None => shape(format!("a reject's reason is {}, not a string", kind(&val))),
        },
        Some("retry") => {
            let after = if val.is_undefined() || val.is_null() {
                None
            } else if let Some(big) = val.as_big_int() {
                Some(u64::try_from(big.clone().to_i64().thrown(ctx)?).unwrap_or(0))
            } else if let Some(n) = val.as_number().filter(|n| *n >= 0.0) {
                Some(n as u64)
            } else {
                return shape(format!("a retry's delay is {}, not a BigInt", kind(&val)));
            };
            Ok(HandlerError::Retry(after))
        }
        _ => shape(format!(
            "the error is {}, not {{ tag: \"reject\" | \"retry\", val }}",
            kind(&value)
        )),
    }
}

fn emit<'js>(ctx: &Ctx<'js>, value: Value<'js>) -> Result<Emit, Failure<'js>> {
    let Some(emit) = value.as_object() else {
        return shape(format!("an emit is {}, not an object", kind(&value)));
    };
    let topic: Value<'js> = emit.get("topic").thrown(ctx)?;
    let topic = match topic.as_string() {
        Some(topic) => topic.to_string().thrown(ctx)?,
        None => return shape(format!("an emit's topic is {}, not a string", kind(&topic))),
    };
    let key: Value<'js> = emit.get("key").thrown(ctx)?;
    let key = if key.is_undefined() || key.is_null() {
        None
    } else if let Some(key) = key.as_string() {
        Some(key.to_string().thrown(ctx)?)
    } else {
        return shape(format!("an emit's key is {}, not a string", kind(&key)));
    };
    let list: Value<'js> = emit.get("headers").thrown(ctx)?;
    let mut headers = Vec::new();
    if let Some(list) = list.as_array() {
        for pair in list.iter::<Value<'js>>() {
            let pair = pair.thrown(ctx)?;
            let strings = pair.as_array().filter(|p| p.len() == 2).and_then(|p| {
                let name: Value<'js> = p.get(0).ok()?;
                let value: Value<'js> = p.get(1).ok()?;
                Some((
                    name.as_string()?.to_string().ok()?,
                    value.as_string()?.to_string().ok()?,
                ))
            });
            match strings {
                Some(header) => headers.push(header),
                None => {
                    return shape(format!(
                        "a header is {}, not [name, value] strings",
                        kind(&pair)
                    ));
                }
            }
        }
    } else if !(list.is_undefined() || list.is_null()) {
        return shape(format!(
            "an emit's headers are {}, not an array of [name, value]",
            kind(&list)
        ));
    }
    let payload: Value<'js> = emit.get("payload").thrown(ctx)?;
    let payload = match TypedArray::<u8>::from_value(payload.clone()) {
        Ok(bytes) => bytes_of(&bytes).to_vec(),
        Err(_) => {
            return shape(format!(
                "an emit's payload is {}, not a Uint8Array",
                kind(&payload)
            ));
        }
    };
    Ok(Emit {
        topic,
        key,
        headers,
        payload,
    })
}

/// The bytes of `array` (none when detached), to be used before any
/// JavaScript runs again.
fn bytes_of<'a>(array: &'a TypedArray<'_, u8>) -> &'a [u8] {
    // SAFETY: every caller copies the bytes out (into a Vec or a new JS
    // string) before running JavaScript, which alone could change them.
    unsafe { array.as_bytes() }.unwrap_or_default()
}

/// What a value is, for an error message.
fn kind(value: &Value<'_>) -> String {
    if value.is_array() {
        "an array".into()
    } else if let Some(s) = value.as_string() {
        format!("the string {:?}", s.to_string().unwrap_or_default())
    } else {
        value.type_name().to_string()
    }
}

#[cfg(not(feature = "batch"))]
fn handle(msg: Message) -> Outcome {
    with_handler(|ctx, target, method| {
        let raw = message(ctx, msg).thrown(ctx)?;
        let result = call(ctx, target, method, raw.into_value())?;
        outcome(ctx, result)
    })
}

#[cfg(not(feature = "batch"))]
sluice_sdk::export_handler!(handle);

#[cfg(feature = "batch")]
fn handle_batch(msgs: Vec<Message>) -> Vec<Outcome> {
    with_handler(|ctx, target, method| {
        let raws = Array::new(ctx.clone()).thrown(ctx)?;
        for (i, msg) in msgs.into_iter().enumerate() {
            raws.set(i, message(ctx, msg).thrown(ctx)?).thrown(ctx)?;
        }
        let result = call(ctx, target, method, raws.into_value())?;
        let Some(results) = result.as_array() else {
            return shape(format!(
                "the batch handler returned {}, not an array",
                kind(&result)
            ));
        };
        results
            .iter::<Value<'_>>()
            .map(|r| outcome(ctx, r.thrown(ctx)?))
            .collect()
    })
}

#[cfg(feature = "batch")]
sluice_sdk::export_batch_handler!(handle_batch);
