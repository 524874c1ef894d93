// A small Node.js client of the ccsup supervisor, for sidecars (ES module, zeromq v6).
//
// What it does: finds the state directory as the ccsup CLI does, connects a SUB to bus-out (made
// live by the `ccsup.hello.<nonce>` handshake before anything is requested), a PUB to bus-in and a
// DEALER to the control socket. A turn is requested by publishing `request.turn` on the bus and
// re-publishing (requests are idempotent by id) until the supervisor's first event for that id
// arrives: a fresh PUB drops what it sends before its connection is up, so one send is not enough.
// The turn's events are then yielded in order by an async iterator that ends after the terminal
// one (`released`, `cancelled` or `rejected`).
//
// Design note (narrow subscriptions, losses). The client subscribes only to what it follows:
// `turn.<id>.` for each followed turn (made live by a hello before the turn is requested, and
// dropped after its terminal event) and the low-volume `supervisor.` family, so a sidecar never
// receives, let alone decodes, the output of turns it does not follow. (It once subscribed to
// every `turn.` topic to check the global `seq`: ten sidecars then each decoded every turn's
// output.) Losses are seen by the family counters: a turn's events carry `turn_seq` (1, 2, ...),
// `supervisor.*` events carry `supervisor_seq`, and `supervisor.turn_ended` {id, key, state,
// turn_seq} follows every turn's terminal event. A hole in a turn's `turn_seq` gives that turn a
// `ccsup.gap` event {id, counter: "turn_seq", from, to}. A `turn_ended` past the last `turn_seq`
// seen means the tail was lost: a `ccsup.gap`, then the terminal event, *inferred* (`inferred:
// true`) with the state `turn_ended` names. A hole in `supervisor_seq` (a `turn_ended` may be in
// it) gives every followed turn a `ccsup.gap` {counter: "supervisor_seq"} and the client catches
// up with `ps` on the control socket: a turn that `ps` no longer shows has ended; a second hello
// round trip (answered after every event the supervisor published before it) then delivers its
// real terminal event if it is still in flight, else an inferred one: `released` when the turn
// was granted, else `cancelled` with reason `unknown`. Lost output is in
// `<state>/turns/<id>/stdout.log` (exact bytes, by `offset`; `TurnOutput` fills from it).
//
// Output. `turn.<id>.stdout|stderr` bodies carry `offset` (the chunk's byte offset in the stream
// and its log: chunks tile it) and either `data` (the chunk is UTF-8 text, whole characters) or
// `data_b64` (its exact bytes, when they are not UTF-8). `outputBytes(body)` gives a chunk's
// bytes and `TurnOutput` reassembles a turn's streams exactly; `send` takes a Buffer as well as
// text (a Buffer that is not UTF-8 is sent as `data_b64`).
//
// Restarts (a running turn outlives its supervisor for `[guard] adopt_within`). Every
// supervisor event carries `epoch`, one per supervisor run: an event of a new epoch starts every
// count again from the first event seen of that run (no gap is reported for what the new
// supervisor published before this client reached it). The client watches the supervisor that
// answered its `status` (pid, and its start time in /proc/<pid>/stat, so a reused pid is not
// taken for it; only when the state directory's lock file names that pid, i.e. on this machine).
// When it has ended while turns are followed, each turn gets `ccsup.supervisor_gone` {id, pid,
// wait_s}, and the client waits up to adopt_within (from `status`) + 5 s for a supervisor to
// answer `status` again. Then the bus subscription (reconnected by ZeroMQ) is made live again by a
// hello, each turn gets `ccsup.supervisor_back` {id, pid, gap_s}, and `ps` says which ended
// meanwhile: those get an inferred terminal event (as after a seq gap; their exit status is in
// the history, `ccsup show --json ID`); a turn of ours that `ps` shows held (`held_until`: granted
// before the crash, its guard never started) is requested again, the same request by its id, and
// runs there; so is one of ours that no supervisor answered and `ps` does not know (its request
// died with its supervisor: `turn()` waits through the gap instead of rejecting). Output goes on at its byte offsets: `TurnOutput` with a
// `fill` from `readLog` takes what was published while nobody listened from the log, and skips
// bytes it already gave. When no supervisor answered in time, every followed turn's iterator (and
// `done()`) throws a CcsupError with code "supervisor_lost".
//
// State: none on disk. What the client does not read: the TOML config (its `state_dir` and
// endpoints) — pass `stateDir` and `endpoints` when the supervisor does not use the defaults.
// An older supervisor (no epoch) counts from 1 again too: a lower count is followed, not a gap.

