// Write a Sluice stream handler in JavaScript as one plain function.
//
//   import { handler, Reject } from "./sluice.js";
//
//   export const messageHandler = handler((msg) => {
//     if (msg.payload.length === 0) throw new Reject("empty payload"); // dead-lettered now, as `rejected`
//     return msg.text().toUpperCase(); // one emit to the stage's default output
//   });
//
// Build it with `sluice plugin build` and try it with `sluice plugin test`.
//
// The contract. The import below names the contract's version: a project
// that `sluice plugin new` wrote before the capabilities has it at 0.1.0,
// and a newer one at 0.2.0, with the capabilities as modules of their own
// beside this one, so that a handler imports only those it uses (a stage
// refuses a component that imports a capability it does not grant):
//
// - `import * as state from "./sluice-state.js"`: the stage's key-value
//   store (`state: true`), committed with the call's outcome;
// - `import * as secrets from "./sluice-secrets.js"`: the secrets the stage
//   lists (`secrets: [name]`);
// - `fetch`, the standard one: outbound HTTP to the hosts the stage's
//   `http.allow` lists. `sluice plugin build` links it (componentize-js's
//   `http` feature, `wasi:http/outgoing-handler`) only when the handler's
//   code names `fetch`.
//
// Both engines run them. On SpiderMonkey (componentize-js) the component
// imports only what the code uses, and a stage that does not grant one
// refuses it at load; the QuickJS engine imports every capability, and on
// a stage that does not grant one each call of it fails, naming the stage
// and the grant to add.
//
// A handler that uses `fetch` is `async` (it returns a Promise), and the
// engine runs the call's Promise to its end before the call returns:
//
//   export const messageHandler = handler(async (msg) => {
//     const answer = await fetch("https://api.example.com/v1/charge", {
//       method: "POST",
//       headers: { "content-type": "application/json" },
//       body: msg.payload,
//     });
//     if (answer.status >= 500 || answer.status === 429) throw new Retry();
//     if (!answer.ok) throw new Reject(`charge refused: ${answer.status}`);
//     return await answer.text();
//   });
//
// Only the hosts the stage's `http.allow` lists are reachable; a request to
// another makes `fetch` reject. The host adds `Idempotency-Key: <message
// id>:<n>` to the call's n-th request unless it has one (so a redelivered
// message repeats the same keys) and the stage's `http.headers` (secrets
// included), and the request counts against the stage's `timeout`. A
// rejected `fetch` the handler does not catch is a bug: the call traps and
// is retried.
//
// What a handler may return (emits are published only if the call succeeds):
//
// - `undefined`, `null` or `[]`: nothing is emitted; the message is done.
// - a `Uint8Array`, a string (UTF-8), or a plain object or array that is not a
//   list of emits (JSON-encoded): one emit to the stage's default output.
// - an `Emit` (`new Emit(payload, { topic, key, headers, delay, deliverAt })`),
//   or an array of emits and payloads.
//
// An emit that gives no `key` or `headers` keeps the input message's. Headers
// are an object (`{ name: "value" }`) or an array of `[name, value]` pairs.
// `new Emit(payload, { delay: 90_000 })` (milliseconds) or `{ deliverAt }` (a
// Date or an RFC 3339 string) asks the broker to hold the emit until then.
//
// How a handler fails:
//
// - `throw new Reject(reason)`: permanent; the message goes to the stage's
//   dead-letter stream now, with kind `rejected` and the reason.
// - `throw new Retry()` or `new Retry(afterMs)`: transient; delivered again
//   after the stage's backoff (or `afterMs`), and dead-lettered with kind
//   `retry` once `max_attempts` is spent.
// - an error a capability throws (`StateError`, `SecretError`) and the
//   handler does not catch: a store that is unavailable or full retries,
//   anything else (a missing grant, an invalid key) rejects with its reason.
// - anything else thrown: a bug. Its message and stack go to the stage's log
//   and the call traps; the runtime retries it and dead-letters it as `trap`,
//   quoting the error's first lines.
//
// A batch handler (`export const batchMessageHandler = batchHandler(fn)`, for
// a stage with `batch:`) takes an array of messages and returns one result
// per message, in order: a value as above, or a `Reject`/`Retry` instance
// (returned, not thrown) for that item alone.

import { configGet, log as hostLog } from "sluice:plugin/host@0.1.0";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });
// The input's key and headers, when an emit does not give its own.
const INHERIT = undefined;

// Reserved headers that ask the broker to hold an output (a header, so the
// WIT contract stays as it is). The runtime matches them in any case and
// removes them on publish.
export const DELAY_HEADER = "sluice-delay";
export const DELIVER_AT_HEADER = "sluice-deliver-at";

/** A permanent failure: dead-letter the message now, with this reason. */
export class Reject extends Error {
  constructor(reason = "rejected") {
    super(String(reason));
    this.name = "Reject";
    this.reason = String(reason);
  }
}

