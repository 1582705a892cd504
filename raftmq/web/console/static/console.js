// raftmq console: refresh a page's numbers from its JSON twin and draw the live plots.
//
// The server renders every number once; this script polls the page's `/console/...`
// twin (body[data-live]) every POLL_MS and rewrites each element marked data-k="a.b.c"
// with that path of the answer. Rates are computed here from counters between two polls
// (data-rate="key"); plots (uPlot) keep the last POINTS samples:
//   data-chart="rate"   data-keys="k1,k2" data-labels="l1,l2": per-second rates of counters
//   data-chart="queues" data-field="lag": one series per row of answer.queues
(function () {
  "use strict";
  const POLL_MS = 2000;
  const POINTS = 150;
  const COLORS = ["#3b5bdb", "#2b8a3e", "#e8890c", "#c92a2a", "#7048e8", "#0b7285", "#d6336c", "#5c940d"];
  const body = document.body;
  const url = body.dataset.live;
  const state = document.getElementById("live-state");
  const marked = document.querySelectorAll("[data-k], [data-rate], [data-chart]");
  if (!url || marked.length === 0) { if (state) state.textContent = ""; return; }

  const get = (obj, path) => path.split(".").reduce((o, p) => (o == null ? undefined : o[p]), obj);
  const fmt = (v) => {
    if (v === null || v === undefined) return "-";
    if (typeof v === "boolean") return v ? "yes" : "no";
    if (typeof v === "number") return Number.isInteger(v) ? v.toLocaleString("en-US") : v.toLocaleString("en-US", { maximumFractionDigits: 3 });
    if (Array.isArray(v)) return v.join(", ") || "-";
    return String(v);
  };
  const rateText = (r) => (r < 10 ? r.toFixed(1) : Math.round(r).toLocaleString("en-US"));

  function makePlot(el, labels) {
    const width = () => Math.max(300, el.clientWidth);
    const opts = {
      width: width(), height: 220,
      series: [{}].concat(labels.map((label, i) => ({ label, stroke: COLORS[i % COLORS.length], width: 2, points: { show: false } }))),
      axes: [{ stroke: "#6b7385", grid: { stroke: "#eef0f4" } }, { stroke: "#6b7385", grid: { stroke: "#eef0f4" }, size: 60 }],
      scales: {
        // a minute at least, so the first samples do not stretch over years
        x: { time: true, range: (u, lo, hi) => [Math.min(lo, hi - 60), hi] },
        y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.15)] },
      },
      legend: { live: true },
    };
    const plot = new uPlot(opts, [[]].concat(labels.map(() => [])), el);
    window.addEventListener("resize", () => plot.setSize({ width: width(), height: 220 }));
    return plot;
  }

  // one object per chart: its columns and how a new answer extends them
  const charts = Array.from(document.querySelectorAll("[data-chart]")).map((el) => {
    const kind = el.dataset.chart;
    const chart = { el, kind, xs: [], ys: [], plot: null, labels: [] };
    if (kind === "rate") {
      chart.keys = el.dataset.keys.split(",");
      chart.labels = (el.dataset.labels || el.dataset.keys).split(",");
    }
    return chart;
  });

  function push(chart, t, values, labels) {
    if (!chart.plot || labels.join("|") !== chart.labels.join("|") || chart.ys.length !== labels.length) {
      if (chart.plot) chart.plot.destroy();
      chart.el.textContent = "";
      chart.labels = labels;
      chart.xs = []; chart.ys = labels.map(() => []);
      chart.plot = labels.length ? makePlot(chart.el, labels) : null;
      if (!chart.plot) { chart.el.innerHTML = '<div class="empty">Nothing to draw yet.</div>'; return; }
    }
    chart.xs.push(t / 1000);
    values.forEach((v, i) => chart.ys[i].push(v));
    if (chart.xs.length > POINTS) { chart.xs.shift(); chart.ys.forEach((s) => s.shift()); }
    chart.plot.setData([chart.xs].concat(chart.ys));
  }

  let previous = null;
  function apply(d) {
    document.querySelectorAll("[data-k]").forEach((el) => {
      const v = get(d, el.dataset.k);
      if (v === undefined) return;
      el.textContent = fmt(v);
      if (el.hasAttribute("data-badge")) el.className = "badge b-" + v;
    });
    const rates = {};
    if (previous && d.t > previous.t) {
      const dt = (d.t - previous.t) / 1000;
      for (const key of Object.keys(d)) {
        if (typeof d[key] === "number" && typeof previous[key] === "number") rates[key] = Math.max(0, (d[key] - previous[key]) / dt);
      }
    }
    document.querySelectorAll("[data-rate]").forEach((el) => {
      const r = rates[el.dataset.rate];
      if (r !== undefined) el.textContent = rateText(r);
    });
    for (const chart of charts) {
      if (chart.kind === "rate" && previous) {
        push(chart, d.t, chart.keys.map((k) => rates[k] ?? 0), chart.labels);
      } else if (chart.kind === "queues") {
        const rows = d.queues || [];
        const field = chart.el.dataset.field;
        push(chart, d.t, rows.map((q) => q[field] ?? 0), rows.map((q) => (q.topic ? q.topic + "/" : "q") + q.queue));
      }
    }
    previous = d;
  }

  async function poll() {
    try {
      const answer = await fetch(url, { headers: { Accept: "application/json" }, credentials: "same-origin" });
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      apply(await answer.json());
      state.className = "live-state on";
      state.textContent = "live · " + new Date().toLocaleTimeString();
    } catch (err) {
      state.className = "live-state off";
      state.textContent = "not refreshing (" + err.message + ")";
    } finally {
      setTimeout(poll, POLL_MS);
    }
  }
  poll();
})();
