// The state module's logic (sluice-state.js) on Node, the host faked.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { fail, installHost } from "./fakes/install.mjs";

const state = await import("../sluice-state.js");
const { Reject, Retry, handler } = await import("../sluice.js");

const encoder = new TextEncoder();
const raw = { id: "m", topic: "t", key: undefined, headers: [], payload: encoder.encode("x"), attempt: 1, publishedAt: 0n };

let host;
beforeEach(() => {
  host = installHost();
});

test("values go in as bytes with TTLs in whole milliseconds, and come back", () => {
  state.set("a", "héllo", { ttl: 1500.6 });
  state.set("b", new Uint8Array([1, 2]));
  assert.deepEqual(host.calls[0], ["set", "a", encoder.encode("héllo"), 1501n]);
  assert.deepEqual(host.calls[1], ["set", "b", new Uint8Array([1, 2]), undefined]);
  assert.equal(state.getText("a"), "héllo");
  assert.deepEqual(state.get("b").value, new Uint8Array([1, 2]));
  assert.equal(typeof state.get("b").revision, "bigint");
  assert.equal(state.get("absent"), undefined);
  assert.equal(state.getText("absent"), undefined);
  state.setJson("j", { n: 1 });
  assert.deepEqual(state.getJson("j"), { n: 1 });
  assert.throws(() => state.set("c", 5), TypeError);
  assert.throws(() => state.set("c", "v", { ttl: -1 }), RangeError);
  assert.throws(() => state.set("c", "v", { ttl: Infinity }), RangeError);
});

test("a value that is not UTF-8 or JSON is an invalid operation", () => {
  state.set("bin", new Uint8Array([0xff]));
  assert.throws(() => state.getText("bin"), (e) => e instanceof state.StateError && e.kind === "invalid");
  state.set("text", "{");
  assert.throws(() => state.getJson("text"), /not JSON/);
});

test("compare-and-set takes a revision (0: absent) and says whether it set", () => {
  assert.equal(state.compareAndSet("lock", 0, "me", { ttl: 30_000 }), true);
  assert.deepEqual(host.calls[0], ["compareAndSet", "lock", 0n, encoder.encode("me"), 30000n]);
  assert.equal(state.compareAndSet("lock", 0, "you"), false);
  const { revision } = state.get("lock");
  assert.equal(state.compareAndSet("lock", revision, "you"), true);
  assert.throws(() => state.compareAndSet("lock", -1, "x"), RangeError);
  assert.throws(() => state.compareAndSet("lock", 1.5, "x"), RangeError);
});

test("increment returns a number, a BigInt beyond 2^53", () => {
  assert.equal(state.increment("n"), 1);
  assert.equal(state.increment("n", 41), 42);
  assert.deepEqual(host.calls[1], ["increment", "n", 41n]);
  assert.equal(state.increment("n", -50), -8);
  state.set("big", String(2n ** 60n));
  assert.equal(state.increment("big", 1n), 2n ** 60n + 1n);
  assert.throws(() => state.increment("n", 0.5), RangeError);
});

test("delete and list", () => {
  state.set("p/1", "a");
  state.set("p/2", "b");
  state.set("q", "c");
  assert.deepEqual(state.list("p/"), ["p/1", "p/2"]);
  assert.deepEqual(state.list("p/", 1), ["p/1"]);
  state.delete("p/1");
  assert.deepEqual(state.list(""), ["p/2", "q"]);
  assert.deepEqual(host.calls.at(-2), ["delete", "p/1"]);
});

test("host errors become StateErrors that retry or reject as the Rust SDK's", () => {
  for (const [tag, settles, text] of [
    ["unavailable", Retry, "state unavailable: down"],
    ["store-full", Retry, "state store full: down"],
    ["not-granted", Reject, "state not granted: down"],
    ["invalid", Reject, "invalid state operation: down"],
  ]) {
    host.state.get = () => fail(tag, "down");
    let thrown;
    assert.throws(() => state.get("k"), (e) => {
      thrown = e;
      return e instanceof state.StateError;
    });
    assert.equal(thrown.kind, tag);
    assert.equal(thrown.detail, "down");
    assert.equal(thrown.message, text);
    assert.equal(state.describe(thrown), text);
    assert.ok(thrown.handlerError instanceof settles, tag);
    const outcome = handler(() => state.get("k")).handle(raw);
    const wanted = settles === Retry ? { tag: "retry", val: undefined } : { tag: "reject", val: text };
    assert.deepEqual(outcome, { tag: "err", val: wanted }, tag);
  }
});

test("a thrown variant without a wrapper is read too; other errors pass through", () => {
  host.state.increment = () => {
    throw { tag: "invalid", val: "not a number" };
  };
  assert.throws(() => state.increment("k"), (e) => e instanceof state.StateError && e.kind === "invalid");
  host.state.list = () => {
    throw new TypeError("a bug");
  };
  assert.throws(() => state.list("k"), TypeError);
});
