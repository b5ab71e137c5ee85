// `sluice:plugin/secrets`, as the bindings give it: what the test installed.
export const get = (...args) => globalThis.sluiceHost.secrets.get(...args);
