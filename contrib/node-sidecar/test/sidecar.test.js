// The sidecar against a real supervisor (and, for seq gaps, a fake one whose losses we choose).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { Router, XPublisher } from "zeromq";
import { Sidecar, TurnOutput, findStateDir, newId } from "../ccsup.js";
import { startDaemon } from "./daemon.js";

const LIFECYCLE = new Set(["queued", "granted", "started", "exited", "stopping", "gone", "released", "cancelled", "rejected"]);
let daemon;
let sidecar;

before(async () => {
  daemon = startDaemon('solo = 1, capped = 1, res = 1');
  sidecar = await Sidecar.connect({ stateDir: daemon.stateDir, holder: { session: "node-test", agent: "a" } });
});

after(() => {
  sidecar?.close();
  daemon?.stop();
});

async function collect(turn) {
  const events = [];
  for await (const event of turn) events.push(event);
  return events;
}

test("the state directory is found as the CLI finds it", { timeout: 30000 }, () => {
  assert.equal(findStateDir({ CCSUP_STATE_DIR: "/s", XDG_STATE_HOME: "/x", HOME: "/h" }), "/s");
  assert.equal(findStateDir({ XDG_STATE_HOME: "/x", HOME: "/h" }), "/x/ccsup");
  assert.equal(findStateDir({ HOME: "/h" }), "/h/.local/state/ccsup");
});

test("a turn runs, reads what is sent to its stdin, and ends released", { timeout: 30000 }, async () => {
  const turn = await sidecar.turn({ key: "solo", argv: ["sh", "-c", "read line; echo got $line"] });
  await turn.send("hello\n", true);
  const events = await collect(turn);
  const kinds = events.map((e) => e.kind).filter((k) => LIFECYCLE.has(k));
  assert.deepEqual(kinds, ["queued", "granted", "started", "exited", "gone", "released"]);
  const out = events.filter((e) => e.kind === "stdout").map((e) => e.body.data).join("");
  assert.equal(out, "got hello\n");
  assert.equal(events.find((e) => e.kind === "exited").body.code, 0);
  const seqs = events.map((e) => e.body.seq);
  assert.deepEqual(seqs, [...seqs].sort((a, b) => a - b), "events come in seq order");
  assert.equal(sidecar.gaps, 0);
});

test("a cancel mid-turn stops it and it still ends released", { timeout: 30000 }, async () => {
  const turn = await sidecar.turn({ key: "solo", argv: ["sh", "-c", "echo ready; exec sleep 30"] });
  const t0 = Date.now();
  const events = [];
  for await (const event of turn) {
    events.push(event);
    if (event.kind === "stdout" && event.body.data.includes("ready")) await turn.cancel();
  }
  assert.ok(Date.now() - t0 < 10000, "the cancel ended the turn well before its 30 s");
  const kinds = events.map((e) => e.kind).filter((k) => LIFECYCLE.has(k));
  assert.deepEqual(kinds.slice(-4), ["stopping", "exited", "gone", "released"]);
  const exited = events.find((e) => e.kind === "exited").body;
  assert.equal(exited.signal, 15);
});

test("a queued turn cancelled takes nothing and ends cancelled", { timeout: 30000 }, async () => {
  const first = await sidecar.turn({ key: "solo", argv: ["sh", "-c", "echo ready; exec sleep 30"] });
  const second = await sidecar.turn({ key: "solo", argv: ["true"] });
  for await (const event of first) if (event.kind === "stdout") break;
  await second.cancel();
  const events = await collect(second);
  assert.deepEqual(events.map((e) => e.kind), ["queued", "cancelled"]);
  await first.cancel();
  assert.equal((await first.done()).kind, "released");
});

