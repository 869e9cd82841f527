// The console's script: live figures and charts on the overview, the arriving events
// on the live view. Every value from an event is set as text (textContent), never as
// HTML: an event's fields are whatever a client sent.
"use strict";

const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2"];

function cell(text) {
  const td = document.createElement("td");
  td.textContent = text;
  return td;
}

function number(value) {
  return Math.round(value).toLocaleString("en");
}

function drawLines(canvas, series) {
  const context = canvas.getContext("2d");
  const { width, height } = canvas;
  context.clearRect(0, 0, width, height);
  const top = Math.max(1, ...series.flatMap((s) => s.values));
  series.forEach((s, index) => {
    context.strokeStyle = COLOURS[index % COLOURS.length];
    context.beginPath();
    s.values.forEach((value, i) => {
      const x = s.values.length > 1 ? (i / (s.values.length - 1)) * width : 0;
      const y = height - (value / top) * (height - 4) - 2;
      if (i === 0) context.moveTo(x, y); else context.lineTo(x, y);
    });
    context.stroke();
  });
  context.fillStyle = "#555";
  context.fillText(top.toLocaleString("en", { maximumFractionDigits: 2 }), 4, 12);
}

function overview(section) {
  const history = [];
  const rows = document.getElementById("destinations");
  const render = () => {
    const latest = history[history.length - 1];
    if (!latest) return;
    document.getElementById("sampled-at").textContent = "Last sample " + latest.at;
    rows.replaceChildren(...latest.destinations.map((d) => {
      const tr = document.createElement("tr");
      tr.dataset.destination = d.id;
      const lag = d.lag_seconds === null ? "-" : number(d.lag_seconds) + " s";
      [d.id, d.type, number(d.rate), number(d.loaded), d.backlog, lag, number(d.failed),
       d.last_load || "never"].forEach((text) => tr.appendChild(cell(text)));
      return tr;
    }));
    const ids = latest.destinations.map((d) => d.id);
    drawLines(document.getElementById("rates"), ids.map((id) => ({
      values: history.map((s) => (s.destinations.find((d) => d.id === id) || { rate: 0 }).rate),
    })));
    drawLines(document.getElementById("incoming"), [{
      values: history.map((s) => (s.incoming_bytes_per_second || 0) / 1e6),
    }]);
  };
  fetch(section.dataset.history, { credentials: "same-origin" })
    .then((answer) => answer.json())
    .then((body) => { history.push(...body.history); render(); })
    .catch(() => {});
  const stream = new EventSource(section.dataset.stream);
  stream.addEventListener("sample", (message) => {
    const sample = JSON.parse(message.data);
    const last = history[history.length - 1];
    if (!last || last.at !== sample.at) history.push(sample);
    if (history.length > 720) history.shift();
    render();
  });
}

function live(section) {
  const list = document.getElementById("events");
  const passed = document.getElementById("passed-over");
  let skipped = 0;
  const shown = new Map(); // event id -> its list item, for its form as received
  const stream = new EventSource(section.dataset.stream);
  stream.addEventListener("event", (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement("li");
    const summary = document.createElement("p");
    summary.className = "event-summary";
    const context = event.eventn_ctx || {};
    summary.textContent = [event.event_type, event.api_key, context.event_id, event._timestamp]
      .filter((part) => part !== undefined && part !== null).join(" · ");
    if (typeof context.event_id === "string" || typeof context.event_id === "number") {
      // Where it went, and how a destination would take it: its trace page.
      const link = document.createElement("a");
      link.href = "/trace?id=" + encodeURIComponent(String(context.event_id));
      link.textContent = "where is it?";
      link.className = "trace-link";
      summary.append(" · ", link);
    }
    const label = document.createElement("p");
    label.className = "form-label";
    label.textContent = "as enriched (stored)";
    const body = document.createElement("pre");
    body.textContent = JSON.stringify(event, null, 2);
    item.append(summary, label, body);
    list.prepend(item);
    if (typeof context.event_id === "string") shown.set(context.event_id, item);
    while (list.children.length > 200) {
      const gone = list.lastElementChild;
      for (const [id, each] of shown) if (each === gone) shown.delete(id);
      gone.remove();
    }
  });
  stream.addEventListener("received", (message) => {
    const sent = JSON.parse(message.data);
    const item = shown.get(sent.event_id);
    if (!item || item.querySelector(".received")) return;
    const label = document.createElement("p");
    label.className = "form-label";
    label.textContent = "as received";
    const body = document.createElement("pre");
    body.className = "received";
    body.textContent = JSON.stringify(sent.received, null, 2);
    item.append(label, body);
  });
  stream.addEventListener("passed_over", (message) => {
    skipped += JSON.parse(message.data).events;
    passed.textContent = number(skipped) + " event(s) not shown (sampled or filtered).";
  });
}

document.addEventListener("DOMContentLoaded", () => {
  const section = document.getElementById("overview");
  if (section) overview(section);
  const tail = document.getElementById("live");
  if (tail) live(tail);
});
