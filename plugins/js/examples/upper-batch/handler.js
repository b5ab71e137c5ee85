// Example batch handler: upper-cases text payloads (JavaScript), a batch of
// messages per call, for a stage with `batch:`.
//
// The same logic as the `uppercase` example. Each call into a JavaScript
// component has a fixed cost (componentize-js runs every export as an async
// function and drives its event loop to the promise's end), so a batch
// stage spreads that cost over up to `batch.max` messages: the way to
// throughput in JavaScript. A payload that is not UTF-8 is rejected alone;
// the rest of the batch succeeds.
//
// Config keys: none.

import { Reject, batchHandler } from "./sluice.js";

export const batchMessageHandler = batchHandler((msgs) =>
  msgs.map((msg) => {
    try {
      return msg.text().toUpperCase();
    } catch (e) {
      if (e instanceof Reject) return e;
      throw e;
    }
  }),
);