test("the cap holds across two Node processes", { timeout: 30000 }, async () => {
  const ids = [newId(), newId()];
  const followed = ids.map((id) => sidecar.follow(id));
  await Promise.all(followed.map((turn) => turn.live));
  const children = ids.map((id) =>
    spawn(process.execPath, [join(import.meta.dirname, "helper-turn.js"), daemon.stateDir, "capped", id, "0.4"], {
      stdio: ["ignore", "pipe", "inherit"],
    }),
  );
  const outputs = await Promise.all(
    children.map(
      (child) =>
        new Promise((resolve, reject) => {
          let out = "";
          child.stdout.on("data", (d) => (out += d));
          child.on("exit", (code) => (code === 0 ? resolve(out) : reject(new Error(`helper exited ${code}`))));
        }),
    ),
  );
  for (const out of outputs) assert.equal(out.trim().split("\n").map((l) => JSON.parse(l).kind).at(-1), "released");
  const span = await Promise.all(
    followed.map(async (turn) => {
      await turn.done();
      const seq = (kind) => turn.events.find((e) => e.kind === kind).body.seq;
      return [seq("granted"), seq("released")];
    }),
  );
  span.sort((a, b) => a[0] - b[0]);
  assert.ok(span[0][1] < span[1][0], `the second turn was granted only after the first was released: ${JSON.stringify(span)}`);
  const queuedBehind = followed.map((t) => t.events[0].body.position);
  assert.ok(queuedBehind.includes(1), `one of them waited: ${queuedBehind}`);
});

async function fakeSupervisor() {
  const dir = mkdtempSync("/tmp/ccsup-fake-");
  const xpub = new XPublisher({ verbosity: "allSubs" });
  const router = new Router();
  await xpub.bind(`ipc://${dir}/bus-out`);
  await router.bind(`ipc://${dir}/control`);
  const fake = { dir, xpub, router, psCalls: 0, subscriptions: [] };
  // The fake answers hellos and records every subscription; ps answers that nothing runs.
  const bus = (async () => {
    for await (const [frame] of xpub) {
      const topic = frame.subarray(1).toString();
      if (frame[0] === 1 && topic.startsWith("ccsup.hello.")) await xpub.send([topic, "{}"]);
      else if (frame[0] === 1) fake.subscriptions.push(topic);
    }
  })().catch(() => {});
  const control = (async () => {
    for await (const [identity, frame] of router) {
      const request = JSON.parse(frame.toString());
      fake.psCalls += request.cmd === "ps" ? 1 : 0;
      await router.send([identity, JSON.stringify({ v: 1, id: request.id, ok: true, result: { slots: [], waits: [] } })]);
    }
  })().catch(() => {});
  fake.send = (topic, fields) => xpub.send([topic, JSON.stringify({ v: 1, ts: 0, ...fields })]);
  fake.close = async () => {
    xpub.close();
    router.close();
    await Promise.all([bus, control]);
    rmSync(dir, { recursive: true, force: true });
  };
  return fake;
}

test("a lost tail is seen by turn_ended and its terminal event inferred (fake supervisor)", { timeout: 5000 }, async () => {
  const fake = await fakeSupervisor();
  const client = await Sidecar.connect({ stateDir: fake.dir, timeout: 2000 });
  try {
    const turn = client._follow("t1"); // as a request does: every event is to come
    await turn.live;
    assert.deepEqual(fake.subscriptions, ["supervisor.", "key.", "turn.t1."], "only its own turn and the low-volume families");
    await fake.send("turn.t1.queued", { id: "t1", turn_seq: 1, position: 0 });
    await fake.send("turn.t1.stdout", { id: "t1", turn_seq: 3, offset: 0, data: "x" });
    // turn_seq 4 and 5 (exited, released) are lost; the supervisor family says where it ended.
    await fake.send("supervisor.turn_ended", { id: "t1", key: "k", state: "released", turn_seq: 5, supervisor_seq: 1 });
    const events = await collect(turn);
    assert.deepEqual(events.map((e) => e.topic), ["turn.t1.queued", "ccsup.gap", "turn.t1.stdout", "ccsup.gap", "turn.t1.released"]);
    assert.deepEqual(events[1].body, { id: "t1", counter: "turn_seq", from: 2, to: 2 });
    assert.deepEqual(events[3].body, { id: "t1", counter: "turn_seq", from: 4, to: 5 });
    assert.deepEqual(events[4].body, { id: "t1", key: "k", inferred: true });
    assert.equal(client.gaps, 3);
    assert.equal(fake.psCalls, 0);
  } finally {
    client.close();
    await fake.close();
  }
});

