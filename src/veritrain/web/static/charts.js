/*
 * The scripts of the veritrain pages: training curves, live updates, the runs table's live rows, the parallel
 * coordinates of a sweep or search, the copy buttons and the verify button (it POSTs the verify, then polls it).
 *
 * Curves: reads <script type="application/json" id="curves-data"> and draws one uPlot chart into each
 * <div class="chart" data-chart="...">. A run page gives
 *   {"epochs": [...], "series": {"train_loss": [...], ...}, "steps": [...], "step_series": {"loss": [...], "lr": [...], "grad_norm": [...]}}
 * and the compare page gives {"runs": {RUN_ID: {"epochs": [...], "series": {...}}}, "labels": {RUN_ID: "optim.lr=0.01"}},
 * drawn as one line per run named by what changed. Missing series are skipped. A legend shows each line's last value
 * until the cursor is over the chart; dragging zooms, a double-click zooms out.
 *
 * Live (the server only, never a published page): a run page with <script id="live-data"> polls
 * /api/runs/<id>/live for the log lines written since (by byte offset) and adds their points; the runs table polls
 * /api/live for its running rows' progress and fetches itself again when a run is added, removed or changes state.
 * Polls stop while the tab is hidden.
 *
 * Plain script: no modules, no eval, no inline handlers, text set with textContent only, so it runs under a strict
 * Content-Security-Policy (script-src 'self') and from file:// in a published site.
 */
