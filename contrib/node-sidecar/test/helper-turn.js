// A second sidecar process for the cap test: requests one turn (id given) and prints each event
// as a JSON line, then exits 0 after the terminal one.
import { Sidecar } from "../ccsup.js";

const [stateDir, key, id, seconds] = process.argv.slice(2);
const sidecar = await Sidecar.connect({ stateDir });
try {
  const turn = await sidecar.turn({ key, id, argv: ["sleep", seconds] });
  for await (const { kind, body } of turn) console.log(JSON.stringify({ kind, seq: body.seq }));
} finally {
  sidecar.close();
}
