// Example handler: upper-cases a text payload (JavaScript).
//
// Each payload must be UTF-8 text; it is upper-cased and emitted to the
// stage's default output with the input's key and headers. A payload that is
// not UTF-8 is rejected: it goes to the dead-letter stream at once, with the
// reason.
//
// Config keys: none.

import { handler } from "./sluice.js";

export const messageHandler = handler((msg) => msg.text().toUpperCase());
