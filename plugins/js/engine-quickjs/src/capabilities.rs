//! The capabilities of `sluice:plugin@0.2.0` as scripts see them, the same
//! on QuickJS as on componentize-js: the modules `sluice:plugin/state@0.2.0`
//! and `sluice:plugin/secrets@0.2.0` with the functions, values and errors
//! the componentize-js bindings have (so the SDK's `sluice-state.js` and
//! `sluice-secrets.js` run unchanged), and a global `fetch` over the Rust
//! SDK's HTTP client.
//!
//! The engine imports every capability of its world, whatever its scripts
//! use: a stage that does not grant one answers each call with an error
//! naming the stage and the grant to add (the runtime knows the engine by
//! its `sluice-engine` custom section and does not refuse it at load).

use rquickjs::module::{Declarations, Exports, ModuleDef};
use rquickjs::{Array, Ctx, Exception, Function, Object, TypedArray, Value};

use crate::bytes_of;

/// The state interface, as componentize-js names it.
pub const STATE_MODULE: &str = "sluice:plugin/state@0.2.0";
/// The secrets interface, as componentize-js names it.
pub const SECRETS_MODULE: &str = "sluice:plugin/secrets@0.2.0";

/// Throws what the componentize-js bindings throw for a WIT `result`'s
/// error: an `Error` whose `payload` is the error variant `{ tag, val }`.
fn component_error<'js>(ctx: &Ctx<'js>, tag: &str, val: &str) -> rquickjs::Error {
    let build = || -> rquickjs::Result<Value<'js>> {
        let error = Exception::from_message(ctx.clone(), &format!("{tag}: {val}"))?;
        let payload = Object::new(ctx.clone())?;
        payload.set("tag", tag)?;
        payload.set("val", val)?;
        error.set("payload", payload)?;
        error.set("name", "ComponentError")?;
        Ok(error.into_value())
    };
    match build() {
        Ok(error) => ctx.throw(error),
        Err(e) => e,
    }
}

/// A `list<u8>` argument: a Uint8Array (or another ArrayBuffer view).
fn bytes_arg<'js>(ctx: &Ctx<'js>, value: Value<'js>, what: &str) -> rquickjs::Result<Vec<u8>> {
    match TypedArray::<u8>::from_value(value) {
        Ok(array) => Ok(bytes_of(&array).to_vec()),
        Err(_) => Err(Exception::throw_type(
            ctx,
            &format!("{what} is a Uint8Array"),
        )),
    }
}

/// `sluice:plugin/state@0.2.0`: get, set, delete, compareAndSet, increment
/// and list, as the componentize-js bindings give them.
#[cfg(not(feature = "batch"))]
pub struct StateModule;

#[cfg(not(feature = "batch"))]
mod state_module {
    use rquickjs::BigInt;
    use sluice_sdk::state::{self, StateError};

    use super::*;

