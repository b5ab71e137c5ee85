// The secrets module's logic (sluice-secrets.js) on Node, the host faked.
import assert from "node:assert/strict";
import { beforeEach, test } from "node:test";

import { installHost } from "./fakes/install.mjs";

const secrets = await import("../sluice-secrets.js");
const { handler } = await import("../sluice.js");

const raw = { id: "m", topic: "t", key: undefined, headers: [], payload: new Uint8Array(), attempt: 1, publishedAt: 0n };

beforeEach(() => {
  installHost({ secrets: { api_token: "s3cret" } });
});

test("a granted secret is its value", () => {
  assert.equal(secrets.get("api_token"), "s3cret");
});

test("a secret the stage does not list rejects, naming it and no value", () => {
  assert.throws(
    () => secrets.get("other"),
    (e) => e instanceof secrets.SecretError && e.kind === "not-granted" && e.message === "secret not granted: stage `s` does not list `other`",
  );
  const outcome = handler(() => secrets.get("other")).handle(raw);
  assert.deepEqual(outcome, {
    tag: "err",
    val: { tag: "reject", val: "secret not granted: stage `s` does not list `other`" },
  });
});