import { Dealer, Publisher, Subscriber } from "zeromq";
import { randomUUID } from "node:crypto";
import { closeSync, openSync, readFileSync, readSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

export const TERMINAL = new Set(["released", "cancelled", "rejected"]);
const SUPERVISOR_FAMILY = "supervisor.";
// Low-volume topic families every sidecar receives whole (`key.`: pauses and resumes); a turn's
// own topics are subscribed per turn.
const LOW_VOLUME_FAMILIES = [SUPERVISOR_FAMILY, "key."];
const TURN_ENDED = "supervisor.turn_ended";
const HELLO_PREFIX = "ccsup.hello.";
const HELLO_RETRY_MS = 500;
const OWN_FAMILIES = ["turn.", "supervisor.", "slot."]; // never forwarded from others: epochs believed
export const RETURN_MARGIN_MS = 5000; // waited past adopt_within for a supervisor to answer again
const WATCH_MS = 200; // how often the supervisor's pid is looked at while turns are followed
const RETURN_POLL_MS = 50;

export class CcsupError extends Error {
  constructor(message, code = "failed") {
    super(message);
    this.name = "CcsupError";
    this.code = code;
  }
}

/** The state directory: $CCSUP_STATE_DIR, else $XDG_STATE_HOME/ccsup, else ~/.local/state/ccsup. */
/** A turn's `env` fields: as given, or with `inheritEnv` this process's environment with `env`
 * applied (null removes), sent whole as `env_replace` (supervisor.wire.args). */
export function envFields(env, inheritEnv = false) {
  if (!inheritEnv) return { env };
  const whole = { ...process.env };
  for (const [name, value] of Object.entries(env || {})) {
    if (value === null || value === undefined) delete whole[name];
    else whole[name] = value;
  }
  return { env: whole, env_replace: true };
}

export function findStateDir(env = process.env) {
  if (env.CCSUP_STATE_DIR) return env.CCSUP_STATE_DIR;
  if (env.XDG_STATE_HOME) return join(env.XDG_STATE_HOME, "ccsup");
  return join(env.HOME || homedir(), ".local", "state", "ccsup");
}

/** The default ipc:// endpoints inside a state directory. */
export function defaultEndpoints(stateDir) {
  return {
    control: `ipc://${join(stateDir, "control")}`,
    busIn: `ipc://${join(stateDir, "bus-in")}`,
    busOut: `ipc://${join(stateDir, "bus-out")}`,
  };
}

export function newId() {
  return randomUUID().replaceAll("-", "");
}

/** One followed turn (or reservation): its events, in order, as an async iterator. */
export class Turn {
  constructor(id, sidecar) {
    this.id = id;
    this.events = []; // every event seen so far: {topic, kind, body}
    this.terminal = null;
    this.granted = false;
    this.answered = false; // an event of the supervisor's came for it
    this.lastSeq = null; // the last turn_seq seen (0: every event of the turn is still to come)
    this.rebased = false; // a new supervisor run: its next turn_seq is a new baseline, not a gap
    this.failed = null; // the CcsupError that ended the following (supervisor_lost)
    this.live = Promise.resolve(); // resolves once the subscription to its topics is live
    this._sidecar = sidecar;
    this._queue = [];
    this._waiters = [];
    this._firstEvent = new Promise((resolve) => (this._resolveFirst = resolve));
    this._ended = new Promise((resolve, reject) => {
      this._resolveEnded = resolve;
      this._rejectEnded = reject;
    });
    this._ended.catch(() => {}); // a failure nobody waits on with done() is not unhandled
  }

  _push(event) {
    if (this.terminal) return; // nothing follows a terminal event
    if (event.kind === "granted") this.granted = true;
    if (TERMINAL.has(event.kind)) this.terminal = event;
    if (!event.topic.startsWith("ccsup.")) {
      this.answered = true; // the supervisor has its request (or it was requested elsewhere)
      this._resolveFirst(event);
    }
    this.events.push(event);
    const waiter = this._waiters.shift();
    if (waiter) waiter.resolve(event);
    else this._queue.push(event);
    if (this.terminal) {
      this._resolveEnded(this.terminal);
      for (const w of this._waiters.splice(0)) w.resolve(null);
      this._sidecar._forget(this.id);
    }
  }

  /** No supervisor came back: the events already queued are still read, then `error` is thrown. */
  _fail(error) {
    if (this.terminal || this.failed) return;
    this.failed = error;
    this._rejectEnded(error);
    for (const w of this._waiters.splice(0)) w.reject(error);
    this._sidecar._forget(this.id);
  }

  /** The next event, or null after the terminal one has been taken; rejects once it failed. */
  next() {
    if (this._queue.length) return Promise.resolve(this._queue.shift());
    if (this.terminal) return Promise.resolve(null);
    if (this.failed) return Promise.reject(this.failed);
    return new Promise((resolve, reject) => this._waiters.push({ resolve, reject }));
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      const event = await this.next();
      if (event === null) return;
      yield event;
      if (TERMINAL.has(event.kind)) return;
    }
  }

  /** Resolves with the terminal event (consumes nothing from the iterator); rejects with
   * CcsupError "supervisor_lost" when no supervisor came back. */
  done() {
    return this._ended;
  }

  send(data, eof = false) {
    return this._sidecar.send(this.id, data, eof);
  }

  cancel() {
    return this._sidecar.cancel(this.id);
  }
}

