// `sluice:plugin/state`, as the bindings give it: what the test installed.
const state = () => globalThis.sluiceHost.state;
export const get = (...args) => state().get(...args);
export const set = (...args) => state().set(...args);
const remove = (...args) => state().delete(...args);
export { remove as delete };
export const compareAndSet = (...args) => state().compareAndSet(...args);
export const increment = (...args) => state().increment(...args);
export const list = (...args) => state().list(...args);
