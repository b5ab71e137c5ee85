// The secrets the stage lists under `secrets:`, whose values the pipeline's
// `secrets:` block references (an environment variable or a file).
// Contract 0.2.0.
//
//   import * as secrets from "./sluice-secrets.js";
//
//   const key = secrets.get("signing_key");
//
// The host removes every value from the handler's log lines, stdout, stderr
// and reject reasons. A secret that only goes into a request header need
// not be read at all: the stage's `http.headers` can put it in (`Bearer
// {secret:api_token}`), so the handler never holds it.
//
// A name the stage does not list throws a `SecretError`; uncaught, it
// rejects the message with the reason (which names the secret, never a
// value).

import * as raw from "sluice:plugin/secrets@0.2.0";
import { Reject } from "./sluice.js";

/** Why a secret could not be read (`kind`: "not-granted"). */
export class SecretError extends Error {
  constructor(kind, detail) {
    super(describe({ kind, detail }));
    this.name = "SecretError";
    this.kind = kind;
    this.detail = detail;
  }

  /** What the handler does when it does not catch this: a `Reject`. */
  get handlerError() {
    return new Reject(this.message);
  }
}

/** What went wrong, in words. */
export function describe(e) {
  return e.kind === "not-granted" ? `secret not granted: ${e.detail}` : `secret error (${e.kind}): ${e.detail}`;
}

/** The value of the secret `name`, a string. */
export function get(name) {
  try {
    return raw.get(String(name));
  } catch (e) {
    const variant = e !== null && typeof e === "object" && "payload" in e ? e.payload : e;
    if (variant !== null && typeof variant === "object" && typeof variant.tag === "string") {
      throw new SecretError(variant.tag, String(variant.val ?? ""));
    }
    throw e;
  }
}
