// A turn's page: facts, usage, events and its output following live; a cancel button.
"use strict";

(function () {
  const { el, clock, age, who } = ccsup;
  const turnId = decodeURIComponent(location.pathname.split("/").pop());
  document.getElementById("turn-id").textContent = turnId;
  document.title = "ccsup turn " + turnId;
  let turn = null;
  const TAIL = 1 << 20; // bytes of output a page shows; the log file has all of it

  function fact(name, value) {
    return [el("dt", {}, name), el("dd", { "data-fact": name }, value)];
  }

  function render() {
    if (!turn) {
      document.getElementById("facts").replaceChildren(...fact("state", "not seen by this page, and not running"));
      document.getElementById("cancel").disabled = true;
      return;
    }
    const b = turn.bar || {};
    const state = turn.active ? (b.outcome || "active") : (b.outcome || "ended");
    const exit = turn.exit || {};
    document.getElementById("facts").replaceChildren(
      ...fact("state", state),
      ...fact("key", turn.key || "–"),
      ...fact("holder", who(b.session, b.agent)),
      ...fact("queued", clock(b.queued_at)),
      ...fact("granted", b.granted_at ? clock(b.granted_at) + " (waited " + age(b.granted_at - b.queued_at) + ")" : "–"),
      ...fact("ended", b.ended_at ? clock(b.ended_at) : "–"),
      ...(b.adopted_at ? fact("adopted", clock(b.adopted_at) + (typeof b.adoption_gap_s === "number"
        ? " after a gap of " + b.adoption_gap_s.toFixed(1) + " s" : "")) : []),
      ...fact("exit", turn.exit ? (exit.code !== null && exit.code !== undefined ? "code " + exit.code : "") +
        (exit.signal ? " signal " + exit.signal : "") + (exit.reason ? " (" + exit.reason + (exit.error ? ": " + exit.error : "") + ")" : "") : "–"));
    document.getElementById("cancel").disabled = !turn.active;
    const usage = turn.usage || {};
    const rows = Object.keys(usage).sort().map((k) => el("tr", {}, el("th", {}, k.replaceAll("_", " ")),
      el("td", { class: "n" }, typeof usage[k] === "number" ? String(Math.round(usage[k] * 1000) / 1000) : JSON.stringify(usage[k]))));
    document.querySelector("#usage tbody").replaceChildren(...rows);
    document.getElementById("usage-empty").hidden = rows.length > 0;
    const events = turn.events.map((e) => {
      const details = Object.entries(e.body).filter(([k]) => !["id", "key", "seq", "epoch"].includes(k))
        .map(([k, v]) => k + "=" + (v && typeof v === "object" ? JSON.stringify(v, (_, x) => (x === null ? undefined : x)) : v))
        .join(" ");
      return el("tr", { "data-topic": e.topic }, el("td", { class: "mono" }, clock(e.ts)),
        el("td", {}, e.topic.split(".").pop()), el("td", { class: "mono details" }, details));
    });
    document.querySelector("#events tbody").replaceChildren(...events);
    const left = turn.leftovers || { count: 0, names: [] };
    const leftRows = left.names.map((n) => el("tr", {}, el("td", {}, n.name || "?"),
      el("td", { class: "n" }, n.pid), el("td", { class: "n" }, n.pgid),
      el("td", { class: "n" }, typeof n.ran_s === "number" ? age(n.ran_s) : "–"),
      el("td", { class: "mono" }, n.command || "")));
    if (left.count > left.names.length) {
      leftRows.push(el("tr", {}, el("td", { colspan: 5, class: "muted" }, "and " + (left.count - left.names.length) + " more, not named")));
    }
    document.querySelector("#leftovers tbody").replaceChildren(...leftRows);
    document.getElementById("leftovers-count").textContent = left.count ? "(" + left.count + ")" : "";
    document.getElementById("leftovers-empty").hidden = leftRows.length > 0;
  }

  function follow(stream) {
    const pre = document.getElementById(stream);
    const status = document.getElementById(stream + "-state");
    const source = new EventSource(`/api/turn/${encodeURIComponent(turnId)}/output?stream=${stream}&tail=${TAIL}`);
    // A reconnect starts again from the first byte: start the text again too.
    source.onopen = () => { pre.textContent = ""; status.textContent = "following…"; };
    source.addEventListener("skipped", (ev) => {
      status.textContent = `following… (the first ${JSON.parse(ev.data).bytes} bytes are only in the log file)`;
    });
    source.addEventListener("chunk", (ev) => {
      const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.append(JSON.parse(ev.data).text);
      if (pre.textContent.length > 2 * TAIL) {
        pre.textContent = pre.textContent.slice(-TAIL); // a page holds the last part of a long run
        pre.dataset.trimmed = "true";
      }
      if (atBottom) pre.scrollTop = pre.scrollHeight;
    });
    source.addEventListener("end", (ev) => {
      source.close();
      const end = JSON.parse(ev.data);
      pre.dataset.complete = "true";
      if (end.missing) { status.textContent = "(no log file: pruned, or never written)"; return; }
      status.textContent = "(" + end.bytes + " bytes" +
        (pre.dataset.trimmed || status.textContent.includes("log file") ? ", the last part shown" : ", complete") + ")";
    });
  }

  document.getElementById("cancel").addEventListener("click", async () => {
    const button = document.getElementById("cancel");
    const result = document.getElementById("cancel-result");
    button.disabled = true;
    result.textContent = "cancelling…";
    try {
      const response = await fetch(`/api/turn/${encodeURIComponent(turnId)}/cancel`, {
        method: "POST", headers: { "X-Ccsup-Csrf": ccsup.csrf() }, credentials: "same-origin",
      });
      const body = await response.json();
      result.textContent = response.ok ? "cancel sent" : "cancel refused: " + body.error;
    } catch (err) {
      result.textContent = "cancel failed: " + err;
    }
  });

  const events = new EventSource("/api/events?turn=" + encodeURIComponent(turnId));
  events.addEventListener("state", (ev) => {
    const s = JSON.parse(ev.data);
    ccsup.skew = s.now - Date.now() / 1000;
    ccsup.setConnected(s.connected, s.connected ? "live" : "not connected: " + (s.error || "?"));
  });
  events.addEventListener("turn", (ev) => { turn = JSON.parse(ev.data); render(); });
  events.onerror = () => ccsup.setConnected(false, "reconnecting…");
  follow("stdout");
  follow("stderr");
})();
