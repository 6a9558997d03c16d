// Training-job page: follows GET /v1/jobs/{id}/events (status, log, metric, progress, attempt, checkpoint,
// plateau) from the start.
"use strict";
(() => {
  const root = document.getElementById("job");
  const id = root.dataset.jobId;
  const submitted = Date.parse(root.dataset.submitted) / 1000;
  const curves = document.getElementById("curves");
  const log = document.getElementById("log");
  const TERMINAL = new Set(["completed", "failed"]);
  const MAX_LINES = 500;
  const byEpoch = new Map(); // epoch -> {epoch, t, train_loss, val_loss, train_accuracy, val_accuracy}
  let status = document.getElementById("status").textContent.trim();
  const axis = { stroke: "#667085", grid: { stroke: "#eef0f4" } };
  const series = [
    { label: "train loss", stroke: "#dc2626", width: 2, scale: "loss" },
    { label: "val loss", stroke: "#f97316", width: 2, dash: [6, 4], scale: "loss" },
    { label: "train accuracy", stroke: "#2563eb", width: 2, scale: "acc" },
    { label: "val accuracy", stroke: "#16a34a", width: 2, dash: [6, 4], scale: "acc" },
  ];
  const options = (title, xLabel) => ({
    title,
    scales: { x: { time: false }, acc: { range: [0, 1] } },
    series: [{ label: xLabel }, ...series],
    legend: { live: false },
    axes: [{ ...axis, label: xLabel, ...(xLabel === "epoch" ? { incrs: [1, 2, 5, 10, 20, 50, 100] } : {}) },
      { ...axis, scale: "loss", label: "loss" },
      { ...axis, scale: "acc", side: 1, label: "accuracy", grid: { show: false } }],
  });
  const empty = () => [[], [], [], [], []];
  const epochPlot = LS.chart(document.getElementById("epoch-chart"), options("against epoch", "epoch"), empty());
  const timePlot = LS.chart(document.getElementById("time-chart"),
    options("against wall time since submission", "seconds"), empty());
  // against step (steps of all epochs so far): the running loss of rank 0's progress events (one a second at
  // most, and one at each epoch's end), and the epoch's metrics at the step that ended it
  const stepCurve = document.getElementById("step-curve");
  const stepPlot = LS.chart(document.getElementById("step-chart"), {
    ...options("against step (running train loss live; epoch metrics at the epoch's last step)", "step"),
    series: [{ label: "step" },
      { label: "running train loss", stroke: "#dc2626", width: 1.5, scale: "loss", spanGaps: true },
      { label: "val loss", stroke: "#f97316", width: 2, dash: [6, 4], scale: "loss", spanGaps: true,
        points: { show: true } },
      { label: "train accuracy", stroke: "#2563eb", width: 2, scale: "acc", spanGaps: true, points: { show: true } },
      { label: "val accuracy", stroke: "#16a34a", width: 2, dash: [6, 4], scale: "acc", spanGaps: true,
        points: { show: true } }],
  }, empty());
  const bySteps = new Map(); // global step -> {loss, val_loss, train_accuracy, val_accuracy}
  const stepsOf = new Map(); // epoch -> its steps (from progress: the total, else the last step seen)
  function globalStep(epoch, step) { // steps of the epochs before (their known size, else this one's) + step
    const size = stepsOf.get(epoch) || step;
    let before = 0;
    for (let e = 1; e < epoch; e++) before += stepsOf.get(e) || size;
    return before + step;
  }
  function drawSteps() {
    const xs = [...bySteps.keys()].sort((a, b) => a - b);
    const out = empty();
    for (const x of xs) {
      const r = bySteps.get(x);
      out[0].push(x);
      out[1].push(r.loss ?? null);
      out[2].push(r.val_loss ?? null);
      out[3].push(r.train_accuracy ?? null);
      out[4].push(r.val_accuracy ?? null);
    }
    stepPlot.setData(out);
    stepCurve.dataset.points = String(xs.length);
  }
  function addProgress(p) {
    if ((p.rank ?? 0) !== 0 || !p.epoch || !p.step) return;
    stepsOf.set(p.epoch, Math.max(p.steps || 0, p.step, stepsOf.get(p.epoch) || 0));
    const x = globalStep(p.epoch, p.step);
    bySteps.set(x, { ...(bySteps.get(x) || {}), loss: p.loss ?? null });
    LS.setText("v-step", x);
    drawSteps();
  }
  function addEpochAtStep(m) { // an epoch's metrics, at the step that ended it (once its size is known)
    if (!stepsOf.has(m.epoch)) return;
    const x = globalStep(m.epoch, stepsOf.get(m.epoch));
    bySteps.set(x, { ...(bySteps.get(x) || {}), loss: m.train_loss ?? bySteps.get(x)?.loss ?? null,
      val_loss: m.val_loss, train_accuracy: m.train_accuracy, val_accuracy: m.val_accuracy });
    drawSteps();
  }

  function columns(records, x) {
    const out = empty();
    for (const r of records) {
      out[0].push(x(r));
      out[1].push(r.train_loss ?? null);
      out[2].push(r.val_loss ?? null);
      out[3].push(r.train_accuracy ?? null);
      out[4].push(r.val_accuracy ?? null);
    }
    return out;
  }

  function addMetric(m) {
    if (m.epoch === undefined) return;
    const t = m.stamp ? Date.parse(m.stamp) / 1000 - submitted : null;
    byEpoch.set(m.epoch, { ...m, t });
    addEpochAtStep(m);
    const records = [...byEpoch.values()].sort((a, b) => a.epoch - b.epoch);
    epochPlot.setData(columns(records, (r) => r.epoch));
    timePlot.setData(columns(records.filter((r) => r.t !== null).sort((a, b) => a.t - b.t), (r) => r.t));
    curves.dataset.points = String(records.length);
    LS.setText("v-epoch", m.epoch);
    LS.setText("v-loss", LS.num(m.train_loss, 3));
    LS.setText("v-acc", LS.num(m.val_accuracy, 3));
  }

  function addLog(line) {
    const follow = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
    log.append(document.createTextNode(line + "\n"));
    while (log.childNodes.length > MAX_LINES) log.removeChild(log.firstChild);
    log.dataset.lines = String(Number(log.dataset.lines) + 1);
    if (follow) log.scrollTop = log.scrollHeight;
  }

  function showStatus(s, reason) {
    status = s;
    const badge = document.getElementById("status");
    badge.textContent = s;
    badge.className = "status " + s;
    const why = document.getElementById("reason");
    why.textContent = reason || "";
    why.hidden = !reason;
    const can = {
      halt: ["queued", "pending", "running"].includes(s), resume: s === "halted", delete: true,
    };
    for (const button of document.querySelectorAll("#controls button[data-action]")) {
      button.disabled = !can[button.dataset.action];
    }
    for (const link of document.querySelectorAll("#controls a.button")) {
      link.classList.toggle("disabled", s !== "completed");
      link.setAttribute("aria-disabled", String(s !== "completed"));
    }
  }

  let refreshTimer = null;
  let refreshing = Promise.resolve();
  let gone = false; // deleted from this page: nothing more to ask about it
  function refreshSoon() { // attempts and queue position, at most every 300 ms while events pour in
    if (refreshTimer || gone) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = null;
      refreshing = refresh();
    }, 300);
  }
  function checkpoint(c) { // a checkpoint pointer {key, kind, attempt, epoch, step, time} for people
    return c ? `epoch ${c.epoch}${c.step ? " step " + c.step : ""} (${c.kind})` : "–";
  }
  async function refresh() { // the job as shown: attempt, queue position, attempts table
    try {
      const job = await LS.call("GET", `/v1/jobs/${id}`);
      LS.setText("v-attempt", job.attempt);
      LS.setText("v-queue", job.queue_position || "–");
      const body = document.querySelector("#attempts tbody");
      body.replaceChildren();
      for (const a of job.attempts) {
        const tr = body.insertRow();
        LS.cell(tr, a.number, "n");
        LS.cell(tr, (a.started_at || "").slice(0, 19).replace("T", " "), "small");
        LS.cell(tr, (a.ended_at || "").slice(0, 19).replace("T", " "), "small");
        LS.cell(tr, a.exit_code ?? "", "n");
        LS.cell(tr, a.reason || "", "small");
        LS.cell(tr, `${checkpoint(a.checkpoint_in)} → ${checkpoint(a.checkpoint_out)}`, "small");
        LS.cell(tr, a.learners.map((l) => `${l.host}:${l.pid}`).join(", "), "small");
      }
      if (!job.attempts.length) LS.cell(body.insertRow(), "no attempt yet", "small").colSpan = 7;
    } catch (error) {
      LS.say(error.message);
    }
  }

  showStatus(status, document.getElementById("reason").textContent.trim());
  const stream = new EventSource(`${LS.api}/v1/jobs/${id}/events`, { withCredentials: true });
  stream.addEventListener("status", (event) => {
    const d = JSON.parse(event.data);
    showStatus(d.status, [d.reason, d.error_code && `${d.error_code}: ${d.error}`].filter(Boolean).join(" "));
    refreshSoon();
    if (TERMINAL.has(d.status)) stream.close(); // the server ends the stream here: no reconnection
  });
  stream.addEventListener("log", (event) => addLog(JSON.parse(event.data).line || ""));
  stream.addEventListener("metric", (event) => addMetric(JSON.parse(event.data)));
  stream.addEventListener("progress", (event) => addProgress(JSON.parse(event.data)));
  stream.addEventListener("plateau", (event) => { // the watched metric stopped improving (training.early_stopping)
    const d = JSON.parse(event.data);
    addLog(`[plateau] epoch ${d.epoch}: ${d.metric} has not improved for ${d.epochs_without_improvement} ` +
           `epoch(s); best ${Number(d.best).toPrecision(4)} at epoch ${d.best_epoch}` +
           (d.early_stop ? "; early stop: the job ends with that epoch's model" : ""));
  });
  stream.addEventListener("attempt", refreshSoon);
  stream.addEventListener("checkpoint", refreshSoon);
  stream.onerror = () => {
    if (stream.readyState === EventSource.CLOSED && !TERMINAL.has(status)) {
      LS.say("the live stream closed: reload the page");
    }
  };

  for (const button of document.querySelectorAll("#controls button[data-action]")) {
    button.addEventListener("click", async () => {
      const action = button.dataset.action;
      try {
        if (action === "delete") {
          if (!window.confirm(`Delete job ${id}, its processes and its results?`)) return;
          gone = true;
          stream.close();
          clearTimeout(refreshTimer);
          await refreshing; // a refresh still under way must not ask after the job once it is deleted
          await LS.call("DELETE", `/v1/jobs/${id}`);
          window.location.assign(LS.ui + "/");
          return;
        }
        const job = await LS.call("PATCH", `/v1/jobs/${id}`, { status: action });
        showStatus(job.status, job.reason);
        LS.say(`${action} asked`, true);
      } catch (error) {
        LS.say(error.message);
      }
    });
  }
  for (const link of document.querySelectorAll("#controls a.button")) {
    link.addEventListener("click", (event) => {
      if (link.classList.contains("disabled")) event.preventDefault();
    });
  }
})();
