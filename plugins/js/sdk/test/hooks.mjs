// Node module hooks for the SDK's unit tests: a `sluice:plugin/<name>@<v>`
// import (the host's interfaces, which only a Wasm engine provides)
// resolves to the fake in `fakes/<name>.mjs`, whose functions call what
// the test put in `globalThis.sluiceHost.<name>`.

const INTERFACE = /^sluice:plugin\/(host|state|secrets)@0\.[12]\.0$/;

export async function resolve(specifier, context, next) {
  const found = INTERFACE.exec(specifier);
  if (found) {
    return { url: new URL(`./fakes/${found[1]}.mjs`, import.meta.url).href, shortCircuit: true };
  }
  return next(specifier, context);
}