export class Sidecar {
  /** Connect and make the bus subscription live; rejects when no supervisor answers. */
  static async connect(options = {}) {
    const sidecar = new Sidecar(options);
    try {
      await sidecar._hello(sidecar.timeout);
      await sidecar._watchSupervisor();
    } catch (e) {
      sidecar.close();
      throw e;
    }
    return sidecar;
  }

  constructor({ stateDir, endpoints, timeout = 5000, holder } = {}) {
    this.stateDir = stateDir || findStateDir();
    this.endpoints = endpoints || defaultEndpoints(this.stateDir);
    this.timeout = timeout;
    this.holder = holder; // default holder for requests (session, agent, ...)
    this.gaps = 0; // events missed, by the family counters (turn_seq, supervisor_seq)
    this.stray = 0; // events received of turns not followed (a narrow subscription keeps it 0)
    this._turns = new Map();
    this._hellos = new Map();
    this._supervisorSeq = null;
    this._epoch = null; // the supervisor run whose events came last
    this._watch = null; // the supervisor run watched: {pid, start, adoptWithin}
    this._away = false; // its supervisor is gone and one is waited for
    this._watchTimer = null;
    this._closed = false;
    this._controlChain = Promise.resolve();
    this._pauseAnswers = new Map(); // request.pause id -> resolve (see publishPause)
    this._keyListeners = new Set();
    this._sub = new Subscriber({ receiveHighWaterMark: 0 });
    this._sub.connect(this.endpoints.busOut);
    for (const family of LOW_VOLUME_FAMILIES) this._sub.subscribe(family);
    this._pub = new Publisher();
    this._pub.connect(this.endpoints.busIn);
    this._pumping = this._pump().catch((e) => {
      for (const turn of this._turns.values()) turn._push({ topic: "ccsup.error", kind: "error", body: { id: turn.id, error: e.message } });
    });
  }

  close() {
    if (this._closed) return;
    this._closed = true;
    if (this._watchTimer) clearInterval(this._watchTimer);
    for (const sock of [this._sub, this._pub, this._dealer]) {
      if (sock) {
        sock.linger = 0;
        sock.close();
      }
    }
  }

  // -- the bus --------------------------------------------------------------------------------

  async _pump() {
    try {
      for await (const frames of this._sub) this._dispatch(frames);
    } catch (e) {
      if (!this._closed) throw e;
    }
  }

  _dispatch(frames) {
    if (frames.length !== 2) return; // anyone may publish on the bus; not an event
    const topic = frames[0].toString();
    if (topic.startsWith(HELLO_PREFIX)) {
      const resolve = this._hellos.get(topic);
      if (resolve) resolve();
      return;
    }
    let body;
    try {
      body = JSON.parse(frames[1].toString());
    } catch {
      return;
    }
    if (body === null || typeof body !== "object") return;
    if (OWN_FAMILIES.some((f) => topic.startsWith(f))) this._checkEpoch(body);
    if (topic.startsWith(SUPERVISOR_FAMILY)) {
      this._onSupervisorEvent(topic, body);
      return;
    }
    if (topic.startsWith("key.")) return this._onKeyEvent(topic, body); // pause and resume
    if (!topic.startsWith("turn.")) return;
    const kind = topic.slice(topic.lastIndexOf(".") + 1);
    const id = topic.slice(5, topic.lastIndexOf("."));
    const turn = this._turns.get(id);
    if (!turn) {
      this.stray += 1;
      return;
    }
    if (Number.isInteger(body.turn_seq)) {
      if (turn.rebased) turn.rebased = false; // the first of a new run: a baseline
      else if (turn.lastSeq !== null && body.turn_seq > turn.lastSeq + 1) this._turnGap(turn, turn.lastSeq + 1, body.turn_seq - 1);
      turn.lastSeq = body.turn_seq; // lower: a restarted supervisor; follow its count
    }
    turn._push({ topic, kind, body });
  }