/** A transient failure: deliver the message again later (`afterMs` overrides the backoff). */
export class Retry extends Error {
  constructor(afterMs = undefined) {
    super(afterMs === undefined ? "retry" : `retry after ${afterMs} ms`);
    if (afterMs !== undefined && !(Number.isInteger(afterMs) && afterMs >= 0)) {
      throw new TypeError("Retry(afterMs) takes a whole number of milliseconds >= 0");
    }
    this.name = "Retry";
    this.afterMs = afterMs;
  }
}

/**
 * One output message. `topic: ""` (the default) is the stage's default
 * output, its first `publish:` topic.
 *
 * `delay` (milliseconds) or `deliverAt` (a Date or an RFC 3339 string) asks
 * the broker to deliver it later, through a `sluice-delay` or
 * `sluice-deliver-at` header that replaces any the headers carry. The
 * runtime refuses more than 365 days ahead; a time already past means now.
 */
export class Emit {
  constructor(payload, { topic = "", key = INHERIT, headers = INHERIT, delay, deliverAt } = {}) {
    this.payload = payload;
    this.topic = topic;
    this.key = key;
    this.headers = headers;
    // Checked here, so a bad value throws from the handler's own line.
    this.delayHeader = delayHeaderOf(delay, deliverAt);
  }
}

/** The `[name, value]` delay header an emit asks for, or undefined. */
function delayHeaderOf(delay, deliverAt) {
  const hasDelay = delay !== undefined && delay !== null;
  const hasAt = deliverAt !== undefined && deliverAt !== null;
  if (hasDelay && hasAt) throw new TypeError("Emit takes delay or deliverAt, not both");
  if (hasDelay) {
    if (typeof delay !== "number") {
      throw new TypeError(`Emit delay takes milliseconds as a number, not ${typeof delay}`);
    }
    if (!Number.isFinite(delay)) {
      throw new RangeError(`Emit delay must be a finite number of milliseconds, not ${delay}`);
    }
    if (delay < 0) throw new RangeError(`Emit delay must not be negative, not ${delay}`);
    return [DELAY_HEADER, `${Math.round(delay)}ms`];
  }
  if (hasAt) {
    if (deliverAt instanceof Date) {
      if (Number.isNaN(deliverAt.getTime())) throw new RangeError("Emit deliverAt is an invalid Date");
      return [DELIVER_AT_HEADER, deliverAt.toISOString()];
    }
    // The runtime parses it and refuses what is not RFC 3339.
    if (typeof deliverAt === "string") return [DELIVER_AT_HEADER, deliverAt];
    throw new TypeError(`Emit deliverAt takes a Date or an RFC 3339 string, not ${typeof deliverAt}`);
  }
  return undefined;
}

/** `headers` with `header` in place of any delay headers (in any case). */
function withDelayHeader(headers, header) {
  if (header === undefined) return headers;
  const kept = headers.filter(([k]) => {
    const name = k.toLowerCase();
    return name !== DELAY_HEADER && name !== DELIVER_AT_HEADER;
  });
  kept.push(header);
  return kept;
}

/**
 * One delivered message: `id` (stable across redeliveries: a safe
 * idempotency key), `topic`, `key` (or undefined), `headers` (an array of
 * `[name, value]` pairs; names may repeat), `payload` (a Uint8Array),
 * `attempt` (1 on the first delivery) and `publishedAt` (ms since the epoch,
 * a BigInt).
 */
export class Message {
  constructor(raw) {
    this.raw = raw;
    this.id = raw.id;
    this.topic = raw.topic;
    this.key = raw.key;
    this.headers = raw.headers;
    this.payload = raw.payload;
    this.attempt = raw.attempt;
    this.publishedAt = raw.publishedAt;
  }

  /** The payload as UTF-8 text; a payload that is not UTF-8 is rejected. */
  text() {
    try {
      return decoder.decode(this.payload);
    } catch (e) {
      throw new Reject(`payload is not UTF-8 text (${e.message})`);
    }
  }

  /** The payload parsed as JSON; a payload that is not JSON is rejected. */
  json() {
    const text = this.text();
    try {
      return JSON.parse(text);
    } catch (e) {
      throw new Reject(`payload is not JSON (${e.message})`);
    }
  }

  /** The first value of header `name`, or `fallback`. */
  header(name, fallback = undefined) {
    const found = this.headers.find(([k]) => k === name);
    return found === undefined ? fallback : found[1];
  }
}

/** The stage's `config:` value for `key`, or `fallback` when absent. */
export function config(key, fallback = undefined) {
  const value = configGet(key);
  return value === undefined || value === null ? fallback : value;
}