test("a hole in supervisor_seq is caught up with ps (fake supervisor)", { timeout: 5000 }, async () => {
  const fake = await fakeSupervisor();
  const client = await Sidecar.connect({ stateDir: fake.dir, timeout: 2000 });
  try {
    const turn = client._follow("t1");
    await turn.live;
    await fake.send("turn.t1.queued", { id: "t1", turn_seq: 1, position: 0 });
    await fake.send("turn.t1.granted", { id: "t1", turn_seq: 2, index: 0 });
    await fake.send("supervisor.reloaded", { supervisor_seq: 1 });
    // supervisor_seq 2 (its turn_ended) and the released event are lost
    await fake.send("supervisor.reloaded", { supervisor_seq: 3 });
    const events = await collect(turn);
    assert.deepEqual(events.map((e) => e.topic), ["turn.t1.queued", "turn.t1.granted", "ccsup.gap", "turn.t1.released"]);
    assert.deepEqual(events[2].body, { id: "t1", counter: "supervisor_seq", from: 2, to: 2 });
    assert.equal(events[3].body.inferred, true);
    assert.equal(fake.psCalls, 1);
  } finally {
    client.close();
    await fake.close();
  }
});

test("a sidecar receives only the turns it follows", { timeout: 30000 }, async () => {
  const other = await Sidecar.connect({ stateDir: daemon.stateDir });
  try {
    const mine = await sidecar.turn({ key: "solo", argv: ["sh", "-c", "echo mine"] });
    const theirs = await other.turn({ key: "capped", argv: ["sh", "-c", "echo theirs"] });
    const [a, b] = await Promise.all([collect(mine), collect(theirs)]);
    assert.deepEqual(new Set(a.map((e) => e.body.id)), new Set([mine.id]));
    assert.deepEqual(new Set(b.map((e) => e.body.id)), new Set([theirs.id]));
    assert.deepEqual(a.map((e) => e.body.turn_seq), a.map((_, i) => i + 1), "numbered 1..n without holes");
    assert.equal(sidecar.gaps + other.gaps, 0);
    assert.equal(sidecar.stray + other.stray, 0, "no event of another turn reached either");
  } finally {
    other.close();
  }
});

test("a reservation holds the slot and a turn that names it binds it ahead of a waiter", { timeout: 30000 }, async () => {
  const reservation = await sidecar.reserve({ key: "res", holder: { session: "s1", agent: "a" } });
  const kinds = [];
  for await (const event of reservation) {
    kinds.push(event.kind);
    if (event.kind === "granted") break;
  }
  assert.deepEqual(kinds, ["queued", "granted"]);
  const reserved = (await sidecar.ps()).slots.filter((s) => s.key === "res");
  assert.deepEqual(reserved.map((s) => [s.state, s.holder?.session]), [["reserved", "s1"]]);

  const waiter = await sidecar.turn({ key: "res", argv: ["true"], holder: { session: "s2", agent: "b" } });
  assert.equal(waiter.events[0].kind, "queued");
  // Only its holder may bind it: another session's turn naming it is rejected and takes nothing.
  const thief = await sidecar.turn({ key: "res", argv: ["true"], reservation: reservation.id, holder: { session: "s3", agent: "c" } });
  const thiefEvents = await collect(thief);
  assert.deepEqual(thiefEvents.map((e) => e.kind), ["rejected"]);
  assert.match(thiefEvents[0].body.reason, /belongs to session 's1'/);
  const bound = await sidecar.turn({
    key: "res", argv: ["echo", "bound"], reservation: reservation.id, holder: { session: "s1", agent: "a" },
  });
  const boundEvents = await collect(bound);
  const released = await reservation.done();
  assert.equal(released.kind, "released");
  assert.equal(released.body.reason, "bound");
  assert.equal(released.body.turn, bound.id);
  const granted = boundEvents.find((e) => e.kind === "granted").body;
  assert.equal(granted.reservation, reservation.id);
  assert.equal(boundEvents.at(-1).kind, "released");
  // The waiter, queued before the bound turn was even asked for, runs only after it.
  const waiterEvents = await collect(waiter);
  const waiterGranted = waiterEvents.find((e) => e.kind === "granted").body.seq;
  assert.ok(waiterGranted > boundEvents.at(-1).body.seq, "the waiter was granted after the bound turn was released");
});

