// The stage's key-value store (`state: true` on the stage), committed with
// the message's outputs and its ack. Contract 0.2.0, `handler` world only.
//
//   import * as state from "./sluice-state.js";
//
//   export const messageHandler = handler((msg) => {
//     const n = state.increment(`count/${msg.key ?? "-"}`);
//     return String(n);
//   });
//
// A call's writes are buffered and the call reads its own writes. They
// commit only if the call succeeds: after a Reject, a Retry or an uncaught
// error nothing of them remains. So a counter per key counts each message
// exactly once, across retries, redeliveries and crashes. Concurrency is
// optimistic: if a value the call read changed before the commit, the call
// runs again on the new value (kind `state-conflict`, spending no attempt).
// `compareAndSet(key, 0, value, { ttl })` is an expiring lock.
//
// An operation that fails throws a `StateError` (`kind`: "not-granted",
// "store-full", "invalid" or "unavailable"). Catch it to decide yourself;
// uncaught, a store that is unavailable or full retries the message, and a
// missing grant or an invalid key rejects it with the reason.

import * as raw from "sluice:plugin/state@0.2.0";
import { Reject, Retry } from "./sluice.js";

const encoder = new TextEncoder();
const decoder = new TextDecoder("utf-8", { fatal: true });

/** Why a state operation failed: `kind` and the host's `detail`. */
export class StateError extends Error {
  constructor(kind, detail) {
    super(describe({ kind, detail }));
    this.name = "StateError";
    this.kind = kind;
    this.detail = detail;
  }

  /** What the handler does when it does not catch this: `Retry` or `Reject`. */
  get handlerError() {
    return this.kind === "unavailable" || this.kind === "store-full" ? new Retry() : new Reject(this.message);
  }
}

/** What went wrong, in words. */
export function describe(e) {
  const what = {
    "not-granted": "state not granted",
    "store-full": "state store full",
    invalid: "invalid state operation",
    unavailable: "state unavailable",
  }[e.kind];
  return `${what ?? `state error (${e.kind})`}: ${e.detail}`;
}

/**
 * The `StateError` for what a host call threw: the bindings throw the
 * error variant (`{ tag, val }`), or an error carrying it as `payload`.
 */
export function stateErrorOf(thrown) {
  const variant = thrown !== null && typeof thrown === "object" && "payload" in thrown ? thrown.payload : thrown;
  if (variant !== null && typeof variant === "object" && typeof variant.tag === "string") {
    return new StateError(variant.tag, String(variant.val ?? ""));
  }
  return undefined;
}

function call(f) {
  try {
    return f();
  } catch (e) {
    throw stateErrorOf(e) ?? e;
  }
}

function bytes(value) {
  if (value instanceof Uint8Array) return value;
  if (typeof value === "string") return encoder.encode(value);
  if (ArrayBuffer.isView(value)) return new Uint8Array(value.buffer, value.byteOffset, value.byteLength);
  if (value instanceof ArrayBuffer) return new Uint8Array(value);
  throw new TypeError(`a state value is a string or a Uint8Array, not ${value === null ? "null" : typeof value}`);
}

/** A TTL in whole milliseconds as the host takes it, or undefined. */
export function ttlMillis(ttl) {
  if (ttl === undefined || ttl === null) return undefined;
  if (typeof ttl === "bigint") {
    if (ttl < 0n) throw new RangeError(`a ttl must not be negative, not ${ttl}`);
    return ttl;
  }
  if (typeof ttl !== "number" || !Number.isFinite(ttl) || ttl < 0) {
    throw new RangeError(`a ttl is a number of milliseconds >= 0, not ${ttl}`);
  }
  return BigInt(Math.round(ttl));
}

function u64(n, what) {
  if (typeof n === "bigint") return n;
  if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`${what} is a whole number >= 0, not ${n}`);
  return BigInt(n);
}

/**
 * The entry at `key` (`{ value: Uint8Array, revision: bigint }`), or
 * undefined if absent or expired.
 */
export function get(key) {
  const entry = call(() => raw.get(String(key)));
  return entry === null || entry === undefined ? undefined : entry;
}

/** The value at `key` as text, or undefined; a value that is not UTF-8 is `invalid`. */
export function getText(key) {
  const entry = get(key);
  if (entry === undefined) return undefined;
  try {
    return decoder.decode(entry.value);
  } catch {
    throw new StateError("invalid", `the value at \`${key}\` is not UTF-8`);
  }
}

/** The value at `key` parsed as JSON, or undefined. */
export function getJson(key) {
  const text = getText(key);
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new StateError("invalid", `the value at \`${key}\` is not JSON (${e.message})`);
  }
}

/**
 * Sets `key` to `value` (a string, stored as UTF-8, or a Uint8Array),
 * expiring after `ttl` milliseconds if given.
 */
export function set(key, value, { ttl } = {}) {
  const data = bytes(value);
  const ms = ttlMillis(ttl);
  call(() => raw.set(String(key), data, ms));
}

/** Sets `key` to `JSON.stringify(value)`. */
export function setJson(key, value, options = {}) {
  set(key, JSON.stringify(value), options);
}

/** Deletes `key` (absent is fine). Also exported as `delete`. */
export function remove(key) {
  call(() => raw.delete(String(key)));
}
export { remove as delete };

/**
 * Sets `key` to `value` only if its revision is still `revision` (0: only
 * if absent or expired); false if it moved. With `ttl`, the value expires.
 */
export function compareAndSet(key, revision, value, { ttl } = {}) {
  const rev = u64(revision, "a revision");
  const data = bytes(value);
  const ms = ttlMillis(ttl);
  return call(() => raw.compareAndSet(String(key), rev, data, ms));
}

/**
 * Adds `delta` (default 1) to the decimal number at `key` (absent counts as
 * 0) and returns the new value, a number (a BigInt beyond 2^53); the value
 * keeps its expiry.
 */
export function increment(key, delta = 1) {
  if (typeof delta === "number" && !Number.isSafeInteger(delta)) {
    throw new RangeError(`increment takes a whole number, not ${delta}`);
  }
  const n = call(() => raw.increment(String(key), BigInt(delta)));
  const big = BigInt(n);
  const small = Number(big);
  return Number.isSafeInteger(small) ? small : big;
}

/** The keys under `prefix`, in order, at most `limit` (at most 1,000). */
export function list(prefix = "", limit = 1000) {
  if (!Number.isInteger(limit) || limit < 0) throw new RangeError(`a limit is a whole number >= 0, not ${limit}`);
  return call(() => raw.list(String(prefix), limit));
}
