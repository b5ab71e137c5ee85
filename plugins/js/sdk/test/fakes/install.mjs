// Registers the hooks and installs a fresh fake host for each test: the
// calls it received, and a store that behaves as the bindings do (a
// `result` error is thrown as a ComponentError carrying the variant in
// `payload`; an `option` none is undefined; u64 and s64 are BigInts).
import * as nodeModule from "node:module";

if (typeof nodeModule.register !== "function") {
  throw new Error(`the SDK's tests need Node.js 20.6 or newer (module.register), not ${process.version}`);
}
nodeModule.register("../hooks.mjs", import.meta.url);

export class ComponentError extends Error {
  constructor(payload) {
    super(`${payload.tag}: ${payload.val}`);
    this.payload = payload;
  }
}

/** Throws the state error `tag` with `detail`, as the bindings do. */
export const fail = (tag, detail) => {
  throw new ComponentError({ tag, val: detail });
};

export function installHost({ config = {}, secrets = {} } = {}) {
  const calls = [];
  const logs = [];
  const store = new Map();
  let revision = 0n;
  const host = {
    calls,
    logs,
    store,
    host: {
      log: (level, text) => logs.push([level, text]),
      configGet: (key) => config[key],
    },
    state: {
      get(key) {
        calls.push(["get", key]);
        return store.get(key);
      },
      set(key, value, ttl) {
        calls.push(["set", key, value, ttl]);
        store.set(key, { value, revision: ++revision });
      },
      delete(key) {
        calls.push(["delete", key]);
        store.delete(key);
      },
      compareAndSet(key, rev, value, ttl) {
        calls.push(["compareAndSet", key, rev, value, ttl]);
        if ((store.get(key)?.revision ?? 0n) !== rev) return false;
        store.set(key, { value, revision: ++revision });
        return true;
      },
      increment(key, delta) {
        calls.push(["increment", key, delta]);
        const now = BigInt(new TextDecoder().decode(store.get(key)?.value ?? new Uint8Array()) || "0") + delta;
        store.set(key, { value: new TextEncoder().encode(String(now)), revision: ++revision });
        return now;
      },
      list(prefix, limit) {
        calls.push(["list", prefix, limit]);
        return [...store.keys()].filter((k) => k.startsWith(prefix)).sort().slice(0, limit);
      },
    },
    secrets: {
      get(name) {
        calls.push(["secret", name]);
        if (!(name in secrets)) fail("not-granted", `stage \`s\` does not list \`${name}\``);
        return secrets[name];
      },
    },
  };
  globalThis.sluiceHost = host;
  return host;
}
