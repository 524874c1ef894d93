// A sidecar that pauses its key when its harness reports a 429: the harness's stderr is watched
// and, on a rate-limit line, `request.pause` goes on the bus for the Retry-After it gave (else
// 60 s), so no other session starts a turn of that key only to hit the same 429. The supervisor
// grants the key's waiters again, in order, when the pause ends.
// Usage: CCSUP_STATE_DIR=... node examples/pause-on-429.js [KEY]   (KEY defaults to "example")
// (The same without a sidecar: `[pause_on.KEY] stderr = "(?i)rate.?limit|429"` in the config.)
import { Sidecar } from "../ccsup.js";

const RATE_LIMITED = /\b429\b|rate.?limit/i;
const RETRY_AFTER = /retry-after\s*[:=]?\s*(\d{1,7})/gi;

/**
 * Follow `turn` to its end; the first time its stderr says it was rate-limited, pause `key` for
 * the Retry-After it gave (the last one seen in the stderr so far, or in the next chunk), else
 * `defaultSeconds`. Resolves with {events, pause} (pause: the supervisor's answer, or null).
 */
export async function followPausingOn429(sidecar, turn, key, { defaultSeconds = 60 } = {}) {
  const events = [];
  let stderr = "";
  let limited = false;
  let pause = null;
  for await (const event of turn) {
    events.push(event);
    if (event.kind === "stderr") stderr = (stderr + event.body.data).slice(-8192);
    if (!limited && RATE_LIMITED.test(stderr)) limited = true;
    const retry = [...stderr.matchAll(RETRY_AFTER)].pop();
    if (limited && !pause && (retry || event.kind !== "stderr")) {
      const seconds = retry ? Number(retry[1]) : defaultSeconds;
      pause = await sidecar.publishPause({ key, seconds, reason: `429 from the harness (turn ${turn.id})` });
    }
  }
  return { events, pause };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const key = process.argv[2] || "example";
  const sidecar = await Sidecar.connect({ holder: { session: `example-${process.pid}`, agent: "node" } });
  try {
    const harness = ["sh", "-c", "echo 'HTTP 429 Too Many Requests' >&2; echo 'Retry-After: 30' >&2; exit 1"];
    const turn = await sidecar.turn({ key, argv: harness });
    const { pause } = await followPausingOn429(sidecar, turn, key);
    console.log(pause ? `${key} paused until ${new Date(pause.until * 1000).toISOString()}` : "no 429 seen");
  } finally {
    sidecar.close();
  }
}