  /** A new supervisor run: every count starts again from the next event seen. */
  _checkEpoch(body) {
    if (typeof body.epoch !== "string" || body.epoch === this._epoch) return;
    if (this._epoch !== null) {
      this._supervisorSeq = null;
      for (const turn of this._turns.values()) turn.rebased = true;
    }
    this._epoch = body.epoch;
  }

  _onSupervisorEvent(topic, body) {
    if (Number.isInteger(body.supervisor_seq)) {
      const last = this._supervisorSeq;
      this._supervisorSeq = body.supervisor_seq; // lower: a restarted supervisor
      if (last !== null && body.supervisor_seq > last + 1) this._onGap(last + 1, body.supervisor_seq - 1);
    }
    if (topic !== TURN_ENDED) return;
    const turn = this._turns.get(body.id);
    if (!turn || turn.terminal || (turn.lastSeq === null && !turn.rebased) || !TERMINAL.has(body.state)) return;
    // Its terminal event should have come before this: the tail of the turn was lost (of this
    // run's events: with nothing seen of a new run, no count says how many).
    if (!turn.rebased && Number.isInteger(body.turn_seq) && body.turn_seq > turn.lastSeq) this._turnGap(turn, turn.lastSeq + 1, body.turn_seq);
    turn._push({ topic: `turn.${turn.id}.${body.state}`, kind: body.state, body: { id: turn.id, key: body.key, inferred: true } });
  }

  _turnGap(turn, from, to) {
    this.gaps += to - from + 1;
    turn._push({ topic: "ccsup.gap", kind: "gap", body: { id: turn.id, counter: "turn_seq", from, to } });
  }

  /** Subscribe to a fresh hello topic and wait for the supervisor's answer on it. */
  async _hello(timeoutMs) {
    const topic = `${HELLO_PREFIX}${newId()}`;
    const answered = new Promise((resolve) => this._hellos.set(topic, resolve));
    const deadline = Date.now() + timeoutMs;
    try {
      while (Date.now() < deadline) {
        this._sub.subscribe(topic);
        const got = await Promise.race([answered.then(() => true), sleep(HELLO_RETRY_MS).then(() => false)]);
        this._sub.unsubscribe(topic);
        if (got) return;
      }
    } finally {
      this._hellos.delete(topic);
    }
    throw new CcsupError(`no supervisor answered a bus subscription on ${this.endpoints.busOut}`, "not_running");
  }

  _onGap(from, to) {
    this.gaps += to - from + 1;
    const followed = [...this._turns.values()];
    for (const turn of followed) turn._push({ topic: "ccsup.gap", kind: "gap", body: { id: turn.id, counter: "supervisor_seq", from, to } });
    this._catchUp(followed).catch((e) => {
      for (const turn of followed) turn._push({ topic: "ccsup.gap", kind: "catchup_failed", body: { id: turn.id, error: e.message } });
    });
  }

  /** Follow a turn this client requests, keeping its request to send again (`_catchUp`). */
  _asking(id, body) {
    const turn = this._follow(id);
    turn._asked = body;
    return turn;
  }

