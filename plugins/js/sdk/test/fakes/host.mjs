// `sluice:plugin/host`, as the bindings give it: what the test installed.
const host = () => globalThis.sluiceHost.host;
export const log = (level, text) => host().log(level, text);
export const configGet = (key) => host().configGet(key);