test("output and stdin are exact bytes: split characters, invalid bytes, NULs", { timeout: 30000 }, async () => {
  // A character split across two writes, then bytes that are not UTF-8, then what was sent.
  const script = "printf 'a\\303'; sleep 0.05; printf '\\251\\377\\000z'; cat";
  const turn = await sidecar.turn({ key: "solo", argv: ["sh", "-c", script] });
  const sent = Buffer.from([0xff, 0x00, 0xe4, 0xb8, 0xad, 0x0a]);
  await turn.send(sent, true);
  const output = new TurnOutput(turn.id, { fill: (s, a, b) => sidecar.readLog(turn.id, s, a, b) });
  const pieces = [];
  for await (const event of turn) {
    const got = output.feed(event);
    if (got?.stream === "stdout") pieces.push(got.bytes);
    if (event.kind === "stdout") assert.ok(!("data" in event.body) || !event.body.data.includes("\ufffd"));
  }
  const expected = Buffer.concat([Buffer.from([0x61, 0xc3, 0xa9, 0xff, 0x00, 0x7a]), sent]);
  assert.deepEqual(Buffer.concat(pieces), expected);
  assert.deepEqual(sidecar.readLog(turn.id, "stdout"), expected);
  assert.equal(output.position.stdout, expected.length);
  // A gap with nothing to fill it is an error, never silent.
  const strict = new TurnOutput("x");
  assert.throws(() => strict.feed({ topic: "turn.x.stdout", kind: "stdout", body: { offset: 3, data: "a" } }), /lost on the bus/);
});

// -- admission: pause and resume --------------------------------------------------------------

test("pause and resume a key through the control socket", { timeout: 30000 }, async () => {
  const keyEvents = [];
  const stop = sidecar.onKey((topic, body) => keyEvents.push([topic, body]));
  const paused = await sidecar.pause({ key: "capped", seconds: 60, reason: "429" });
  assert.equal(paused.key, "capped");
  assert.equal(paused.reason, "429");
  assert.ok(paused.changed);
  const waiting = await sidecar.turn({ key: "capped", argv: ["true"] });
  const ps = await sidecar.ps();
  assert.equal(ps.waits.find((w) => w.id === waiting.id).why.reason, "paused");
  const resumed = await sidecar.resume({ key: "capped" });
  assert.deepEqual(resumed.resumed, ["capped"]);
  assert.equal((await waiting.done()).kind, "released");
  stop();
  assert.deepEqual(keyEvents.map(([t]) => t), ["key.capped.paused", "key.capped.resumed"]);
});

test("a bus request.pause is answered by its key.<key>.paused event, once per id", { timeout: 30000 }, async () => {
  const id = newId();
  const first = await sidecar.publishPause({ key: "res", seconds: 30, reason: "bus", id });
  assert.equal(first.id, id);
  assert.equal(first.by, "bus");
  assert.ok(first.until > Date.now() / 1000 + 25);
  const other = await sidecar.publishPause({ key: "res", seconds: 5 }); // a new id: answered, unchanged
  assert.equal(other.changed, false);
  assert.equal(other.until, first.until);
  await sidecar.resume({ key: "res" });
});

test("the example sidecar pauses its key on a harness 429 for its Retry-After", { timeout: 30000 }, async () => {
  const { followPausingOn429 } = await import("../examples/pause-on-429.js");
  const argv = ["sh", "-c", "echo 'HTTP 429 Too Many Requests' >&2; echo 'Retry-After: 9' >&2; exit 1"];
  const turn = await sidecar.turn({ key: "solo", argv });
  const { events, pause } = await followPausingOn429(sidecar, turn, "solo");
  assert.equal(events.at(-1).kind, "released");
  assert.ok(pause, "the key was paused");
  assert.ok(Math.abs(pause.until - pause.since - 9) < 1.5, `paused for about 9 s: ${pause.until - pause.since}`);
  const ps = await sidecar.ps();
  assert.equal(ps.keys.find((k) => k.key === "solo").paused.until, pause.until);
  await sidecar.resume({ key: "solo" });
});

test("a turn with a timeout is warned, then stopped with reason timeout", { timeout: 30000 }, async () => {
  const turn = await sidecar.turnWithTimeout({ key: "solo", argv: ["sleep", "30"], timeout: 0.5 });
  const events = await collect(turn);
  const kinds = events.map((e) => e.kind);
  assert.ok(kinds.indexOf("expiring") < kinds.indexOf("stopping"), kinds.join(","));
  assert.equal(events.find((e) => e.kind === "exited").body.reason, "timeout");
  assert.equal(kinds.at(-1), "released");
});