  async _catchUp(turns) {
    const ps = await this.ps();
    // Held for its requester (granted before a crash, its guard never started: `held_until`):
    // the same request again, by its id, and it runs on this supervisor.
    const held = new Set(ps.waits.filter((w) => w.held_until).map((w) => w.id));
    for (const turn of turns) {
      if (held.has(turn.id) && turn._asked && !turn.terminal) await this.call("turn", turn._asked);
    }
    const present = new Set([...ps.slots.map((s) => s.turn), ...ps.waits.map((w) => w.id)]);
    // Asked by us, never answered, and unknown here: the request died with its supervisor. The
    // same request again, by its id (an id that ran to its end is answered with that end).
    for (const turn of turns) {
      if (turn.answered || turn.terminal || !turn._asked || present.has(turn.id)) continue;
      const answer = await this.call("turn", turn._asked);
      present.add(turn.id);
      if (TERMINAL.has(answer.state)) {
        turn._push({ topic: `turn.${turn.id}.${answer.state}`, kind: answer.state, body: { id: turn.id, inferred: true } });
      }
    }
    const ended = turns.filter((t) => !t.terminal && !present.has(t.id));
    if (!ended.length) return;
    // Events published before ps answered may still be on their way: a hello answered now comes
    // after all of them (the XPUB keeps order), so a real terminal event wins over an inferred one.
    await this._hello(this.timeout);
    for (const turn of ended) {
      if (turn.terminal) continue;
      const kind = turn.granted ? "released" : "cancelled";
      const body = turn.granted ? { id: turn.id, inferred: true } : { id: turn.id, reason: "unknown", inferred: true };
      turn._push({ topic: `turn.${turn.id}.${kind}`, kind, body });
    }
  }

  // -- riding through a supervisor's restart (see the note at the top) -------------------------

  /** Watch the supervisor that answers `status` now (only one on this machine, named by the lock). */
  async _watchSupervisor() {
    let status;
    try {
      status = await this.call("status");
    } catch (e) {
      if (e.code === "not_running") throw e;
      return; // an error reply: nothing to watch, as for an older supervisor
    }
    this._watch = watchOf(status, this.stateDir, this.endpoints);
    if (this._watch && !this._watchTimer) {
      this._watchTimer = setInterval(() => this._checkSupervisor(), WATCH_MS);
      this._watchTimer.unref();
    }
  }

  _checkSupervisor() {
    const watch = this._watch;
    if (!watch || this._away || this._closed || this._turns.size === 0) return;
    if (processStart(watch.pid) === watch.start) return;
    this._away = true;
    const waitMs = watch.adoptWithin * 1000 + RETURN_MARGIN_MS;
    for (const turn of this._turns.values()) {
      turn._push({ topic: "ccsup.supervisor_gone", kind: "supervisor_gone", body: { id: turn.id, pid: watch.pid, wait_s: waitMs / 1000 } });
    }
    this._rideThrough(watch, waitMs).catch((e) => this._loseAll(e.message));
  }

  async _rideThrough(watch, waitMs) {
    const since = Date.now();
    const deadline = since + waitMs;
    this._dropDealer(); // requests queued for the dead supervisor go with its connection
    let status = null;
    while (!this._closed && Date.now() < deadline && status === null) {
      const pid = lockPid(this.stateDir);
      if (pid !== null && !(pid === watch.pid && processStart(pid) === watch.start) && processStart(pid) !== null) {
        try {
          status = await this.call("status");
        } catch {
          this._dropDealer(); // starting still, or gone again
        }
      }
      if (status === null) await sleep(RETURN_POLL_MS);
    }
    if (this._closed) return;
    if (status === null) {
      const waited = (waitMs / 1000).toString();
      return this._loseAll(`the supervisor on ${this.stateDir} is gone and none answered within ${waited} s (adopt_within ${watch.adoptWithin} s + ${RETURN_MARGIN_MS / 1000} s)`);
    }
    this._watch = watchOf(status, this.stateDir, this.endpoints);
    await this._hello(this.timeout); // ZeroMQ reconnected the SUB; a hello answered says it is live
    this._away = false;
    const followed = [...this._turns.values()];
    for (const turn of followed) {
      turn.rebased = true;
      turn._push({ topic: "ccsup.supervisor_back", kind: "supervisor_back", body: { id: turn.id, pid: status.pid, gap_s: (Date.now() - since) / 1000 } });
    }
    await this._catchUp(followed); // the ones that ended meanwhile: an inferred terminal event
  }

  _loseAll(message) {
    this._away = false;
    for (const turn of [...this._turns.values()]) turn._fail(new CcsupError(`${message}: turn ${turn.id}'s end is not known`, "supervisor_lost"));
  }

  _dropDealer() {
    if (!this._dealer) return;
    const dealer = this._dealer;
    this._dealer = null;
    dealer.linger = 0;
    dealer.close();
  }

