// Bench only: the uppercase handler for componentize-qjs (QuickJS with a
// Wizer snapshot, built with `--sync`), to compare its call cost with the
// other engines'. Its conventions are its own: it returns the list of emits
// and throws the error variant, a key is a string or null, and it has no
// TextEncoder or TextDecoder, so ASCII is upper-cased byte by byte.

export const messageHandler = {
  handle(msg) {
    const input = msg.payload;
    const payload = new Uint8Array(input.length);
    for (let i = 0; i < input.length; i++) {
      const c = input[i];
      payload[i] = c >= 97 && c <= 122 ? c - 32 : c;
    }
    return [{ topic: "", key: msg.key, headers: msg.headers, payload }];
  },
};
