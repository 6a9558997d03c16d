// Comparison page: a labswarm compare run's epoch records (compare.json, in the page) drawn as one curve per
// framework, against wall time and against samples seen (all learners).
"use strict";
(() => {
  const rows = JSON.parse(document.getElementById("compare-data").textContent);
  const COLOURS = ["#2563eb", "#dc2626", "#16a34a", "#7c3aed", "#f97316", "#0891b2", "#be185d", "#4d7c0f"];
  const axis = { stroke: "#667085", grid: { stroke: "#eef0f4" } };

  // uPlot wants one x column: the union of every framework's x values, null where a framework has no point
  function aligned(key, x) {
    const curves = rows.map((r) => (r.epochs || []).filter((e) => e[key] !== null && e[key] !== undefined
      && e[x] !== null && e[x] !== undefined));
    const xs = [...new Set(curves.flatMap((points) => points.map((e) => e[x])))].sort((a, b) => a - b);
    const columns = [xs];
    for (const points of curves) {
      const at = new Map(points.map((e) => [e[x], e[key]]));
      columns.push(xs.map((v) => (at.has(v) ? at.get(v) : null)));
    }
    return columns;
  }

  function draw(id, key, label, x, xLabel) {
    const container = document.getElementById(id);
    const series = rows.map((r, i) => ({
      label: r.label || r.framework, stroke: COLOURS[i % COLOURS.length], width: 2, spanGaps: true, points: { show: true },
    }));
    LS.chart(container, {
      title: `${label} against ${xLabel}`,
      scales: { x: { time: false }, ...(key === "val_accuracy" ? { y: { range: [0, 1] } } : {}) },
      series: [{ label: xLabel }, ...series],
      legend: { live: false },
      axes: [{ ...axis, label: xLabel }, { ...axis, label }],
    }, aligned(key, x));
    container.dataset.curves = String(series.length);
  }

  draw("accuracy-time", "val_accuracy", "validation accuracy", "elapsed_s", "wall time (s)");
  draw("accuracy-samples", "val_accuracy", "validation accuracy", "samples", "samples seen");
  draw("loss-time", "train_loss", "training loss", "elapsed_s", "wall time (s)");
  draw("loss-samples", "train_loss", "training loss", "samples", "samples seen");
})();