  /**
   * Follow a turn requested elsewhere (another process, the control socket) by its id. Its
   * events reach this client once `turn.live` resolves; follow it before it is requested to see
   * them all.
   */
  follow(id) {
    return this._follow(id, null);
  }

  _forget(id) {
    if (this._turns.delete(id) && !this._closed) this._sub.unsubscribe(`turn.${id}.`);
  }

  /** `fromStart`: 0 when every event of the turn is still to come (we request it), else null. */
  _follow(id, fromStart = 0) {
    let turn = this._turns.get(id);
    if (!turn) {
      turn = new Turn(id, this);
      turn.lastSeq = fromStart;
      this._turns.set(id, turn);
      this._sub.subscribe(`turn.${id}.`);
      turn.live = this._hello(this.timeout); // earlier subscriptions are live once it is answered
      turn.live.catch(() => {});
    }
    return turn;
  }

  /** Publish request.<kind> until the first event for `turn` arrives (or the timeout passes). */
  async _request(kind, body, turn) {
    const frames = [`request.${kind}`, JSON.stringify({ v: 1, ts: Date.now() / 1000, ...body })];
    const deadline = Date.now() + this.timeout;
    let interval = 20;
    let answered = false;
    turn._firstEvent.then(() => (answered = true));
    try {
      await turn.live;
    } catch (e) {
      this._forget(turn.id);
      throw e;
    }
    while (!answered) {
      if (!this._away && Date.now() > deadline) this._checkSupervisor(); // gone, not yet seen?
      if (this._away) {
        // The supervisor died before it answered: the ride-through asks again by the id once
        // one answers (`_catchUp`), or fails the turn (supervisor_lost).
        await Promise.race([turn._firstEvent, turn._ended.catch(() => {})]);
        if (turn.failed) throw turn.failed;
        break;
      }
      await this._pub.send(frames);
      await Promise.race([turn._firstEvent, sleep(interval)]);
      if (answered) break;
      if (Date.now() > deadline && !this._away) {
        this._forget(turn.id);
        throw new CcsupError(`no event answered request.${kind} ${JSON.stringify(body.id)} on ${this.stateDir}`);
      }
      interval = Math.min(interval * 2, 500);
    }
    return turn;
  }

  /**
   * Request a turn on the bus; resolves with its Turn once the supervisor answered.
   * `env` is added to the supervisor's environment (null removes a variable) unless `inheritEnv`
   * is true: then the turn's environment is this process's (process.env) with `env` applied, as
   * `ccsup run` gives its caller's. The default stays explicit: a sidecar's own environment is
   * seldom what its turns should get. `stdin`: "pipe" (default, fed by `send`), "null" or "tty".
   */
  turn({ key, argv, id = newId(), cwd, env, inheritEnv = false, stdin, holder = this.holder, reservation, waitTimeout } = {}) {
    const body = compact({ id, key, argv, cwd, ...envFields(env, inheritEnv), stdin, holder, reservation, wait_timeout: waitTimeout });
    return this._request("turn", body, this._asking(id, body));
  }

  /** Reserve a slot on the bus; its events are followed like a turn's (`turn.<id>.*`). */
  reserve({ key, id = newId(), holder = this.holder, waitTimeout } = {}) {
    const body = compact({ id, key, holder, wait_timeout: waitTimeout });
    return this._request("reserve", body, this._follow(id));
  }

  /**
   * Cancel a turn or reservation. One this client follows is cancelled on the bus (re-published
   * until the turn shows a new event, or has ended); any other through the control socket.
   */
  async cancel(id) {
    const turn = this._turns.get(id);
    if (!turn) return this.call("cancel", { id });
    const seen = turn.events.length;
    const frames = ["request.cancel", JSON.stringify({ v: 1, ts: Date.now() / 1000, id })];
    const deadline = Date.now() + this.timeout;
    let interval = 20;
    while (!turn.terminal && turn.events.length === seen) {
      if (Date.now() > deadline) throw new CcsupError(`no event answered request.cancel ${JSON.stringify(id)} on ${this.stateDir}`);
      await this._pub.send(frames);
      await sleep(interval);
      interval = Math.min(interval * 2, 500);
    }
    return { id };
  }

  // -- the control socket ---------------------------------------------------------------------

  /** One control request; resolves with `result`, rejects with CcsupError(code) on an error reply. */
  call(cmd, args = {}) {
    // A DEALER allows one reader at a time: requests are chained.
    const run = this._controlChain.then(() => this._call(cmd, args));
    this._controlChain = run.catch(() => {});
    return run;
  }