(function () {
  "use strict";

  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var HEIGHT = 220; // px per chart
  var RUN_POLL_MS = 1000; // a running run's page: new steps show within about a second
  var IDLE_POLL_MS = 2000; // a finished run's page: only whether it was deleted or re-sealed
  var TABLE_POLL_MS = 1500;
  // Which series each chart shows on a run page (x: "epoch" from metrics.jsonl, "step" from steps.jsonl), and the
  // one per run it shows on the compare page: the engine's charts, which every run has. The charts of the metrics a
  // task measures after every epoch come with the data ("charts": [{id, title, x, run, compare, bounds}]).
  var CHARTS = {
    step_loss: { title: "loss per step", x: "step", run: [["loss", "train loss"]] },
    step_lr: { title: "learning rate per step", x: "step", run: [["lr", "lr"]] },
    step_grad_norm: { title: "gradient norm per step", x: "step", run: [["grad_norm", "grad norm"]] },
    loss: { title: "loss per epoch", x: "epoch", run: [["train_loss", "train loss"], ["val_loss", "val loss"]], compare: "val_loss" },
    lr: { title: "learning rate per epoch", x: "epoch", run: [["lr", "lr"]], compare: "lr" }
  };

  function readJson(id) {
    var node = document.getElementById(id);
    if (!node) return null;
    try {
      return JSON.parse(node.textContent || "null");
    } catch (err) {
      if (window.console) console.warn(id + " is not valid JSON: " + err);
      return null;
    }
  }

  function hasValues(values) {
    if (!values || !values.length) return false;
    for (var i = 0; i < values.length; i++) if (typeof values[i] === "number" && isFinite(values[i])) return true;
    return false;
  }

  function clean(values, length) {
    var out = new Array(length);
    for (var i = 0; i < length; i++) {
      var v = values && i < values.length ? values[i] : null;
      out[i] = typeof v === "number" && isFinite(v) ? v : null;
    }
    return out;
  }

  // 4 significant digits, as the pages print numbers
  function shortNumber(t) {
    if (t == null || !isFinite(t)) return "–";
    if (t === 0) return "0";
    var a = Math.abs(t);
    if (a >= 1e5 || a < 1e-3) return Number(t.toPrecision(4)).toExponential();
    return String(Number(t.toPrecision(4)));
  }

  // Run page: x = the run's epochs or steps, one line per named series.
  function runTable(curves, spec) {
    var xs = (spec.x === "step" ? curves.steps : curves.epochs) || [];
    var series = (spec.x === "step" ? curves.step_series : curves.series) || {};
    var data = [xs.slice()];
    var labels = [];
    for (var i = 0; i < spec.run.length; i++) {
      var key = spec.run[i][0];
      if (!hasValues(series[key])) continue;
      data.push(clean(series[key], xs.length));
      labels.push(spec.run[i][1]);
    }
    return { data: data, labels: labels };
  }

  // Compare page: runs may have different epochs, so x is the union and each run is null where it has no point.
  function compareTable(curves, spec) {
    var runs = curves.runs;
    var names = curves.labels || {};
    var ids = Object.keys(runs);
    var seen = {};
    var xs = [];
    var i, j;
    for (i = 0; i < ids.length; i++) {
      var epochs = runs[ids[i]].epochs || [];
      for (j = 0; j < epochs.length; j++) {
        if (!seen.hasOwnProperty(epochs[j])) {
          seen[epochs[j]] = true;
          xs.push(epochs[j]);
        }
      }
    }
    xs.sort(function (a, b) { return a - b; });
    var index = {};
    for (i = 0; i < xs.length; i++) index[xs[i]] = i;
    var data = [xs];
    var labels = [];
    for (i = 0; i < ids.length; i++) {
      var run = runs[ids[i]];
      var values = (run.series || {})[spec.compare];
      if (!hasValues(values)) continue;
      var line = clean(null, xs.length);
      var runEpochs = run.epochs || [];
      for (j = 0; j < runEpochs.length && j < values.length; j++) {
        var v = values[j];
        line[index[runEpochs[j]]] = typeof v === "number" && isFinite(v) ? v : null;
      }
      data.push(line);
      labels.push(names[ids[i]] || ids[i]);
    }
    return { data: data, labels: labels };
  }

  function lastValue(values) {
    for (var i = values.length - 1; i >= 0; i--) if (values[i] != null) return values[i];
    return null;
  }

  function chartWidth(el) {
    var w = el.clientWidth || (el.parentNode && el.parentNode.clientWidth) || 600;
    return Math.max(240, Math.min(w, 1200));
  }

  function draw(el, table, spec, kind) {
    while (el.firstChild) el.removeChild(el.firstChild);
    if (table.labels.length === 0 || table.data[0].length === 0) {
      var empty = document.createElement("p");
      empty.className = "chart-empty";
      empty.textContent = spec.title + ": no data yet";
      el.appendChild(empty);
      return null;
    }
    var points = table.data[0].length;
    var axis = spec.axis || spec.x;
    var series = [{ label: axis, value: function (u, v) { return v == null ? "last" : String(v); } }];
    for (var i = 0; i < table.labels.length; i++) {
      series.push({
        label: table.labels[i],
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        spanGaps: true,
        points: { show: points <= 30 },
        // without a cursor on the chart the legend shows the line's last value, never a bare "–"
        value: function (u, v, seriesIndex, idx) {
          return shortNumber(idx == null ? lastValue(u.data[seriesIndex]) : v);
        }
      });
    }
    var xAxis = { label: axis, values: function (u, ticks) { return ticks.map(function (t) { return String(Math.round(t)); }); } };
    if (axis === "epoch") xAxis.incrs = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000]; // whole epochs only
    var opts = {
      title: spec.title,
      width: chartWidth(el),
      height: HEIGHT,
      scales: { x: { time: false } },
      cursor: { drag: { x: true, y: false } },
      axes: [xAxis, { size: 60, values: function (u, ticks) { return ticks.map(shortNumber); } }],
      series: series
    };
    var bounds = spec.bounds || [];
    if (typeof bounds[0] === "number" && typeof bounds[1] === "number") {
      // within the values the metric can take, with a margin of 5% of that range
      var low = bounds[0], high = bounds[1], pad = (high - low) * 0.05;
      opts.scales.y = { range: function (u, min, max) { return [Math.max(low, Math.min(min, high) - pad), Math.min(high, max + pad)]; } };
    }
    var plot = new window.uPlot(opts, table.data, el);
    plot.root.setAttribute("data-chart-kind", kind);
    plot.root.setAttribute("data-points", String(points));
    return plot;
  }

  var charts = []; // {el, kind, spec, plot, labels}

  function taskChart(curves, kind) {
    var declared = curves.charts || [];
    for (var i = 0; i < declared.length; i++) if (declared[i].id === kind) return declared[i];
    return null;
  }

  // A run's rows of metrics.jsonl stand for epochs, or for steps when it validates inside epochs
  // (eval.every_steps, curves.rows_by): its charts of them are then drawn by step, one point per validation.
  function byValidation(curves, spec) {
    if (!spec || spec.x !== "epoch" || curves.rows_by !== "step") return spec;
    var copy = {};
    for (var k in spec) if (Object.prototype.hasOwnProperty.call(spec, k)) copy[k] = spec[k];
    copy.title = String(spec.title).replace("per epoch", "per validation");
    copy.axis = "step";
    return copy;
  }

  function tableFor(curves, spec) {
    return curves.runs ? compareTable(curves, spec) : runTable(curves, spec);
  }

  function drawCharts(curves) {
    if (typeof window.uPlot !== "function") {
      if (window.console) console.warn("uPlot did not load: no charts");
      return;
    }
    var nodes = document.querySelectorAll(".chart[data-chart]");
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var kind = el.getAttribute("data-chart");
      var spec = byValidation(curves, CHARTS[kind] || taskChart(curves, kind));
      if (!spec) continue;
      var table = tableFor(curves, spec);
      charts.push({ el: el, kind: kind, spec: spec, plot: draw(el, table, spec, kind), labels: table.labels.join("\n") });
    }
    var pending = null;
    window.addEventListener("resize", function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(function () {
        for (var k = 0; k < charts.length; k++) if (charts[k].plot) charts[k].plot.setSize({ width: chartWidth(charts[k].el), height: HEIGHT });
      }, 150);
    });
  }

  // New points: the same lines get them (the zoom is kept); a line that appears redraws its chart.
  function redrawCharts(curves) {
    for (var i = 0; i < charts.length; i++) {
      var c = charts[i];
      var table = tableFor(curves, c.spec);
      var labels = table.labels.join("\n");
      if (c.plot && labels === c.labels) {
        c.plot.setData(table.data, true);
        c.plot.root.setAttribute("data-points", String(table.data[0].length));
      } else {
        if (c.plot) c.plot.destroy();
        c.plot = draw(c.el, table, c.spec, c.kind);
        c.labels = labels;
      }
    }
  }

  function append(target, rows, xKey, seriesKey) {
    if (!rows || !rows[xKey]) return 0;
    target[xKey] = (target[xKey] || []).concat(rows[xKey]);
    var series = target[seriesKey] || (target[seriesKey] = {});
    var length = target[xKey].length - rows[xKey].length;
    var keys = Object.keys(rows[seriesKey] || {});
    for (var i = 0; i < keys.length; i++) {
      var old = series[keys[i]] || clean(null, length);
      series[keys[i]] = old.concat(rows[seriesKey][keys[i]]);
    }
    // a series the new rows do not have stays as long as the others
    var all = Object.keys(series);
    for (var j = 0; j < all.length; j++) {
      if (series[all[j]].length < target[xKey].length) series[all[j]] = series[all[j]].concat(clean(null, target[xKey].length - series[all[j]].length));
    }
    return rows[xKey].length;
  }

  function getJsonText(request) {
    try {
      return JSON.parse(request.responseText);
    } catch (err) {
      return null;
    }
  }

  function apiBase() {
    var path = window.location.pathname;
    var at = path.lastIndexOf("/runs/");
    return window.location.origin + (at >= 0 ? path.slice(0, at) : path.replace(/\/[^\/]*$/, ""));
  }

  function banner(text, className) {
    var box = document.getElementById("live-state");
    if (!box) return;
    box.hidden = false;
    box.className = "live-state " + className;
    while (box.firstChild) box.removeChild(box.firstChild);
    box.appendChild(document.createTextNode(text + " "));
    var link = document.createElement("a");
    link.href = window.location.pathname;
    link.textContent = "reload";
    box.appendChild(link);
  }

  function setupLiveRun(curves) {
    var live = readJson("live-data");
    if (!live || !live.run_id || curves.runs) return;
    var state = { metrics: live.metrics || 0, steps: live.steps || 0, stamp: live.stamp || "", status: live.status, seal: live.seal };
    var progress = document.getElementById("live-progress");
    var stopped = false;

    function showProgress() {
      if (!progress) return;
      var steps = curves.steps || [];
      var epochs = curves.epochs || [];
      var byEpoch = epochs.length && curves.rows_by !== "step";  // rows by step: the steps say where it is
      progress.textContent = (byEpoch ? "epoch " + epochs[epochs.length - 1] + ", " : "") + "step " + (steps.length ? steps[steps.length - 1] : 0);
    }

    function answer(data) {
      if (data.state === "deleted") {
        stopped = true;
        banner("This run was deleted while the page was open: what it shows is gone from the workspace.", "bad");
        document.body.setAttribute("data-live-state", "deleted");
        return;
      }
      var grew = 0;
      if (data.reset && (data.reset.metrics || data.reset.steps)) {
        if (data.reset.metrics) { curves.epochs = []; curves.series = {}; }
        if (data.reset.steps) { curves.steps = []; curves.step_series = {}; }
      }
      grew += append(curves, data.epochs, "epochs", "series");
      grew += append(curves, data.steps, "steps", "step_series");
      state.metrics = data.offsets.metrics;
      state.steps = data.offsets.steps;
      if (grew) {
        redrawCharts(curves);
        showProgress();
      }
      if (data.stamp) state.stamp = data.stamp;
      if (data.state && data.state !== state.status) { // a finished run's page still watches for a delete or a re-seal
        banner("This run is now " + data.state + " (it was " + state.status + " when the page loaded): its evaluation and seal are on the page once reloaded.", data.state === "completed" ? "ok" : "warn");
        document.body.setAttribute("data-live-state", data.state);
        state.status = data.state;
        if (data.seal !== undefined) state.seal = data.seal; // sealed as it finished: not a re-seal
      } else if (data.seal !== undefined && data.seal !== state.seal && state.status !== "running") {
        banner("This run was re-sealed while the page was open: its seal is now " + (data.seal || "gone") + ", not " + state.seal + ".", "warn");
        document.body.setAttribute("data-live-state", "resealed");
        state.seal = data.seal;
      }
    }

    function poll() {
      if (stopped) return;
      if (document.hidden) { setTimeout(poll, IDLE_POLL_MS); return; }
      var request = new XMLHttpRequest();
      request.open("GET", apiBase() + "/api/runs/" + encodeURIComponent(live.run_id) + "/live?metrics=" + state.metrics + "&steps=" + state.steps +
        "&stamp=" + encodeURIComponent(state.stamp));
      request.onload = function () {
        var data = request.status === 200 ? getJsonText(request) : null;
        if (data) answer(data);
        setTimeout(poll, state.status === "running" ? RUN_POLL_MS : IDLE_POLL_MS);
      };
      request.onerror = function () { setTimeout(poll, IDLE_POLL_MS * 2); };
      request.send();
    }
    showProgress();
    setTimeout(poll, state.status === "running" ? RUN_POLL_MS : IDLE_POLL_MS);
  }

  // The runs table: the running rows' progress in place; the table fetched again when its token changes.
  function setupLiveTable() {
    var table = document.getElementById("runs-table");
    if (!table || table.getAttribute("data-live") !== "1" || typeof window.DOMParser !== "function") return;
    var token = null;

    function runningIds() {
      var rows = document.querySelectorAll('#runs-table tr[data-status="running"]');
      var ids = [];
      for (var i = 0; i < rows.length; i++) ids.push(rows[i].getAttribute("data-run-id"));
      return ids;
    }

    function refetch() {
      var request = new XMLHttpRequest();
      var url = window.location.href.split("#")[0];
      request.open("GET", url + (url.indexOf("?") >= 0 ? "&" : "?") + "fresh=1");
      request.onload = function () {
        if (request.status !== 200) return;
        var fresh = new window.DOMParser().parseFromString(request.responseText, "text/html");
        var swaps = ["#runs-table", "#runs-count", "#groups"];
        for (var i = 0; i < swaps.length; i++) {
          var now = document.querySelector(swaps[i]);
          var next = fresh.querySelector(swaps[i]);
          if (now && next) now.parentNode.replaceChild(document.importNode(next, true), now);
        }
        var swapped = document.getElementById("runs-table");
        if (swapped) swapped.setAttribute("data-refreshed", String(Date.now()));
      };
      request.send();
    }

    function poll() {
      if (document.hidden) { setTimeout(poll, TABLE_POLL_MS * 2); return; }
      var request = new XMLHttpRequest();
      request.open("GET", apiBase() + "/api/live?running=" + encodeURIComponent(runningIds().join(",")));
      request.onload = function () {
        var data = request.status === 200 ? getJsonText(request) : null;
        if (data) {
          if (token !== null && data.token !== token) refetch();
          token = data.token;
          var ids = Object.keys(data.runs || {});
          for (var i = 0; i < ids.length; i++) {
            var p = data.runs[ids[i]];
            var cell = document.querySelector('[data-progress="' + ids[i] + '"]');
            if (cell && p) cell.textContent = (p.epoch != null ? "epoch " + p.epoch + ", " : "") + "step " + (p.step != null ? p.step : 0);
          }
        }
        setTimeout(poll, TABLE_POLL_MS);
      };
      request.onerror = function () { setTimeout(poll, TABLE_POLL_MS * 4); };
      request.send();
    }
    setTimeout(poll, TABLE_POLL_MS);
  }

  // Parallel coordinates of a sweep or search: one SVG polyline per trial over the varied keys' axes and the metric.
  var SVG = "http://www.w3.org/2000/svg";

  function svg(name, attrs, parent) {
    var node = document.createElementNS(SVG, name);
    var keys = Object.keys(attrs || {});
    for (var i = 0; i < keys.length; i++) node.setAttribute(keys[i], String(attrs[keys[i]]));
    if (parent) parent.appendChild(node);
    return node;
  }

  function position(axis, value) { // 0 (bottom) … 1 (top); null for a missing value
    if (value == null) return null;
    if (axis.kind === "category") {
      var at = axis.labels.indexOf(String(value));
      return axis.labels.length > 1 ? at / (axis.labels.length - 1) : 0.5;
    }
    var lo = axis.min, hi = axis.max, v = value;
    if (axis.kind === "log") { lo = Math.log(lo); hi = Math.log(hi); v = Math.log(v); }
    return hi > lo ? (v - lo) / (hi - lo) : 0.5;
  }

  function drawParallel() {
    var box = document.getElementById("parallel");
    var plot = readJson("sweep-data");
    if (!box || !plot) return;
    var axes = plot.axes.slice();
    var metricAxis = plot.range ? { key: plot.metric, kind: "linear", min: plot.range[0], max: plot.range[1] } : null;
    if (!axes.length || !metricAxis) {
      var empty = document.createElement("p");
      empty.className = "chart-empty";
      empty.textContent = !axes.length ? "no varied keys" : "no trial has a " + plot.metric + " yet";
      box.appendChild(empty);
      return;
    }
    var all = axes.concat([metricAxis]);
    var width = Math.max(480, Math.min(box.clientWidth || 900, 1200));
    var height = 320, top = 30, bottom = 40, left = 70, right = 90;
    var root = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, role: "img", "aria-label": "parallel coordinates" }, box);
    var step = (width - left - right) / (all.length - 1 || 1);
    function x(i) { return left + i * step; }
    function y(p) { return top + (1 - p) * (height - top - bottom); }
    function color(t) { // worse … better along the metric, as the mode says
      if (t.value == null) return "#9aa3ab";
      var p = position(metricAxis, t.value);
      if (plot.mode === "min") p = 1 - p;
      var r = Math.round(214 - p * (214 - 31)), g = Math.round(39 + p * (119 - 39)), b = Math.round(40 + p * (180 - 40));
      return "rgb(" + r + "," + g + "," + b + ")";
    }
    var trials = plot.trials.slice().sort(function (a, b) { return (a.best ? 1 : 0) - (b.best ? 1 : 0); }); // the best drawn last, on top
    for (var k = 0; k < trials.length; k++) {
      var t = trials[k];
      var points = [];
      for (var i = 0; i < all.length; i++) {
        var p = position(all[i], i < axes.length ? t.values[i] : t.value);
        if (p != null) points.push(x(i).toFixed(1) + "," + y(p).toFixed(1));
      }
      var line = svg("polyline", { points: points.join(" "), fill: "none", stroke: color(t), "stroke-width": t.best ? 4 : 1.6,
        "stroke-opacity": t.best ? 1 : 0.75, "data-trial": t.number, "class": "trial-line state-" + t.state }, root);
      if (t.state === "pruned" || t.state === "failed") line.setAttribute("stroke-dasharray", "5,4");
      var title = svg("title", {}, line);
      title.textContent = "trial " + t.number + " (" + t.state + "): " + plot.metric + " " + shortNumber(t.value);
    }
    for (var a = 0; a < all.length; a++) {
      var axis = all[a];
      svg("line", { x1: x(a), x2: x(a), y1: top, y2: height - bottom, stroke: "#5b6670", "stroke-width": 1 }, root);
      var name = svg("text", { x: x(a), y: height - bottom + 18, "text-anchor": "middle", "class": "axis-name" }, root);
      name.textContent = axis.key;
      var ticks = axis.kind === "category" ? axis.labels.map(function (l) { return [l, position(axis, l)]; })
        : [[axis.min, 0], [axis.kind === "log" ? Math.sqrt(axis.min * axis.max) : (axis.min + axis.max) / 2, 0.5], [axis.max, 1]];
      for (var j = 0; j < ticks.length; j++) {
        var label = svg("text", { x: x(a) + 5, y: y(ticks[j][1]) + 4, "class": "axis-tick" }, root);
        label.textContent = typeof ticks[j][0] === "number" ? shortNumber(ticks[j][0]) : String(ticks[j][0]);
      }
    }
  }

  function setupCopy() {
    var buttons = document.querySelectorAll("button.copy[data-copy]");
    for (var i = 0; i < buttons.length; i++) {
      buttons[i].addEventListener("click", function (event) {
        var button = event.currentTarget;
        var text = button.getAttribute("data-copy");
        var done = function () { button.textContent = "copied"; setTimeout(function () { button.textContent = "copy"; }, 1500); };
        if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(done, function () { button.textContent = "select it"; });
        else button.textContent = "select it";
      });
    }
  }

  // /runs/<id> (or /prefix/runs/<id>) -> /api/runs/<id>/<what> under the same prefix.
  function apiUrl(runId, what) {
    var path = window.location.pathname;
    var at = path.lastIndexOf("/runs/");
    var prefix = at >= 0 ? path.slice(0, at) : "";
    return window.location.origin + prefix + "/api/runs/" + encodeURIComponent(runId) + "/" + what;
  }

  var POLL_MS = 300; // between two reads of the verify job's progress

  function describeVerify(result) {
    if (result && result.ok && result.interrupted_amend) {
      return "verified as it was before the interrupted amend: seal " + (result.seal || "") + "\n" + result.interrupted_amend;
    }
    if (result && result.ok) return "verified: seal " + (result.seal || "");
    var lines = result && result.interrupted_amend ? [result.interrupted_amend] : [];
    var problems = (result && result.problems) || [];
    for (var i = 0; i < problems.length; i++) {
      var p = problems[i];
      lines.push((p.kind || "problem") + ": " + (p.path || "") + (p.detail ? " (" + p.detail + ")" : ""));
    }
    var drift = (result && result.drift) || [];
    for (i = 0; i < drift.length; i++) {
      lines.push("drift: " + drift[i].what + ": recorded " + drift[i].recorded + ", now " + drift[i].now);
    }
    if (result && result.error) lines.push(String(result.error));
    if (!lines.length) lines.push("not verified");
    return "not verified\n" + lines.join("\n");
  }

  function describeProgress(job) {
    if (!job || job.state === "queued") return "verifying… (queued behind another run's verify)";
    if (!job.stage) return "verifying…";
    return "verifying… " + job.stage + ": " + job.done + " of " + job.total;
  }

  // The kept verdict shown above the button now describes this result.
  function showVerdict(result) {
    var box = document.getElementById("verdict");
    var summary = document.getElementById("verdict-summary");
    if (!box || !summary || !result || typeof result.ok !== "boolean") return;
    var state = result.ok ? "ok" : "failed";
    box.className = "verdict verdict-" + state;
    box.setAttribute("data-state", state);
    var problems = result.problems || [];
    summary.textContent = (result.ok ? "verified" : "does not verify") + " at " + (result.verified_at || "") + " for seal " +
      (result.seal || "-") + (problems.length ? ": " + problems.length + " problem(s)" : "");
    var list = document.getElementById("verdict-problems");
    if (list) list.parentNode.removeChild(list);
  }

  function getJson(request) {
    try {
      return JSON.parse(request.responseText);
    } catch (err) {
      return { ok: false, error: "the server answered " + request.status + " without JSON" };
    }
  }

  function setupVerify() {
    var button = document.getElementById("verify-button");
    var out = document.getElementById("verify-result");
    if (!button || !out) return;

    function finish(className, text) {
      button.disabled = false;
      out.className = className;
      out.textContent = text;
    }

    function poll(runId) {
      var request = new XMLHttpRequest();
      request.open("GET", apiUrl(runId, "verdict"));
      request.setRequestHeader("Accept", "application/json");
      request.onload = function () {
        var answer = getJson(request);
        var job = answer && answer.job;
        if (request.status >= 400 || !job) {
          finish("verify-failed", describeVerify({ ok: false, error: (answer && answer.error) || "the server lost the verify job; try again" }));
        } else if (job.state === "queued" || job.state === "running") {
          out.textContent = describeProgress(job);
          setTimeout(function () { poll(runId); }, POLL_MS);
        } else if (job.state === "done" && job.result) {
          finish(job.result.ok ? "verify-ok" : "verify-failed", describeVerify(job.result));
          showVerdict(job.result);
        } else {
          finish("verify-failed", describeVerify({ ok: false, error: job.error || "the verify job failed" }));
        }
      };
      request.onerror = function () { finish("verify-failed", "could not reach the server"); };
      request.send();
    }

    button.addEventListener("click", function () {
      var runId = button.getAttribute("data-run");
      if (!runId) return;
      button.disabled = true;
      out.className = "verify-pending";
      out.textContent = "verifying…";
      var request = new XMLHttpRequest();
      request.open("POST", apiUrl(runId, "verify"));
      request.setRequestHeader("Accept", "application/json");
      request.setRequestHeader("X-Veritrain", "verify"); // the server refuses a verify request without it (another site cannot send it)
      request.onload = function () {
        var answer = getJson(request);
        if (request.status !== 202) {
          finish("verify-failed", describeVerify({ ok: false, error: (answer && answer.error) || "the server answered " + request.status }));
          return;
        }
        out.textContent = describeProgress(answer.job);
        poll(runId);
      };
      request.onerror = function () { finish("verify-failed", "could not reach the server"); };
      request.send();
    });
  }

  function start() {
    var curves = readJson("curves-data");
    if (curves) {
      drawCharts(curves);
      setupLiveRun(curves);
    }
    setupLiveTable();
    drawParallel();
    setupCopy();
    setupVerify();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