    /// A `u64` argument: a BigInt, or a whole number >= 0.
    fn u64_of<'js>(ctx: &Ctx<'js>, value: &Value<'js>, what: &str) -> rquickjs::Result<u64> {
        if let Some(big) = value.as_big_int() {
            let n = big.clone().to_i64()?;
            return u64::try_from(n).map_err(|_| {
                Exception::throw_range(ctx, &format!("{what} must not be negative, not {n}"))
            });
        }
        match value.as_number() {
            Some(n) if n >= 0.0 && n.fract() == 0.0 && n <= u64::MAX as f64 => Ok(n as u64),
            _ => Err(Exception::throw_type(
                ctx,
                &format!("{what} is a BigInt or a whole number >= 0"),
            )),
        }
    }

    /// An `option<u64>` argument: undefined or null is none.
    fn optional_u64<'js>(
        ctx: &Ctx<'js>,
        value: &Value<'js>,
        what: &str,
    ) -> rquickjs::Result<Option<u64>> {
        if value.is_undefined() || value.is_null() {
            Ok(None)
        } else {
            u64_of(ctx, value, what).map(Some)
        }
    }

    /// An `s64` argument: a BigInt or a whole number.
    fn i64_of<'js>(ctx: &Ctx<'js>, value: &Value<'js>, what: &str) -> rquickjs::Result<i64> {
        if let Some(big) = value.as_big_int() {
            return big.clone().to_i64();
        }
        match value.as_number() {
            Some(n) if n.fract() == 0.0 && n.abs() <= i64::MAX as f64 => Ok(n as i64),
            _ => Err(Exception::throw_type(
                ctx,
                &format!("{what} is a BigInt or a whole number"),
            )),
        }
    }

    fn thrown<'js>(ctx: &Ctx<'js>, e: StateError) -> rquickjs::Error {
        let (tag, val) = match &e {
            StateError::NotGranted(why) => ("not-granted", why),
            StateError::StoreFull(why) => ("store-full", why),
            StateError::Invalid(why) => ("invalid", why),
            StateError::Unavailable(why) => ("unavailable", why),
        };
        component_error(ctx, tag, val)
    }

    impl ModuleDef for StateModule {
        fn declare(decl: &Declarations<'_>) -> rquickjs::Result<()> {
            for name in ["get", "set", "delete", "compareAndSet", "increment", "list"] {
                decl.declare(name)?;
            }
            Ok(())
        }

        fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
            exports.export(
                "get",
                Function::new(
                    ctx.clone(),
                    |ctx: Ctx<'js>, key: String| -> rquickjs::Result<Value<'js>> {
                        match state::get(&key).map_err(|e| thrown(&ctx, e))? {
                            None => Ok(Value::new_undefined(ctx)),
                            Some(entry) => {
                                let out = Object::new(ctx.clone())?;
                                out.set("value", TypedArray::<u8>::new(ctx.clone(), entry.value)?)?;
                                out.set(
                                    "revision",
                                    BigInt::from_u64(ctx.clone(), entry.revision)?,
                                )?;
                                Ok(out.into_value())
                            }
                        }
                    },
                ),
            )?;
            exports.export(
                "set",
                Function::new(
                    ctx.clone(),
                    |ctx: Ctx<'js>,
                     key: String,
                     value: Value<'js>,
                     ttl: rquickjs::function::Opt<Value<'js>>| {
                        let value = bytes_arg(&ctx, value, "a state value")?;
                        let ttl = match ttl.0 {
                            Some(ttl) => optional_u64(&ctx, &ttl, "a ttl")?,
                            None => None,
                        };
                        let done = match ttl {
                            Some(ms) => state::set_with_ttl(
                                &key,
                                value,
                                std::time::Duration::from_millis(ms),
                            ),
                            None => state::set(&key, value),
                        };
                        done.map_err(|e| thrown(&ctx, e))
                    },
                ),
            )?;
            exports.export(
                "delete",
                Function::new(ctx.clone(), |ctx: Ctx<'js>, key: String| {
                    state::delete(&key).map_err(|e| thrown(&ctx, e))
                }),
            )?;
            exports.export(
                "compareAndSet",
                Function::new(
                    ctx.clone(),
                    |ctx: Ctx<'js>,
                     key: String,
                     revision: Value<'js>,
                     value: Value<'js>,
                     ttl: rquickjs::function::Opt<Value<'js>>| {
                        let revision = u64_of(&ctx, &revision, "a revision")?;
                        let value = bytes_arg(&ctx, value, "a state value")?;
                        let ttl = match ttl.0 {
                            Some(ttl) => optional_u64(&ctx, &ttl, "a ttl")?,
                            None => None,
                        };
                        state::compare_and_set(
                            &key,
                            revision,
                            value,
                            ttl.map(std::time::Duration::from_millis),
                        )
                        .map_err(|e| thrown(&ctx, e))
                    },
                ),
            )?;
            exports.export(
                "increment",
                Function::new(
                    ctx.clone(),
                    |ctx: Ctx<'js>, key: String, delta: Value<'js>| {
                        let delta = i64_of(&ctx, &delta, "an increment")?;
                        let n = state::increment(&key, delta).map_err(|e| thrown(&ctx, e))?;
                        BigInt::from_i64(ctx, n)
                    },
                ),
            )?;
            exports.export(
                "list",
                Function::new(
                    ctx.clone(),
                    |ctx: Ctx<'js>, prefix: String, limit: Value<'js>| {
                        let limit = u64_of(&ctx, &limit, "a limit")?;
                        let limit = u32::try_from(limit).unwrap_or(u32::MAX);
                        state::list(&prefix, limit).map_err(|e| thrown(&ctx, e))
                    },
                ),
            )?;
            Ok(())
        }
    }
}

