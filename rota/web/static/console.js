// The console's only script of its own (the Content-Security-Policy allows no
// inline script). Everything here is a nicety on top of plain forms and links:
// confirmations, ticking jobs, pausing the live refresh, the zone of the
// absolute times shown on hover, and the charts' readouts.
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
  if (livePaused() || ticked().length > 0 || typing || document.querySelector("svg.plot.reading")) {
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

// Chart readouts. The server gives each chart a column per point (rect.hover,
// with its time and each line's value and height) and the lines' names on the
// svg; the pointer or the arrow keys pick a column, and the tooltip, the markers
// and the status line (read by screen readers) show it. The live refresh waits
// while a chart is being read (see htmx:beforeRequest above).
function pointTime(column) {
  if (store.get("rota-zone", "utc") === "utc") return column.dataset.when;
  return new Date(column.dataset.at).toLocaleString(undefined, {
    weekday: "short", day: "numeric", month: "short", hour: "2-digit", minute: "2-digit",
    timeZoneName: "short",
  });
}
function chartColumns(svg) {
  return Array.from(svg.querySelectorAll("rect.hover"));
}
function placeMarkers(svg, x, values) {
  const cursor = svg.querySelector(".marker .cursor");
  cursor.setAttribute("x1", x);
  cursor.setAttribute("x2", x);
  svg.querySelectorAll(".marker .dot").forEach((dot, i) => {
    const value = values[i];
    dot.setAttribute("visibility", value ? "visible" : "hidden");
    if (value) {
      dot.setAttribute("cx", x);
      dot.setAttribute("cy", value[1]);
    }
  });
}
function fillTip(tip, when, lines, values) {
  const head = document.createElement("span");
  head.className = "when";
  head.textContent = when;
  const rows = [];
  lines.forEach(([name], i) => {
    if (!values[i]) return;
    const row = document.createElement("span");
    row.className = "row";
    const label = document.createElement("span");
    label.className = "name";
    const key = document.createElement("span");
    key.className = "key k" + (i + 1);
    label.append(key, name);
    const value = document.createElement("span");
    value.className = "value";
    value.textContent = values[i][0];
    row.append(label, value);
    rows.push(row);
  });
  tip.replaceChildren(head, ...rows);
}
function placeTip(svg, tip, x) {
  const figure = svg.closest("figure");
  const box = figure.getBoundingClientRect();
  const plot = svg.getBoundingClientRect();
  const scale = plot.width / svg.viewBox.baseVal.width;
  const at = plot.left - box.left + x * scale;
  const gap = 14;
  const right = at + gap + tip.offsetWidth <= box.width;
  tip.style.left = Math.max(0, right ? at + gap : at - gap - tip.offsetWidth) + "px";
  tip.style.top = (plot.top - box.top + 6) + "px";
}
function showPoint(svg, index) {
  const columns = chartColumns(svg);
  const column = columns[Math.max(0, Math.min(columns.length - 1, index))];
  if (!column) return;
  const figure = svg.closest("figure");
  const tip = figure.querySelector(".chart-tip");
  const status = figure.querySelector("[role=status]");
  const lines = JSON.parse(svg.dataset.lines || "[]");
  const values = JSON.parse(column.dataset.values || "[]");
  const x = Number(column.getAttribute("x")) + Number(column.getAttribute("width")) / 2;
  const when = pointTime(column);
  svg.dataset.point = String(columns.indexOf(column));
  svg.classList.add("reading");
  placeMarkers(svg, x, values);
  fillTip(tip, when, lines, values);
  tip.hidden = false;
  placeTip(svg, tip, x);
  const said = lines.flatMap(([name], i) => (values[i] ? [name + " " + values[i][0]] : []));
  status.textContent = when + ": " + said.join(", ");
}
function hidePoint(svg) {
  svg.classList.remove("reading");
  delete svg.dataset.point;
  const tip = svg.closest("figure").querySelector(".chart-tip");
  if (tip) tip.hidden = true;
}
function pointAt(event) {
  const column = event.target.closest && event.target.closest("svg.plot rect.hover");
  if (!column) return;
  const svg = column.closest("svg.plot");
  const index = chartColumns(svg).indexOf(column);
  if (svg.classList.contains("reading") && svg.dataset.point === String(index)) return;
  showPoint(svg, index);
}
document.addEventListener("pointermove", pointAt);
document.addEventListener("pointerdown", (event) => {
  document.querySelectorAll("svg.plot.reading").forEach((svg) => {
    if (!svg.contains(event.target)) hidePoint(svg);
  });
  pointAt(event);
});
document.addEventListener("pointerout", (event) => {
  const svg = event.target.closest && event.target.closest("svg.plot");
  if (!svg || event.pointerType === "touch" || svg.contains(event.relatedTarget)) return;
  if (!svg.matches(":focus-visible")) hidePoint(svg);
});
document.addEventListener("focusin", (event) => {
  const svg = event.target;
  if (svg.matches && svg.matches("svg.plot:focus-visible")) {
    showPoint(svg, chartColumns(svg).length - 1);  // the latest point first
  }
});
document.addEventListener("focusout", (event) => {
  if (event.target.matches && event.target.matches("svg.plot")) hidePoint(event.target);
});
document.addEventListener("keydown", (event) => {
  const svg = event.target;
  if (!svg.matches || !svg.matches("svg.plot")) return;
  const last = chartColumns(svg).length - 1;
  const now = svg.dataset.point ? Number(svg.dataset.point) : last;
  const moves = {
    ArrowLeft: now - 1, ArrowRight: now + 1, PageUp: now - 10, PageDown: now + 10,
    Home: 0, End: last,
  };
  if (event.key in moves) {
    event.preventDefault();
    showPoint(svg, moves[event.key]);
  } else if (event.key === "Escape") {
    hidePoint(svg);
  }
});

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
