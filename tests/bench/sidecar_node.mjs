// One Node sidecar of tests/bench/bench_sidecars.py (--node): ready, wait for "go" on stdin, run
// its own turn, reassemble its stdout exactly (TurnOutput), print its figures as one JSON line.
// mode "narrow" is the client as it is; "broad" also subscribes to every `turn.` topic, as the
// client did before (to check the global seq).
import { createInterface } from "node:readline";
import { Sidecar, TurnOutput } from "../../contrib/node-sidecar/ccsup.js";

const [stateDir, id, mode, size] = process.argv.slice(2);
const sidecar = await Sidecar.connect({ stateDir, timeout: 30000 });
if (mode === "broad") sidecar._sub.subscribe("turn.");
const turn = sidecar._follow(id);
await turn.live;
console.log("ready");
const lines = createInterface({ input: process.stdin });
await new Promise((resolve) => lines.once("line", resolve));
const start = process.cpuUsage();
const t0 = Date.now();
await sidecar.turn({ id, key: "bench", argv: ["sh", "-c", `yes 'Grüße, 世界! 😀 some output of a coding agent turn' | head -c ${size}`] });
const output = new TurnOutput(id);
let bytes = 0;
for await (const event of turn) {
  const got = output.feed(event);
  if (got?.stream === "stdout") bytes += got.bytes.length;
}
const used = process.cpuUsage(start);
console.log(JSON.stringify({ cpu_s: (used.user + used.system) / 1e6, wall_s: (Date.now() - t0) / 1000, bytes, stray: sidecar.stray, gaps: sidecar.gaps }));
lines.close();
sidecar.close();