  async _call(cmd, args) {
    if (this._closed) throw new CcsupError("the client is closed");
    if (!this._dealer) {
      this._dealer = new Dealer({ receiveTimeout: this.timeout, linger: 0 });
      this._dealer.connect(this.endpoints.control);
    }
    const dealer = this._dealer;
    const id = newId();
    await dealer.send(JSON.stringify({ v: 1, id, cmd, args }));
    for (;;) {
      let frames;
      try {
        frames = await dealer.receive();
      } catch (e) {
        // Nothing stale may stay queued on it: a timed-out DEALER is replaced.
        if (this._dealer === dealer) this._dropDealer();
        throw new CcsupError(`the supervisor on ${this.stateDir} did not answer ${cmd} (${e.message})`, "not_running");
      }
      // A long reply (a big `ps`) comes in several frames whose bytes joined are the JSON.
      const parts = frames.length > 1 && frames[0].length === 0 ? frames.slice(1) : frames;
      const reply = JSON.parse(Buffer.concat(parts).toString());
      if (reply.id !== id) continue; // a late reply to an earlier request
      if (reply.ok) return reply.result;
      throw new CcsupError(`${cmd}: ${reply.error.message}`, reply.error.code);
    }
  }

  status() {
    return this.call("status");
  }

  ps() {
    return this.call("ps");
  }

  /** Write to a turn's stdin (`eof` closes it): a string as UTF-8, a Buffer exactly. */
  send(id, data, eof = false) {
    return this.call("send", { id, ...sendData(data), eof });
  }

  /** Bytes [start, end) of a turn's output log on this machine (a TurnOutput `fill`). */
  readLog(id, stream, start = 0, end = undefined) {
    return readRange(join(this.stateDir, "turns", id, `${stream}.log`), start, end);
  }

  // -- admission: pause and resume a key ------------------------------------------------------

  /**
   * `turn` with a runtime limit: the turn is stopped after `timeout` seconds of running (or the
   * key's [slots] max_runtime when smaller); `turn.<id>.expiring` comes first, and its `exited`
   * says `reason: "timeout"`.
   */
  turnWithTimeout({ timeout, key, argv, id = newId(), cwd, env, inheritEnv = false, stdin, holder = this.holder, reservation, waitTimeout } = {}) {
    const body = compact({ id, key, argv, cwd, ...envFields(env, inheritEnv), stdin, holder, reservation, wait_timeout: waitTimeout, timeout });
    return this._request("turn", body, this._asking(id, body));
  }

  /**
   * Pause a key (a bare harness name pauses all its keys) for `seconds` or until `until` (epoch
   * seconds), through the control socket. Resolves with the key's pause: {key, until, reason, by,
   * since, changed, capped}; the supervisor caps the end at now + [slots] max_pause.
   */
  pause({ key, seconds, until, reason, id } = {}) {
    return this.call("pause", compact({ key, for: seconds, until, reason, id }));
  }

  /** End a key's pause now. Resolves with {key, resumed: [...], still_paused}. */
  resume({ key, reason } = {}) {
    return this.call("resume", compact({ key, reason }));
  }

  /**
   * Pause a key on the bus (`request.pause`), as a sidecar that just saw a 429 does: re-published
   * (idempotent by id) until the supervisor's `key.<key>.paused` answer for this id arrives;
   * resolves with that event's body.
   */
  async publishPause({ key, seconds, until, reason, id = newId() } = {}) {
    const body = compact({ id, key, for: seconds, until, reason });
    const frames = ["request.pause", JSON.stringify({ v: 1, ts: Date.now() / 1000, ...body })];
    const answered = new Promise((resolve) => this._pauseAnswers.set(id, resolve));
    const deadline = Date.now() + this.timeout;
    let interval = 20;
    try {
      for (;;) {
        await this._pub.send(frames);
        const answer = await Promise.race([answered, sleep(interval).then(() => null)]);
        if (answer) return answer;
        if (Date.now() > deadline) throw new CcsupError(`no event answered request.pause ${JSON.stringify(id)} on ${this.stateDir}`);
        interval = Math.min(interval * 2, 500);
      }
    } finally {
      this._pauseAnswers.delete(id);
    }
  }

  /** Call `listener(topic, body)` for every key.<key>.paused|resumed event; returns an unsubscribe. */
  onKey(listener) {
    this._keyListeners.add(listener);
    return () => this._keyListeners.delete(listener);
  }