/** `log.info("...")` and friends: lines in the daemon's log. */
export const log = {
  trace: (text) => hostLog("trace", String(text)),
  debug: (text) => hostLog("debug", String(text)),
  info: (text) => hostLog("info", String(text)),
  warn: (text) => hostLog("warn", String(text)),
  error: (text) => hostLog("error", String(text)),
};

function payloadBytes(value) {
  if (value instanceof Uint8Array) return value;
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  if (typeof value === "string") return encoder.encode(value);
  if (value === undefined || typeof value === "function" || typeof value === "symbol") {
    throw new TypeError(
      `cannot emit ${typeof value}: return a Uint8Array, a string, a JSON value, an Emit or an array of them`,
    );
  }
  return encoder.encode(JSON.stringify(value, (_, v) => (typeof v === "bigint" ? v.toString() : v)));
}

function headerList(value) {
  if (Array.isArray(value)) return value.map(([k, v]) => [String(k), String(v)]);
  return Object.entries(value).map(([k, v]) => [k, String(v)]);
}

function toEmit(value, raw) {
  if (value instanceof Emit) {
    if (typeof value.topic !== "string") throw new TypeError("Emit topic must be a string");
    const headers = value.headers === INHERIT ? raw.headers : headerList(value.headers);
    return {
      topic: value.topic,
      key: value.key === INHERIT ? raw.key : value.key === null ? undefined : String(value.key),
      headers: withDelayHeader(headers, value.delayHeader),
      payload: payloadBytes(value.payload),
    };
  }
  return { topic: "", key: raw.key, headers: raw.headers, payload: payloadBytes(value) };
}

const isOne = (v) => v instanceof Emit || v instanceof Uint8Array || typeof v === "string";

const isPromise = (value) =>
  value !== null && typeof value === "object" && typeof value.then === "function";

function notAsync(value) {
  // A Promise would be written out as `{}` and a Reject thrown in it lost.
  if (isPromise(value)) {
    throw new TypeError(
      "a Promise where a value belongs (an async batch handler, or a Promise in the results?): " +
        "a batch handler is synchronous; return the results, or throw Reject/Retry",
    );
  }
  return value;
}

function toEmits(value, raw) {
  notAsync(value);
  if (value === undefined || value === null) return [];
  if (Array.isArray(value) && value.every(isOne)) return value.map((v) => toEmit(v, raw));
  return [toEmit(value, raw)];
}

/**
 * The `Reject` or `Retry` that `e` stands for, or undefined when it is a
 * bug: a capability's error (`StateError`, `SecretError`) carries its own
 * as `handlerError`.
 */
export function handlerErrorOf(e) {
  if (e instanceof Reject || e instanceof Retry) return e;
  const mapped = e !== null && typeof e === "object" ? e.handlerError : undefined;
  return mapped instanceof Reject || mapped instanceof Retry ? mapped : undefined;
}

function toError(e) {
  if (e instanceof Reject) return { tag: "err", val: { tag: "reject", val: e.reason } };
  return {
    tag: "err",
    val: { tag: "retry", val: e.afterMs === undefined ? undefined : BigInt(e.afterMs) },
  };
}

function report(e) {
  // Printed first, so the trap's error (which quotes the first and last lines
  // of stderr) names the error.
  console.error(e instanceof Error ? `${e.name}: ${e.message}\n${e.stack ?? ""}` : `thrown: ${e}`);
}

/**
 * The `messageHandler` export for `fn(msg) => emits`. `fn` may be async
 * (to `await fetch(...)`): `handle` then returns a Promise of the outcome,
 * which the engine runs to its end within the call.
 */
export function handler(fn) {
  const failed = (e) => {
    const known = handlerErrorOf(e);
    if (known !== undefined) return toError(known);
    report(e);
    throw e;
  };
  return {
    handle(raw) {
      try {
        const value = fn(new Message(raw));
        if (isPromise(value)) {
          return value.then((v) => ({ tag: "ok", val: toEmits(v, raw) })).catch(failed);
        }
        return { tag: "ok", val: toEmits(value, raw) };
      } catch (e) {
        return failed(e);
      }
    },
  };
}

/** The `batchMessageHandler` export for `fn(msgs) => [result per msg]`. */
export function batchHandler(fn) {
  return {
    handleBatch(raws) {
      let results;
      try {
        results = notAsync(fn(raws.map((raw) => new Message(raw))));
        if (!Array.isArray(results) || results.length !== raws.length) {
          throw new TypeError(
            `a batch handler returns an array with one result per message (${raws.length}), not ${
              Array.isArray(results) ? `${results.length} results` : typeof results
            }`,
          );
        }
      } catch (e) {
        const known = handlerErrorOf(e);
        if (known !== undefined) return raws.map(() => toError(known));
        report(e);
        throw e;
      }
      return results.map((r, i) => {
        const known = handlerErrorOf(r);
        return known !== undefined ? toError(known) : { tag: "ok", val: toEmits(r, raws[i]) };
      });
    },
  };
}
