// Two turns of one key, requested on the bus at once; prints every event as it comes.
// Usage: CCSUP_STATE_DIR=... node examples/two-turns.js [KEY]   (KEY defaults to "example")
// With the key's cap at 1 the second turn waits (queued, position 1) until the first is released.
import { Sidecar } from "../ccsup.js";

const key = process.argv[2] || "example";
const sidecar = await Sidecar.connect({ holder: { session: `example-${process.pid}`, agent: "node" } });
try {
  const argv = (n) => ["sh", "-c", `echo turn ${n} on $(hostname); sleep 0.3; echo turn ${n} done`];
  const turns = await Promise.all([sidecar.turn({ key, argv: argv(1) }), sidecar.turn({ key, argv: argv(2) })]);
  await Promise.all(
    turns.map(async (turn, i) => {
      for await (const { kind, body } of turn) {
        const { v, ts, id, holder, ...fields } = body;
        console.log(`turn ${i + 1} ${kind} ${JSON.stringify(fields)}`);
      }
    }),
  );
} finally {
  sidecar.close();
}
