// Session page: follows GET /sessions/{id}/events into the figure and the numbers. The stream's first event
// ("series") is the session's history kept by the manager (from its start; spaced further apart as it ages),
// drawn whole whether the session is live or over; the snapshots that follow (one a second) extend it live.
"use strict";
(() => {
  const root = document.getElementById("session");
  const id = root.dataset.sessionId;
  const figure = document.getElementById("figure");
  const ACTIVE = new Set(["running", "paused"]);
  const MAX_POINTS = 4000; // beyond, every other point of the history is dropped (the first and last kept)
  // columns: time (Unix s), depth, publish rate, consume rate, rate asked
  const data = [[], [], [], [], []];
  // what the depth figure drew, for people and tests: its points and the time span of its axis (s)
  function drawn(u) {
    const x = u.scales.x;
    figure.dataset.points = String(u.data[0].length);
    figure.dataset.span = String(x.max != null && x.min != null ? x.max - x.min : 0);
    figure.dataset.from = String(x.min ?? "");
    figure.dataset.to = String(x.max ?? "");
  }
  const axisStyle = { stroke: "#667085", grid: { stroke: "#eef0f4" } };
  // a lone point gets a minute around it, never uPlot's default span (years on a time axis)
  const scales = { x: { time: true, range: (u, min, max) => (min === max ? [min - 30, max + 30] : [min, max]) } };
  const depthPlot = LS.chart(document.getElementById("depth-chart"), {
    title: "queue depth (samples published without an outcome yet)",
    legend: { live: false },
    scales,
    hooks: { draw: [drawn] },
    series: [{}, { label: "depth", stroke: "#7c3aed", width: 2, fill: "rgba(124,58,237,0.08)" }],
    axes: [axisStyle, { ...axisStyle, label: "samples" }],
  }, [data[0], data[1]]);
  const ratePlot = LS.chart(document.getElementById("rate-chart"), {
    title: "publish vs consume rate (each point: the last 5 s, or the mean since the point before when further apart)",
    legend: { live: false },
    scales,
    series: [{},
      { label: "publish /s", stroke: "#2563eb", width: 2, spanGaps: true },
      { label: "consume /s", stroke: "#16a34a", width: 2, spanGaps: true },
      { label: "asked /s", stroke: "#94a3b8", width: 1, dash: [6, 4], spanGaps: true }],
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
    if (p.samples_per_s !== undefined) LS.setText("v-done-rate", LS.num(p.samples_per_s));
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

  function draw() {
    depthPlot.setData([data[0], data[1]]);
    ratePlot.setData([data[0], data[2], data[3], data[4]]);
  }

  function thin() { // keep every other point, the first and the last: the whole history stays, coarser
    const keep = data[0].map((_, i) => i % 2 === 0 || i === data[0].length - 1);
    for (let c = 0; c < data.length; c++) data[c] = data[c].filter((_, i) => keep[i]);
  }

  function history(body) {
    const note = document.getElementById("series-note");
    for (let c = 0; c < data.length; c++) data[c] = [];
    for (const p of body.points) {
      [p.time, p.depth, p.publish_rate, p.consume_rate, p.asked_rate].forEach((value, i) => data[i].push(value));
    }
    note.textContent = `history kept by the manager: ${body.points.length} points from the start, ` +
      `one every ${body.step_s} s now (at most ${body.max_points}: spaced further apart as the session ages)` +
      (ACTIVE.has(body.status) ? "; live, one point a second" : "");
    draw();
  }

  function plot(p) {
    const last = data[0].length ? data[0][data[0].length - 1] : -Infinity;
    if (p.time <= last) return; // an ended session's last snapshot is its history's last point
    const asked = p.status === "running" ? p.rate : 0;
    [p.time, p.depth, p.publish_rate, p.consume_rate, asked].forEach((value, i) => data[i].push(value));
    if (data[0].length > MAX_POINTS) thin();
    draw();
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
  stream.addEventListener("series", (event) => history(JSON.parse(event.data)));
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
        LS.setText("v-workers", s.workers ?? "unknown");
        LS.setText("v-consumers", s.consumers ?? "unknown");
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