/// `sluice:plugin/secrets@0.2.0`: `get(name)`.
pub struct SecretsModule;

impl ModuleDef for SecretsModule {
    fn declare(decl: &Declarations<'_>) -> rquickjs::Result<()> {
        decl.declare("get")?;
        Ok(())
    }

    fn evaluate<'js>(ctx: &Ctx<'js>, exports: &Exports<'js>) -> rquickjs::Result<()> {
        exports.export(
            "get",
            Function::new(ctx.clone(), |ctx: Ctx<'js>, name: String| {
                sluice_sdk::secrets::get(&name).map_err(|e| match e {
                    sluice_sdk::secrets::SecretError::NotGranted(why) => {
                        component_error(&ctx, "not-granted", &why)
                    }
                })
            }),
        )?;
        Ok(())
    }
}

/// The global `fetch`, `Headers` and `Response` (a small subset of the
/// standard's, enough for a handler's API calls), over `native.fetch`,
/// which sends one request with the Rust SDK's client and follows one
/// redirect. `fetch` returns a Promise, as the standard one does: a
/// request that gets no answer rejects it with a TypeError saying why.
pub const FETCH: &str = r#"(native) => {
  const encoder = new TextEncoder();
  const bodyBytes = (body) => {
    if (body === undefined || body === null) return undefined;
    if (typeof body === "string") return encoder.encode(body);
    if (body instanceof Uint8Array) return body;
    if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    if (body instanceof ArrayBuffer) return new Uint8Array(body);
    if (typeof URLSearchParams !== "undefined" && body instanceof URLSearchParams) return encoder.encode(String(body));
    throw new TypeError("a fetch body is a string, a Uint8Array, an ArrayBuffer or a view of one");
  };
  class Headers {
    #list = [];
    constructor(init = undefined) {
      if (init === undefined || init === null) return;
      if (init instanceof Headers) {
        for (const [n, v] of init) this.append(n, v);
      } else if (Array.isArray(init)) {
        for (const pair of init) {
          if (!Array.isArray(pair) || pair.length !== 2) throw new TypeError("a header is a [name, value] pair");
          this.append(pair[0], pair[1]);
        }
      } else if (typeof init === "object") {
        for (const [n, v] of Object.entries(init)) this.append(n, v);
      } else {
        throw new TypeError("headers are a Headers, an array of [name, value] or an object");
      }
    }
    append(name, value) { this.#list.push([String(name).toLowerCase(), String(value)]); }
    set(name, value) { this.delete(name); this.append(name, value); }
    delete(name) { const n = String(name).toLowerCase(); this.#list = this.#list.filter(([k]) => k !== n); }
    has(name) { const n = String(name).toLowerCase(); return this.#list.some(([k]) => k === n); }
    get(name) {
      const n = String(name).toLowerCase();
      const found = this.#list.filter(([k]) => k === n).map(([, v]) => v);
      return found.length === 0 ? null : found.join(", ");
    }
    forEach(fn, self = undefined) { for (const [n, v] of this.#list) fn.call(self, v, n, this); }
    *entries() { yield* this.#list.map(([n, v]) => [n, v]); }
    *keys() { for (const [n] of this.#list) yield n; }
    *values() { for (const [, v] of this.#list) yield v; }
    [Symbol.iterator]() { return this.entries(); }
  }
  class Response {
    #body;
    #used = false;
    constructor(body = undefined, init = {}) {
      this.#body = bodyBytes(body) ?? new Uint8Array(0);
      this.status = init.status ?? 200;
      this.statusText = init.statusText ?? "";
      this.headers = new Headers(init.headers);
      this.url = init.url ?? "";
      this.redirected = Boolean(init.redirected);
    }
    get ok() { return this.status >= 200 && this.status < 300; }
    get bodyUsed() { return this.#used; }
    #take() {
      if (this.#used) return Promise.reject(new TypeError("the response body was read already"));
      this.#used = true;
      return Promise.resolve(this.#body);
    }
    arrayBuffer() { return this.#take().then((b) => b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength)); }
    bytes() { return this.#take().then((b) => new Uint8Array(b)); }
    text() { return this.#take().then((b) => new TextDecoder().decode(b)); }
    json() { return this.text().then((t) => JSON.parse(t)); }
  }
  const fetch = async (input, init = {}) => {
    const request = typeof input === "object" && input !== null && typeof input.url === "string" ? input : undefined;
    const url = String(request?.url ?? input);
    const method = String(init.method ?? request?.method ?? "GET").toUpperCase();
    const headers = new Headers(init.headers ?? request?.headers);
    const body = bodyBytes(init.body ?? request?.body);
    const answer = native.fetch(method, url, [...headers], body);
    return new Response(answer.body, { status: answer.status, headers: answer.headers, url });
  };
  globalThis.Headers = Headers;
  globalThis.Response = Response;
  globalThis.fetch = fetch;
}"#;

/// `native.fetch(method, url, headers, body)`: the answer as `{ status,
/// headers: [[name, value]], body: Uint8Array }`, or a TypeError saying
/// why there is none.
pub fn native_fetch<'js>(ctx: &Ctx<'js>) -> rquickjs::Result<Function<'js>> {
    Function::new(
        ctx.clone(),
        |ctx: Ctx<'js>,
         method: String,
         url: String,
         headers: Array<'js>,
         body: Value<'js>|
         -> rquickjs::Result<Object<'js>> {
            let mut request = sluice_sdk::http::Request::new(&method, &url);
            for pair in headers.iter::<Array<'js>>() {
                let pair = pair?;
                let name: String = pair.get(0)?;
                let value: String = pair.get(1)?;
                request = request.header(&name, value);
            }
            if !(body.is_undefined() || body.is_null()) {
                request = request.body(bytes_arg(&ctx, body, "a fetch body")?);
            }
            let answer = request.send().map_err(|e| {
                Exception::throw_type(&ctx, &format!("fetch {method} {url} failed: {e}"))
            })?;
            let out = Object::new(ctx.clone())?;
            out.set("status", answer.status)?;
            let list = Array::new(ctx.clone())?;
            for (i, (name, value)) in answer.headers.into_iter().enumerate() {
                let pair = Array::new(ctx.clone())?;
                pair.set(0, name)?;
                pair.set(1, value)?;
                list.set(i, pair)?;
            }
            out.set("headers", list)?;
            out.set("body", TypedArray::<u8>::new(ctx.clone(), answer.body)?)?;
            Ok(out)
        },
    )
}

#[cfg(test)]
mod tests {
    //! The glue on the host's QuickJS, with a fake `native.fetch`: the
    //! calls into the SDK need the component's imports.

    use rquickjs::promise::Promise;
    use rquickjs::{CatchResultExt, Context, Runtime};

    use super::*;

    /// Runs `script` (an expression, a Promise of a string) with the
    /// prelude, [`FETCH`] over `fake_fetch` (JavaScript) and `fail(tag,
    /// val)`, which throws like a WIT error, as globals.
    fn run(fake_fetch: &str, script: &str) -> Result<String, String> {
        let runtime = Runtime::new().expect("runtime");
        let context = Context::full(&runtime).expect("context");
        context.with(|ctx| {
            let go = || -> rquickjs::Result<String> {
                let native = crate::natives(&ctx)?;
                let prelude: Function<'_> = ctx.eval(crate::PRELUDE)?;
                prelude.call::<_, ()>((native.clone(),))?;
                let fake: Function<'_> = ctx.eval(fake_fetch)?;
                native.set("fetch", fake)?;
                let glue: Function<'_> = ctx.eval(FETCH)?;
                glue.call::<_, ()>((native,))?;
                ctx.globals().set(
                    "fail",
                    Function::new(ctx.clone(), |ctx: Ctx<'_>, tag: String, val: String| {
                        Err::<(), _>(component_error(&ctx, &tag, &val))
                    }),
                )?;
                let promise: Promise<'_> = ctx.eval(script)?;
                promise.finish::<String>()
            };
            go().catch(&ctx).map_err(|e| e.to_string())
        })
    }

    const ANSWER: &str = r#"(method, url, headers, body) => {
      globalThis.seen = { method, url, headers, body: body === undefined ? null : new TextDecoder().decode(body) };
      return {
        status: 201,
        headers: [["x-served-by", "api-1"], ["set-cookie", "a"], ["set-cookie", "b"]],
        body: new TextEncoder().encode('{"made":7}'),
      };
    }"#;

    #[test]
    fn fetch_sends_method_headers_and_body_and_reads_the_answer() {
        let out = run(
            ANSWER,
            r#"(async () => {
              const r = await fetch("http://api.test/x?y=1", {
                method: "post",
                headers: { "Content-Type": "text/plain", "X-A": 1 },
                body: "hi",
              });
              const json = await r.json();
              let again;
              try { await r.text(); } catch (e) { again = e.name; }
              return JSON.stringify([r.status, r.ok, r.headers.get("X-Served-By"),
                r.headers.get("set-cookie"), r.headers.has("nope"), json, r.bodyUsed, again, seen]);
            })()"#,
        )
        .expect("fetch");
        assert_eq!(
            out,
            r#"[201,true,"api-1","a, b",false,{"made":7},true,"TypeError",{"method":"POST","url":"http://api.test/x?y=1","headers":[["content-type","text/plain"],["x-a","1"]],"body":"hi"}]"#
        );
    }

    #[test]
    fn fetch_takes_bytes_header_pairs_and_a_request_object_and_gives_bytes() {
        let out = run(
            ANSWER,
            r#"(async () => {
              const r = await fetch({ url: "https://api.test/", method: "PUT", headers: [["k", "v"]] },
                { body: new Uint8Array([104, 105]) });
              const bytes = new Uint8Array(await r.arrayBuffer());
              const get = await fetch("https://api.test/get");
              return JSON.stringify([bytes.length, seen.method, seen.headers, seen.body, get.ok]);
            })()"#,
        )
        .expect("fetch");
        assert_eq!(out, r#"[10,"GET",[],null,true]"#);
        let out = run(
            ANSWER,
            r#"(async () => {
              await fetch({ url: "https://api.test/", method: "PUT", headers: [["k", "v"]] },
                { body: new Uint8Array([104, 105]) });
              return JSON.stringify(seen);
            })()"#,
        )
        .expect("fetch");
        assert_eq!(
            out,
            r#"{"method":"PUT","url":"https://api.test/","headers":[["k","v"]],"body":"hi"}"#
        );
    }

    #[test]
    fn a_request_that_gets_no_answer_rejects_the_promise() {
        let out = run(
            r#"() => { throw new TypeError("fetch GET http://x/ failed: request failed: stage `p/s` does not grant http"); }"#,
            r#"fetch("http://x/").then(() => "answered", (e) => `${e.name}: ${e.message}`)"#,
        )
        .expect("settled");
        assert_eq!(
            out,
            "TypeError: fetch GET http://x/ failed: request failed: stage `p/s` does not grant http"
        );
        let out = run(
            ANSWER,
            r#"fetch("http://x/", { body: 7 }).then(() => "sent", (e) => e.name)"#,
        )
        .expect("settled");
        assert_eq!(out, "TypeError", "a number is no body");
    }

    #[test]
    fn a_wit_error_is_thrown_as_componentize_js_throws_it() {
        let out = run(
            ANSWER,
            r#"(async () => {
              try { fail("not-granted", "stage `p/s` does not grant state"); }
              catch (e) { return JSON.stringify([e instanceof Error, e.payload, e.message]); }
              return "not thrown";
            })()"#,
        )
        .expect("caught");
        assert_eq!(
            out,
            r#"[true,{"tag":"not-granted","val":"stage `p/s` does not grant state"},"not-granted: stage `p/s` does not grant state"]"#
        );
    }

    #[test]
    fn headers_and_responses_behave_as_the_standard_ones() {
        let out = run(
            ANSWER,
            r#"(async () => {
              const h = new Headers({ A: "1" });
              h.append("a", "2");
              h.set("B", "3");
              h.delete("nope");
              const pairs = [...h];
              const r = new Response("text", { status: 404, headers: h });
              return JSON.stringify([pairs, h.get("a"), r.ok, r.status, await r.text()]);
            })()"#,
        )
        .expect("ran");
        assert_eq!(
            out,
            r#"[[["a","1"],["a","2"],["b","3"]],"1, 2",false,404,"text"]"#
        );
    }
}
