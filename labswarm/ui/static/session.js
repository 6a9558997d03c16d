// Session page: follows GET /sessions/{id}/events (one snapshot a second) into the figure and the numbers.
"use strict";
(() => {
  const root = document.getElementById("session");
  const id = root.dataset.sessionId;
  const figure = document.getElementById("figure");
  const ACTIVE = new Set(["running", "paused"]);
  const MAX_POINTS = 3600; // an hour of snapshots
  // columns: time (Unix s), depth, publish rate, consume rate, rate asked
  const data = [[], [], [], [], []];
  const axisStyle = { stroke: "#667085", grid: { stroke: "#eef0f4" } };
  const depthPlot = LS.chart(document.getElementById("depth-chart"), {
    title: "queue depth (samples published without an outcome yet)",
    legend: { live: false },
    series: [{}, { label: "depth", stroke: "#7c3aed", width: 2, fill: "rgba(124,58,237,0.08)" }],
    axes: [axisStyle, { ...axisStyle, label: "samples" }],
  }, [data[0], data[1]]);
  const ratePlot = LS.chart(document.getElementById("rate-chart"), {
    title: "publish vs consume rate",
    legend: { live: false },
    series: [{},
      { label: "publish /s", stroke: "#2563eb", width: 2 },
      { label: "consume /s", stroke: "#16a34a", width: 2 },
      { label: "asked /s", stroke: "#94a3b8", width: 1, dash: [6, 4] }],
    axes: [axisStyle, { ...axisStyle, label: "samples/s" }],
  }, [data[0], data[2], data[3], data[4]]);
  let failed = Number(document.getElementById("v-failed").textContent) || 0;

  function show(p) {
    const badge = document.getElementById("status");
    badge.textContent = p.status;
    badge.className = "status " + p.status;
    const progress = document.getElementById("progress");
    progress.max = p.total || 1;
    progress.value = p.finished;
    LS.setText("progress-text", `${p.finished} / ${p.total}`);
    for (const key of ["total", "published", "done", "cached", "failed", "depth"]) LS.setText("v-" + key, p[key]);
    LS.setText("v-publish", LS.num(p.publish_rate));
    LS.setText("v-consume", LS.num(p.consume_rate));
    LS.setText("v-rate", LS.num(p.rate));
    LS.setText("v-weight", p.weight);
    LS.setText("v-phase", p.phase || "–");
    const error = document.getElementById("error");
    error.textContent = p.error || "";
    error.hidden = !p.error;
    for (const button of document.querySelectorAll("#controls button")) {
      const action = button.dataset.action;
      const allowed = !ACTIVE.has(p.status) ? false
        : action === "pause" ? p.status === "running" : action === "resume" ? p.status === "paused" : true;
      if (action || !ACTIVE.has(p.status)) button.disabled = !allowed;
    }
  }

  function plot(p) {
    const row = [p.time, p.depth, p.publish_rate, p.consume_rate, p.rate];
    row.forEach((value, i) => data[i].push(value));
    if (data[0].length > MAX_POINTS) data.forEach((column) => column.shift());
    depthPlot.setData([data[0], data[1]]);
    ratePlot.setData([data[0], data[2], data[3], data[4]]);
    figure.dataset.points = String(data[0].length);
  }

  async function loadFailures() {
    try {
      const rows = await LS.call("GET", `/sessions/${id}/failures?limit=100`);
      const body = document.querySelector("#failures tbody");
      body.replaceChildren();
      for (const f of rows) {
        const tr = body.insertRow();
        LS.cell(tr, f.sample_id, "mono small");
        LS.cell(tr, f.reason);
        LS.cell(tr, f.attempts, "n");
      }
      if (!rows.length) LS.cell(body.insertRow(), "no failure", "small").colSpan = 3;
      LS.setText("failures-count", `(${failed})`);
    } catch (error) {
      LS.say(error.message);
    }
  }

  const stream = new EventSource(`${LS.api}/sessions/${id}/events`, { withCredentials: true });
  stream.addEventListener("progress", (event) => {
    const p = JSON.parse(event.data);
    show(p);
    plot(p);
    if (p.failed !== failed) {
      failed = p.failed;
      loadFailures();
    }
  });
  stream.addEventListener("end", () => stream.close());

  // workers (the launcher's) and consumers (the broker's): not in the stream; asked every 3 s while active
  const SEEN_MS = 3000;
  async function seen() {
    try {
      const response = await fetch(root.dataset.seen, { credentials: "same-origin" });
      if (response.ok) {
        const s = await response.json();
        LS.setText("v-workers", s.workers ?? "–");
        LS.setText("v-consumers", s.consumers ?? "n/a");
      }
    } catch (error) {
      LS.say("the manager does not answer: " + error.message);
    }
    if (stream.readyState !== EventSource.CLOSED) setTimeout(seen, SEEN_MS);
  }
  setTimeout(seen, SEEN_MS);
  stream.onerror = () => {
    if (stream.readyState === EventSource.CLOSED) LS.say("the live stream closed: reload the page");
  };

  async function act(method, path, body, what) {
    try {
      const p = await LS.call(method, `/sessions/${id}/${path}`, body);
      LS.say(what + " done", true);
      if (p && p.status) show({ ...p, depth: p.pending, publish_rate: null, consume_rate: null });
    } catch (error) {
      LS.say(error.message);
    }
  }
  for (const button of document.querySelectorAll("#controls button[data-action]")) {
    button.addEventListener("click", () => {
      const action = button.dataset.action;
      if (action === "cancel" && !window.confirm(`Cancel session ${id}? Its queue is purged.`)) return;
      act("POST", action, undefined, action);
    });
  }
  for (const form of document.querySelectorAll("#controls form[data-put]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const field = form.dataset.put;
      const value = Number(new FormData(form).get(field));
      act("PUT", field, { [field]: value }, `${field} ${value}`);
    });
  }
})();