  _onKeyEvent(topic, body) {
    if (topic.endsWith(".paused") && this._pauseAnswers.has(body.id)) this._pauseAnswers.get(body.id)(body);
    for (const listener of this._keyListeners) listener(topic, body);
  }
}

/** What watching a supervisor needs from its `status`: null unless it runs on this machine (the
 * lock file in the state directory names its pid). */
function watchOf(status, stateDir, endpoints) {
  if (!status || !Number.isInteger(status.pid) || !endpoints.control.startsWith("ipc://")) return null;
  if (lockPid(stateDir) !== status.pid) return null;
  const start = processStart(status.pid);
  if (start === null) return null;
  const adoptWithin = typeof status.adopt_within === "number" ? status.adopt_within : 0;
  return { pid: status.pid, start, adoptWithin, epoch: status.epoch };
}

/** The pid the state directory's lock file names (written by the supervisor holding it). */
function lockPid(stateDir) {
  try {
    const pid = Number.parseInt(readFileSync(join(stateDir, "supervisor.lock"), "utf8").trim(), 10);
    return Number.isInteger(pid) ? pid : null;
  } catch {
    return null;
  }
}

/** A process's start time (field 22 of /proc/<pid>/stat, in clock ticks), null when it is gone;
 * a zombie counts as gone. */
function processStart(pid) {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return fields[0] === "Z" || fields[0] === "X" ? null : fields[19];
  } catch {
    return null;
  }
}

function compact(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined && v !== null));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// -- output: exact bytes ------------------------------------------------------------------------

const STRICT_UTF8 = new TextDecoder("utf-8", { fatal: true });

/** The data field of a send request: `data` for text (and UTF-8 Buffers), else `data_b64`. */
export function sendData(data) {
  if (typeof data === "string") return { data };
  const buffer = Buffer.from(data);
  try {
    return { data: STRICT_UTF8.decode(buffer) };
  } catch {
    return { data_b64: buffer.toString("base64") };
  }
}

/** The exact bytes of an output event's body: `data` (UTF-8 text) or `data_b64` (base64). */
export function outputBytes(body) {
  if (typeof body.data_b64 === "string") return Buffer.from(body.data_b64, "base64");
  return Buffer.from(typeof body.data === "string" ? body.data : "", "utf8");
}

/**
 * Reassembles a turn's stdout and stderr exactly from its events.
 *
 * `feed(event)` returns `{stream, bytes}` for an output event (the new bytes, in stream order) and
 * null for any other. A chunk that starts past `position[stream]` means events were lost:
 * `fill(stream, start, end)` (e.g. `(s, a, b) => sidecar.readLog(id, s, a, b)` on the
 * supervisor's machine) supplies the missing bytes, else it throws a CcsupError with code "gap".
 * A chunk already seen is ignored (only its new part counts).
 */
export class TurnOutput {
  constructor(id, { fill } = {}) {
    this.id = id;
    this.fill = fill;
    this.position = { stdout: 0, stderr: 0 };
  }

  feed({ topic, kind, body }) {
    if (!(kind in this.position) || topic !== `turn.${this.id}.${kind}`) return null;
    let bytes = outputBytes(body);
    const position = this.position[kind];
    if (body.offset > position) {
      const missing = this.fill ? this.fill(kind, position, body.offset) : null;
      if (!missing || missing.length !== body.offset - position) {
        throw new CcsupError(`turn ${this.id}: ${kind} bytes ${position} to ${body.offset} were lost on the bus`, "gap");
      }
      bytes = Buffer.concat([missing, bytes]);
    } else if (body.offset < position) {
      bytes = bytes.subarray(position - body.offset);
    }
    this.position[kind] += bytes.length;
    return { stream: kind, bytes };
  }
}

function readRange(path, start, end) {
  const fd = openSync(path, "r");
  try {
    const chunks = [];
    let at = start;
    for (;;) {
      const want = end === undefined ? 1 << 20 : Math.min(1 << 20, end - at);
      if (want <= 0) break;
      const buffer = Buffer.alloc(want);
      const n = readSync(fd, buffer, 0, want, at);
      if (n === 0) break;
      chunks.push(buffer.subarray(0, n));
      at += n;
    }
    return Buffer.concat(chunks);
  } finally {
    closeSync(fd);
  }
}
