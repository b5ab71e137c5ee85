// The SDK's own logic (sluice.js) on Node, the host's imports faked.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installHost } from "./fakes/install.mjs";

const { Emit, Reject, Retry, batchHandler, config, handler, handlerErrorOf, log } = await import("../sluice.js");

const encoder = new TextEncoder();
const decoder = new TextDecoder();

const raw = (text, extra = {}) => ({
  id: "m-1",
  topic: "in",
  key: "k",
  headers: [["h", "1"]],
  payload: encoder.encode(text),
  attempt: 1,
  publishedAt: 0n,
  ...extra,
});

const payloads = (outcome) => outcome.val.map((e) => decoder.decode(e.payload));

let host;
beforeEach(() => {
  host = installHost({ config: { greeting: "hi" } });
});

test("a returned value is one emit to the default output with the input's key and headers", () => {
  const outcome = handler((msg) => msg.text().toUpperCase()).handle(raw("abc"));
  assert.equal(outcome.tag, "ok");
  assert.deepEqual(payloads(outcome), ["ABC"]);
  assert.equal(outcome.val[0].topic, "");
  assert.equal(outcome.val[0].key, "k");
  assert.deepEqual(outcome.val[0].headers, [["h", "1"]]);
});

test("nothing, JSON values and lists of emits", () => {
  assert.deepEqual(handler(() => undefined).handle(raw("x")), { tag: "ok", val: [] });
  assert.deepEqual(payloads(handler(() => ({ a: 1n })).handle(raw("x"))), ['{"a":"1"}']);
  const two = handler(() => [new Emit("a", { topic: "t", key: null }), "b"]).handle(raw("x"));
  assert.deepEqual(payloads(two), ["a", "b"]);
  assert.equal(two.val[0].topic, "t");
  assert.equal(two.val[0].key, undefined);
});

test("a delay replaces the delay headers an emit carries", () => {
  const emit = new Emit("x", { headers: { "Sluice-Delay": "1ms", other: "y" }, delay: 1500.4 });
  const outcome = handler(() => emit).handle(raw("x"));
  assert.deepEqual(outcome.val[0].headers, [["other", "y"], ["sluice-delay", "1500ms"]]);
  assert.throws(() => new Emit("x", { delay: 1, deliverAt: "2026-01-01T00:00:00Z" }), TypeError);
  assert.throws(() => new Emit("x", { delay: -1 }), RangeError);
});

test("Reject and Retry become the contract's errors; a bug is rethrown", () => {
  assert.deepEqual(handler(() => {
    throw new Reject("no");
  }).handle(raw("x")), { tag: "err", val: { tag: "reject", val: "no" } });
  assert.deepEqual(handler(() => {
    throw new Retry(250);
  }).handle(raw("x")), { tag: "err", val: { tag: "retry", val: 250n } });
  assert.deepEqual(handler((msg) => msg.json()).handle(raw("{")).val.tag, "reject");
  const quiet = console.error;
  console.error = () => {};
  try {
    assert.throws(() => handler(() => null.x).handle(raw("x")), TypeError);
  } finally {
    console.error = quiet;
  }
});

test("an error that carries a handlerError settles as it says", () => {
  const full = Object.assign(new Error("full"), { handlerError: new Retry() });
  const denied = Object.assign(new Error("denied"), { handlerError: new Reject("denied") });
  assert.deepEqual(handler(() => {
    throw full;
  }).handle(raw("x")), { tag: "err", val: { tag: "retry", val: undefined } });
  assert.deepEqual(handler(() => {
    throw denied;
  }).handle(raw("x")).val, { tag: "reject", val: "denied" });
  assert.equal(handlerErrorOf(new Error("plain")), undefined);
  assert.equal(handlerErrorOf({ handlerError: "not an error" }), undefined);
});

test("an async handler's outcome is a Promise of the same outcome", async () => {
  const ok = handler(async (msg) => `${msg.text()}!`).handle(raw("a"));
  assert.ok(ok instanceof Promise);
  assert.deepEqual(payloads(await ok), ["a!"]);
  const rejected = await handler(async () => {
    throw new Reject("later no");
  }).handle(raw("a"));
  assert.deepEqual(rejected.val, { tag: "reject", val: "later no" });
  const quiet = console.error;
  console.error = () => {};
  try {
    await assert.rejects(handler(async () => undefined.x).handle(raw("a")), TypeError);
  } finally {
    console.error = quiet;
  }
});

test("a batch handler settles each item on its own and stays synchronous", () => {
  const results = batchHandler((msgs) => msgs.map((m) => (m.text() === "bad" ? new Reject("bad") : m.text()))).handleBatch([
    raw("a"),
    raw("bad"),
  ]);
  assert.deepEqual(payloads(results[0]), ["a"]);
  assert.deepEqual(results[1].val, { tag: "reject", val: "bad" });
  const carried = batchHandler((msgs) => msgs.map(() => ({ handlerError: new Retry(5) }))).handleBatch([raw("a")]);
  assert.deepEqual(carried[0].val, { tag: "retry", val: 5n });
  const quiet = console.error;
  console.error = () => {};
  try {
    assert.throws(() => batchHandler(async (msgs) => msgs).handleBatch([raw("a")]), /synchronous/);
    assert.throws(() => batchHandler(() => []).handleBatch([raw("a")]), /one result per message/);
  } finally {
    console.error = quiet;
  }
});

test("config and log go to the host", () => {
  assert.equal(config("greeting"), "hi");
  assert.equal(config("absent", "fallback"), "fallback");
  log.warn(42);
  assert.deepEqual(host.logs, [["warn", "42"]]);
});
