// Helpers shared by the main page and the turn page. No framework, no build step.
"use strict";

const ccsup = {
  csrf() {
    return document.querySelector('meta[name="ccsup-csrf"]').content;
  },
  // An element with attributes and children (strings become text: nothing is parsed as HTML).
  el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (name === "class") node.className = value;
      else node.setAttribute(name, value === true ? "" : String(value));
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  },
  age(seconds) {
    if (seconds === null || seconds === undefined || !isFinite(seconds)) return "–";
    seconds = Math.max(0, seconds);
    if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
    if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s";
    return Math.floor(seconds / 3600) + " h " + Math.floor((seconds % 3600) / 60) + " min";
  },
  bytes(n) {
    if (n === null || n === undefined) return "–";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + " " + units[i];
  },
  clock(ts) {
    if (!ts) return "–";
    const d = new Date(ts * 1000);
    return d.toLocaleTimeString([], { hour12: false }) + "." + String(d.getMilliseconds()).padStart(3, "0");
  },
  who(session, agent) {
    if (!session && !agent) return "–";
    return [session || "–", agent || "–"].join(" / ");
  },
  // The server's clock minus ours, so ages are right even when the two disagree.
  skew: 0,
  now() { return Date.now() / 1000 + ccsup.skew; },
  setConnected(connected, text) {
    const node = document.getElementById("conn");
    node.dataset.connected = String(connected);
    node.textContent = text;
  },
  replaceRows(tbody, rows) {
    tbody.replaceChildren(...rows);
  },
};
