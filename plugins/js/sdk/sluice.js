// Write a Sluice stream handler in JavaScript as one plain function.
//
//   import { handler, Reject } from "./sluice.js";
//
//   export const messageHandler = handler((msg) => {
//     if (msg.payload.length === 0) throw new Reject("empty payload"); // dead-lettered now, as `rejected`
//     return msg.text().toUpperCase(); // one emit to the stage's default output
//   });
//
// Build it with `sluice plugin build` (componentize-js with `-d http -d
// fetch-event`: Sluice links no wasi:http) and try it with `sluice plugin test`.
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

function notAsync(value) {
  // A Promise would be written out as `{}` and a Reject thrown in it lost:
  // a handler runs to completion within its call.
  if (value !== null && typeof value === "object" && typeof value.then === "function") {
    throw new TypeError(
      "the handler returned a Promise (an async function?); handlers must be synchronous: " +
        "return the emits, or throw Reject/Retry",
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

/** The `messageHandler` export for `fn(msg) => emits`. */
export function handler(fn) {
  return {
    handle(raw) {
      try {
        return { tag: "ok", val: toEmits(fn(new Message(raw)), raw) };
      } catch (e) {
        if (e instanceof Reject || e instanceof Retry) return toError(e);
        report(e);
        throw e;
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
        if (e instanceof Reject || e instanceof Retry) return raws.map(() => toError(e));
        report(e);
        throw e;
      }
      return results.map((r, i) =>
        r instanceof Reject || r instanceof Retry ? toError(r) : { tag: "ok", val: toEmits(r, raws[i]) },
      );
    },
  };
}
