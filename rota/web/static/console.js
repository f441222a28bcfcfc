// The console's only script of its own (the Content-Security-Policy allows no
// inline script). Everything here is a nicety on top of plain forms and links:
// confirmations, ticking jobs, pausing the live refresh, and the zone of the
// absolute times shown on hover.
"use strict";

const store = {
  get(key, fallback) {
    try { return window.localStorage.getItem(key) || fallback; } catch (e) { return fallback; }
  },
  set(key, value) {
    try { window.localStorage.setItem(key, value); } catch (e) { /* private mode */ }
  },
};

// Ask before a form (or the button that sends it) marked data-confirm is sent.
document.addEventListener("submit", (event) => {
  const button = event.submitter;
  const message = (button && button.dataset.confirm) || event.target.dataset.confirm;
  if (message && !window.confirm(message)) {
    event.preventDefault();
  }
});

// Ticking jobs: a box in the head ticks every row; the action bar counts them.
function ticked() {
  return document.querySelectorAll("input[type=checkbox][name=id]:checked");
}
function countTicked() {
  const out = document.getElementById("ticked");
  if (out) out.textContent = String(ticked().length);
  document.body.classList.toggle("has-ticked", ticked().length > 0);
}
document.addEventListener("change", (event) => {
  const box = event.target;
  if (box.matches && box.matches("[data-tick-all]")) {
    document.querySelectorAll("input[type=checkbox][name=id]").forEach((b) => { b.checked = box.checked; });
  }
  countTicked();
});

// The live refresh (htmx polling of [data-live]): paused by the header's
// button (remembered), while jobs are ticked, and while a field is being typed in.
function livePaused() {
  return store.get("rota-live", "on") === "off";
}
function showLive() {
  const button = document.getElementById("live-toggle");
  if (!button) return;
  const paused = livePaused();
  button.textContent = paused ? "live: paused" : "live: on";
  button.setAttribute("aria-pressed", paused ? "true" : "false");
  document.body.classList.toggle("live-paused", paused);
}
document.addEventListener("htmx:beforeRequest", (event) => {
  const source = event.detail && event.detail.elt;
  if (!source || !source.hasAttribute || !source.hasAttribute("data-live")) return;
  const field = document.activeElement;
  const typing = field && field.matches
    && field.matches("input:not([type=checkbox]):not([type=submit]), select, textarea");
  if (livePaused() || ticked().length > 0 || typing) {
    event.preventDefault();
  }
});

// Absolute times on hover: in UTC (the page's own) or in the viewer's zone.
function showZone() {
  const zone = store.get("rota-zone", "utc");
  const button = document.getElementById("zone-toggle");
  if (button) button.textContent = zone === "utc" ? "times: UTC" : "times: local";
  document.querySelectorAll("time[datetime]").forEach((t) => {
    const at = new Date(t.getAttribute("datetime"));
    if (Number.isNaN(at.getTime())) return;
    if (zone === "utc") {
      t.title = at.toISOString().replace("T", " ").slice(0, 19) + " UTC";
    } else {
      t.title = at.toLocaleString(undefined, { timeZoneName: "short" });
    }
  });
}

document.addEventListener("click", (event) => {
  if (event.target.id === "live-toggle") {
    store.set("rota-live", livePaused() ? "on" : "off");
    showLive();
  } else if (event.target.id === "zone-toggle") {
    store.set("rota-zone", store.get("rota-zone", "utc") === "utc" ? "local" : "utc");
    showZone();
  }
});
document.addEventListener("htmx:afterSettle", () => { showZone(); countTicked(); });
document.addEventListener("DOMContentLoaded", () => { showLive(); showZone(); countTicked(); });
