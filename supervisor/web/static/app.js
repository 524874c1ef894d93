// The main page: keys, holders, queue and the timeline, live from /api/events.
"use strict";

(function () {
  const { el, age, bytes, who, clock } = ccsup;
  const bars = new Map(); // turn id -> bar
  const MAX_LANES = 12; // sub-lanes of one key's timeline row; more overlapping bars share the last
  const MAX_ROWS = 300; // rows of the queue and holders tables; the rest is counted
  let state = null;
  const OFFLINE = "not connected: no supervisor to ask";

  function slotCells(k) {
    const cells = [];
    const add = (n, cls) => { for (let i = 0; i < n; i++) cells.push(el("span", { class: "cell " + cls })); };
    add(k.held, "held"); add(k.reserved, "reserved"); add(k.orphaned, "orphaned"); add(k.unreadable, "unreadable");
    add(Math.max(0, k.cap - k.held - k.reserved - k.orphaned - k.unreadable), "free");
    return el("span", { class: "cells", title: `${k.held + k.reserved + k.orphaned + k.unreadable} of ${k.cap} taken` }, ...cells);
  }

  function rateText(k) {
    const wait = k.next_grant ? k.next_grant - ccsup.now() : 0;
    const next = wait > 0 ? "next start in " + age(wait) : "";
    const quota = (k.quota || []).map((w) => "quota " + w.window + " " + Math.round(w.used * 100) + "% until " + clock(w.resets_at));
    return [k.rate, next, ...quota].filter(Boolean).join(", ");
  }

  function renderKeys() {
    const rows = state.keys.map((k) => {
      const full = k.held + k.reserved + k.orphaned + k.unreadable >= k.cap && k.cap > 0;
      const paused = k.paused_until ? "until " + clock(k.paused_until) + (k.paused_reason ? " (" + k.paused_reason + ")" : "") : "";
      return el("tr", { "data-key": k.key, class: full ? "full" : "" },
        el("td", { class: "key" }, k.key, full ? el("span", { class: "badge" }, "full") : null),
        el("td", {}, slotCells(k)),
        el("td", { class: "n" }, k.cap),
        el("td", { class: "n", "data-field": "held" }, k.held),
        el("td", { class: "n" }, k.reserved),
        el("td", { class: "n" + (k.orphaned ? " warn" : "") }, k.orphaned),
        el("td", { class: "n", "data-field": "waiting" }, k.waiting),
        el("td", { class: "pause " + (paused ? "paused" : "muted") }, paused || "–"),
        el("td", { class: "rate muted" }, rateText(k) || "–"),
        el("td", { class: "actions" },
          el("button", { class: "pause-key", disabled: !state.connected, title: state.connected ? "grant nothing of " + k.key + " for a while" : OFFLINE }, "pause"),
          paused ? el("button", { class: "resume-key", disabled: !state.connected, title: state.connected ? "end the pause of " + k.key : OFFLINE }, "resume") : null));
    });
    ccsup.replaceRows(document.querySelector("#keys tbody"), rows);
    // Pauses and start rates show only where the supervisor has them.
    const table = document.getElementById("keys");
    table.classList.toggle("no-pauses", !state.keys.some((k) => k.paused_until));
    table.classList.toggle("no-rates", !state.keys.some((k) => rateText(k)));
    document.getElementById("keys-empty").hidden = rows.length > 0;
  }

  function turnLink(id) {
    // Ids are often 32 hex digits: the first 12 tell them apart on one page; the title has all.
    return id ? el("a", { href: "/turn/" + encodeURIComponent(id), title: id }, id.length > 14 ? id.slice(0, 12) + "…" : id) : "–";
  }

  // The whole command and its directory on hover; the cell itself is cut to the column (CSS).
  function commandTitle(t) {
    return t.command ? t.command + (t.cwd ? "\nin " + t.cwd : "") : "";
  }

  // A turn a supervisor took over from one that was gone: it ran on through the gap.
  function adoptedBadge(h) {
    if (!h.adopted_at) return null;
    const gap = h.adoption_gap_s === null || h.adoption_gap_s === undefined ? "" : ` after a gap of ${h.adoption_gap_s.toFixed(1)} s`;
    return el("span", { class: "badge adopted", title: `adopted at ${clock(h.adopted_at)}${gap}` }, "adopted");
  }

  function renderHolders() {
    const now = ccsup.now();
    const rows = state.holders.slice(0, MAX_ROWS).map((h) => el("tr", { "data-turn": h.turn || "", "data-key": h.key },
      el("td", {}, `${h.key}[${h.index}]`),
      el("td", { class: "state-" + h.state }, h.state),
      el("td", { class: "mono" }, turnLink(h.turn), adoptedBadge(h)),
      el("td", {}, who(h.session, h.agent)),
      el("td", { title: clock(h.since) }, h.since ? age(now - h.since) : "–"),
      el("td", { class: "n" }, h.cpu_seconds === null ? "–" : h.cpu_seconds.toFixed(2) + " s"),
      el("td", { class: "n" }, bytes(h.rss_bytes)),
      el("td", { class: "mono command", title: commandTitle(h) }, h.command || "–")));
    if (state.holders.length > MAX_ROWS) {
      rows.push(el("tr", {}, el("td", { colspan: 8, class: "muted" }, `and ${state.holders.length - MAX_ROWS} more`)));
    }
    ccsup.replaceRows(document.querySelector("#holders tbody"), rows);
    document.getElementById("holders-empty").hidden = rows.length > 0;
  }

  function renderQueue() {
    const now = ccsup.now();
    const rows = state.waits.slice(0, MAX_ROWS).map((w) => el("tr", { "data-turn": w.id, "data-key": w.key },
      el("td", {}, w.key),
      el("td", { class: "n" }, w.position === null ? "–" : w.position),
      el("td", { class: "mono" }, turnLink(w.id), w.reservation ? el("span", { class: "badge" }, "reservation") : null),
      el("td", {}, who(w.session, w.agent)),
      el("td", { title: "since " + clock(w.since) }, w.since ? age(now - w.since) : "–"),
      el("td", { class: "why muted", title: w.why || "" }, w.why_word || w.why || ""),
      el("td", { class: "mono command", title: commandTitle(w) }, w.command || "–")));
    if (state.waits.length > MAX_ROWS) {
      rows.push(el("tr", {}, el("td", { colspan: 7, class: "muted" }, `and ${state.waits.length - MAX_ROWS} more waiting`)));
    }
    ccsup.replaceRows(document.querySelector("#queue tbody"), rows);
    document.getElementById("queue").classList.toggle("no-why", !state.waits.some((w) => w.why));
    document.getElementById("queue-empty").hidden = rows.length > 0;
  }

  // Pause and resume a key: a POST through the supervisor's own checks (its answer is shown).
  async function keyAction(key, action, body) {
    const note = document.getElementById("keys-result");
    note.textContent = action + " " + key + "…";
    try {
      const response = await fetch(`/api/key/${encodeURIComponent(key)}/${action}`, {
        method: "POST", credentials: "same-origin",
        headers: { "X-Ccsup-Csrf": ccsup.csrf(), "Content-Type": "application/json" },
        body: JSON.stringify(body || {}),
      });
      const answer = await response.json();
      note.textContent = response.ok
        ? (action === "pause" ? `${key} paused until ${clock(answer.until)}` : `${key} resumed`)
        : `${action} refused: ${answer.error}`;
    } catch (err) {
      note.textContent = `${action} failed: ${err}`;
    }
  }

  document.querySelector("#keys tbody").addEventListener("click", (ev) => {
    const row = ev.target.closest("tr[data-key]");
    if (!row) return;
    const key = row.getAttribute("data-key");
    if (ev.target.classList.contains("pause-key")) {
      const span = window.prompt(`Pause ${key} for how long? (90s, 15m, 1h)`, "10m");
      if (span) keyAction(key, "pause", { for: span });
    } else if (ev.target.classList.contains("resume-key")) {
      keyAction(key, "resume");
    }
  });

  function renderHeader() {
    const s = state.supervisor || {};
    ccsup.setConnected(state.connected, state.connected ? "live" : "not connected: " + (state.error || "?"));
    // Without a supervisor, the keys, holders and queue are the last ones seen, not live: greyed,
    // said so, and nothing on them can be asked of anyone.
    document.body.classList.toggle("stale", !state.connected);
    for (const id of ["keys-stale", "holders-stale", "queue-stale"]) {
      const note = document.getElementById(id);
      note.hidden = state.connected;
      note.textContent = state.connected ? "" : `not live since ${clock(state.updated_at)}: as last seen`;
    }
    document.getElementById("sup").textContent = s.pid
      ? `supervisor ${s.pid} on ${s.state_dir} · ${s.turns} running · ${s.waits} waiting${s.stopping ? " · stopping" : ""}${memoryText(s.memory)}`
      : "";
  }

  // [memory]: what the running turns are predicted to use of the budget, and the pressure brake.
  function memoryText(m) {
    if (!m) return "";
    const budget = m.budget === null || m.budget === undefined ? "no budget" : `budget ${m.budget === "auto" ? "auto" : bytes(m.budget)}`;
    const pressure = m.avg10 === null || m.avg10 === undefined ? "" : ` · pressure ${(m.avg10 * 100).toFixed(2)}%${m.pressured ? " (nothing granted)" : ""}`;
    return ` · memory: ${bytes(m.predicted)} predicted, ${budget}${pressure}`;
  }

  // One row per key, one bar per turn: the light part is the wait, the solid part the run.
  function renderTimeline() {
    const span = Number(document.getElementById("window").value);
    const now = ccsup.now();
    const start = now - span;
    const pct = (t) => Math.max(0, Math.min(100, ((t - start) / span) * 100));
    const byKey = new Map();
    for (const b of bars.values()) {
      const end = b.ended_at || now;
      if (end < start) continue;
      if (!byKey.has(b.key)) byKey.set(b.key, []);
      byKey.get(b.key).push(b);
    }
    const rows = [];
    for (const key of [...byKey.keys()].sort()) {
      const lane = el("div", { class: "lane" });
      const ends = []; // per sub-lane, where its last bar ends: overlapping turns stack
      let crowded = 0; // bars drawn over others in the last sub-lane
      const startOf = (b) => b.queued_at || b.granted_at || b.ended_at || now;
      for (const b of byKey.get(key).sort((x, y) => startOf(x) - startOf(y))) {
        const q = startOf(b);
        const g = b.granted_at;
        const e = b.ended_at || now;
        let sub = ends.findIndex((end) => end <= q);
        if (sub < 0 && ends.length < MAX_LANES) { sub = ends.length; ends.push(e); }
        else if (sub < 0) { sub = MAX_LANES - 1; ends[sub] = Math.max(ends[sub], e); crowded++; }
        else ends[sub] = e;
        const title = `${b.id} (${who(b.session, b.agent)})\nqueued ${clock(b.queued_at)}` +
          (g ? `\ngranted ${clock(g)} after ${age(g - q)}` : "") +
          (b.ended_at ? `\n${b.outcome} ${clock(b.ended_at)}` + (g ? ` after ${age(b.ended_at - g)} running` : "") : "\nstill " + b.outcome) +
          (b.exit_code !== null ? `\nexit code ${b.exit_code}` : "");
        const failed = b.exit_code !== null && b.exit_code !== 0;
        const bar = el("a", { class: "bar " + b.outcome + (failed ? " failed" : ""), href: "/turn/" + encodeURIComponent(b.id), title,
          "data-turn": b.id, "data-outcome": b.outcome });
        bar.style.left = pct(q) + "%";
        bar.style.top = 3 + sub * 18 + "px";
        bar.style.width = Math.max(0, pct(e) - pct(q)) + "%";
        if (g) {
          const waited = el("span", { class: "waited" });
          waited.style.width = (e > q ? ((Math.min(g, e) - q) / (e - q)) * 100 : 0) + "%";
          bar.append(waited);
        } else {
          bar.classList.add("never-granted");
        }
        lane.append(bar);
      }
      lane.style.height = 6 + ends.length * 18 + "px";
      rows.push(el("div", { class: "timeline-row", "data-key": key },
        el("div", { class: "lane-key" }, key, crowded ? el("div", { class: "muted" }, `+${crowded} overlapping`) : null), lane));
    }
    const axis = el("div", { class: "timeline-row axis" }, el("div", { class: "lane-key" }, ""),
      el("div", { class: "lane ticks" }, ...[0, 0.25, 0.5, 0.75, 1].map((f) => {
        const t = el("span", { class: "tick" }, f === 1 ? "now" : "−" + age(span * (1 - f)));
        t.style.left = f * 100 + "%";
        return t;
      })));
    document.getElementById("timeline").replaceChildren(...rows, ...(rows.length ? [axis] : []));
    document.getElementById("timeline-empty").hidden = rows.length > 0;
  }

  function render() {
    if (!state) return;
    renderHeader(); renderKeys(); renderHolders(); renderQueue(); renderTimeline();
  }

  function connect() {
    const source = new EventSource("/api/events");
    source.addEventListener("state", (ev) => {
      state = JSON.parse(ev.data);
      ccsup.skew = state.now - Date.now() / 1000;
      render();
    });
    source.addEventListener("bars", (ev) => {
      const data = JSON.parse(ev.data);
      if (data.full) bars.clear();
      for (const b of data.bars) bars.set(b.id, b);
      const horizon = ccsup.now() - 3600;
      for (const [id, b] of bars) if (b.ended_at && b.ended_at < horizon) bars.delete(id);
      renderTimeline();
    });
    source.onerror = () => ccsup.setConnected(false, "reconnecting…");
  }

  document.getElementById("window").addEventListener("change", renderTimeline);
  setInterval(render, 1000); // ages and running bars move even when nothing happens
  connect();
})();