// A followed turn rides through its supervisor's SIGKILL and a start 1 s later.
// 5 s of counter, killed at its 10th line: the new supervisor adopts it while it still runs.
const COUNTER = "for i in $(seq 1 100); do echo $i; sleep 0.05; done";

async function waitFor(predicate, ms, what) {
  const deadline = Date.now() + ms;
  while (!predicate()) {
    if (Date.now() > deadline) throw new Error(`no ${what} within ${ms} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

test("a turn rides through its supervisor's SIGKILL, its output exact from the log", { timeout: 60000 }, async () => {
  const own = startDaemon("solo = 1", 'adopt_within = "30s"');
  const client = await Sidecar.connect({ stateDir: own.stateDir });
  try {
    const turn = await client.turn({ key: "solo", argv: ["sh", "-c", COUNTER] });
    const output = new TurnOutput(turn.id, { fill: (s, a, b) => client.readLog(turn.id, s, a, b) });
    const chunks = [];
    const kinds = [];
    let killedPid = null;
    for await (const event of turn) {
      kinds.push(event.kind);
      const got = output.feed(event);
      if (got?.stream === "stdout") chunks.push(got.bytes);
      if (killedPid === null && Buffer.concat(chunks).includes("\n10\n")) {
        killedPid = own.pid();
        process.kill(killedPid, "SIGKILL");
      }
      if (event.kind === "supervisor_gone") {
        assert.equal(event.body.pid, killedPid);
        await new Promise((resolve) => setTimeout(resolve, 1000)); // the scenario's 1 s gap
        own.start();
      }
    }
    chunks.push(client.readLog(turn.id, "stdout", output.position.stdout)); // the rest, from the log
    const log = client.readLog(turn.id, "stdout");
    const printed = Buffer.concat(chunks);
    assert.ok(printed.equals(log), "every byte of the log, once and in order");
    const lines = printed.toString().trim().split("\n").map(Number);
    assert.deepEqual(lines, lines.map((_, i) => i + 1));
    assert.equal(lines.length, 100);
    assert.deepEqual(kinds.filter((k) => k.startsWith("supervisor_")), ["supervisor_gone", "supervisor_back"]);
    // Adopted (its `adopted` went out before this client was back): its end comes on the bus.
    assert.deepEqual(kinds.filter((k) => LIFECYCLE.has(k)), ["queued", "granted", "started", "exited", "gone", "released"]);
    assert.equal(turn.events.find((e) => e.kind === "exited").body.code, 0);
    assert.equal(turn.terminal.body.inferred, undefined);
    assert.notEqual(turn.terminal.body.epoch, turn.events[0].body.epoch);
    assert.equal(client.gaps, 0, "a restart is not a gap");
  } finally {
    client.close();
    own.stop();
  }
});

test("with no supervisor back in time a followed turn fails with supervisor_lost", { timeout: 60000 }, async () => {
  const own = startDaemon("solo = 1", 'adopt_within = "2s"');
  const client = await Sidecar.connect({ stateDir: own.stateDir });
  try {
    const status = await client.status();
    assert.equal(status.adopt_within, 2);
    const waitMs = status.adopt_within * 1000 + 5000;
    const turn = await client.turn({ key: "solo", argv: ["sh", "-c", COUNTER] });
    let killedAt = null;
    const kinds = [];
    await assert.rejects(
      (async () => {
        for await (const event of turn) {
          kinds.push(event.kind);
          if (killedAt === null && event.kind === "stdout" && client.readLog(turn.id, "stdout").includes("3\n")) {
            process.kill(own.pid(), "SIGKILL");
            killedAt = Date.now();
          }
        }
      })(),
      (e) => e.code === "supervisor_lost" && e.message.includes("none answered within"),
    );
    const took = Date.now() - killedAt;
    assert.ok(took >= waitMs - 500 && took <= waitMs + 3000, `gave up after ${took} ms (limit ${waitMs})`);
    assert.equal(kinds.at(-1), "supervisor_gone");
    await assert.rejects(turn.done(), (e) => e.code === "supervisor_lost");
  } finally {
    client.close();
    try {
      own.stop(); // nothing runs: it says so, and the directory goes
    } catch {}
  }
});

/** Every event of `turn` (their kinds) and its stdout, exact (what was published while nobody
 * listened is read from the log); `onEvent` sees each event as it comes. */
async function readTurn(client, turn, onEvent = async () => {}) {
  const output = new TurnOutput(turn.id, { fill: (s, a, b) => client.readLog(turn.id, s, a, b) });
  const chunks = [];
  const kinds = [];
  for await (const event of turn) {
    kinds.push(event.kind);
    const got = output.feed(event);
    if (got?.stream === "stdout") chunks.push(got.bytes);
    await onEvent(event);
  }
  return { printed: Buffer.concat(chunks).toString(), kinds };
}

test("a turn granted whose guard had not started at a SIGKILL is requested again and runs", { timeout: 90000 }, async () => {
  // tests/helpers/killed_at.py granted: the supervisor SIGKILLs itself the moment it has published
  // a turn's `granted` (not `blocker`'s), before that turn's guard is asked for.
  const marks = join(mkdtempSync("/tmp/ccsup-node-marks-"), "killed");
  writeFileSync(marks, "blocker\n");
  const own = startDaemon("solo = 1", 'adopt_within = "30s"', { wrapper: "killed_at.py", wrapperArgs: ["granted", marks] });
  const client = await Sidecar.connect({ stateDir: own.stateDir });
  try {
    await client.turn({ key: "solo", argv: ["sh", "-c", "read x"], id: "blocker" });
    const turn = await client.turn({ key: "solo", argv: ["sh", "-c", "seq 1 500; exit 3"], id: "again", stdin: "null" });
    const { printed, kinds } = await readTurn(client, turn, async (event) => {
      if (event.kind === "queued") await client.call("cancel", { id: "blocker" }); // `again` is granted: the supervisor dies
      if (event.kind === "supervisor_gone") own.start(); // (marks name `again` now: it lives)
    });
    assert.equal(printed, Array.from({ length: 500 }, (_, i) => `${i + 1}\n`).join(""));
    assert.equal(turn.events.find((e) => e.kind === "exited").body.code, 3);
    assert.deepEqual(kinds.filter((k) => ["started", "exited", "gone", "released"].includes(k)), ["started", "exited", "gone", "released"]);
    assert.ok(kinds.indexOf("supervisor_back") < kinds.indexOf("started"), kinds.join(" "));
  } finally {
    client.close();
    own.stop();
    rmSync(dirname(marks), { recursive: true, force: true });
  }
});

test("a turn request that died unanswered with its supervisor is sent again by its id and runs", { timeout: 90000 }, async () => {
  const own = startDaemon("solo = 1", 'adopt_within = "30s"');
  const client = await Sidecar.connect({ stateDir: own.stateDir, timeout: 2000 });
  try {
    const id = newId();
    await client.follow(id).live; // subscribed first: all the supervisor misses is the request
    const pid = own.pid();
    process.kill(pid, "SIGSTOP"); // it reads nothing more: the request dies with it, unanswered
    const asked = client.turn({ key: "solo", argv: ["sh", "-c", "seq 1 300; exit 4"], id, stdin: "null" });
    await new Promise((resolve) => setTimeout(resolve, 100)); // published (or not: lost alike)
    process.kill(pid, "SIGKILL");
    await waitFor(() => {
      try {
        process.kill(pid, 0);
        return false;
      } catch {
        return true;
      }
    }, 20000, "the supervisor gone");
    await new Promise((resolve) => setTimeout(resolve, 2500)); // the gap: longer than the timeout
    own.start();
    const turn = await asked; // not rejected: it waited through the gap
    const { printed, kinds } = await readTurn(client, turn);
    assert.equal(printed, Array.from({ length: 300 }, (_, i) => `${i + 1}\n`).join(""));
    assert.equal(turn.events.find((e) => e.kind === "exited").body.code, 4);
    assert.deepEqual(kinds.filter((k) => ["started", "exited", "gone", "released"].includes(k)), ["started", "exited", "gone", "released"]);
    const first = kinds.findIndex((k) => LIFECYCLE.has(k));
    assert.ok(kinds.indexOf("supervisor_back") < first, kinds.join(" ")); // answered by the second
  } finally {
    client.close();
    own.stop();
  }
});
