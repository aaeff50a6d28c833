/*
 * Training curves and the verify button of the veritrain pages (it POSTs the verify, then polls its progress).
 *
 * Reads <script type="application/json" id="curves-data"> and draws one uPlot chart into each
 * <div class="chart" data-chart="loss|accuracy|bits_per_byte|lr">. A run page gives
 *   {"epochs": [...], "series": {"train_loss": [...], "val_loss": [...], "train_acc": [...], "val_acc": [...], "lr": [...]}}
 * and the compare page gives {"runs": {RUN_ID: {"epochs": [...], "series": {...}}}}, drawn as one
 * line per run (its val series; the lr chart its lr). Missing series are skipped.
 *
 * Plain script: no modules, no eval, no inline handlers, text set with textContent only, so it runs under a strict
 * Content-Security-Policy (script-src 'self') and from file:// in a published site.
 */
(function () {
  "use strict";

  var PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];
  var HEIGHT = 240; // px per chart
  // Which series each chart shows on a run page, and the one per run it shows on the compare page.
  var CHARTS = {
    loss: { title: "loss", run: [["train_loss", "train loss"], ["val_loss", "val loss"]], compare: "val_loss", digits: 4 },
    accuracy: { title: "accuracy", run: [["train_acc", "train accuracy"], ["val_acc", "val accuracy"]], compare: "val_acc", digits: 4 },
    bits_per_byte: { title: "bits per byte", run: [["val_bits_per_byte", "val bits per byte"]], compare: "val_bits_per_byte", digits: 4 },
    lr: { title: "learning rate", run: [["lr", "lr"]], compare: "lr", digits: 6 }
  };

  function readCurves() {
    var node = document.getElementById("curves-data");
    if (!node) return null;
    try {
      return JSON.parse(node.textContent || "null");
    } catch (err) {
      if (window.console) console.warn("curves-data is not valid JSON: " + err);
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

  // Run page: x = the run's epochs, one line per named series.
  function runTable(curves, spec) {
    var epochs = curves.epochs || [];
    var series = curves.series || {};
    var data = [epochs.slice()];
    var labels = [];
    for (var i = 0; i < spec.run.length; i++) {
      var key = spec.run[i][0];
      if (!hasValues(series[key])) continue;
      data.push(clean(series[key], epochs.length));
      labels.push(spec.run[i][1]);
    }
    return { data: data, labels: labels };
  }

  // Compare page: runs may have different epochs, so x is the union and each run is null where it has no point.
  function compareTable(runs, spec) {
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
      labels.push(ids[i]);
    }
    return { data: data, labels: labels };
  }

  function formatter(digits) {
    return function (u, v) {
      return v == null ? "–" : Number(v).toFixed(digits);
    };
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
      empty.textContent = spec.title + ": no data";
      el.appendChild(empty);
      return null;
    }
    var single = table.data[0].length === 1;
    var series = [{ label: "epoch", value: function (u, v) { return v == null ? "–" : String(v); } }];
    for (var i = 0; i < table.labels.length; i++) {
      series.push({
        label: table.labels[i],
        stroke: PALETTE[i % PALETTE.length],
        width: 2,
        spanGaps: true,
        points: { show: single || table.data[0].length <= 30 },
        value: formatter(spec.digits)
      });
    }
    var opts = {
      title: spec.title,
      width: chartWidth(el),
      height: HEIGHT,
      scales: { x: { time: false } },
      axes: [
        {
          label: "epoch",
          // whole epochs only: never a tick at 1.5
          incrs: [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1000, 2000, 5000, 10000],
          values: function (u, ticks) { return ticks.map(function (t) { return String(Math.round(t)); }); }
        },
        { size: 60, values: function (u, ticks) { return ticks.map(function (t) { return shortNumber(t); }); } }
      ],
      series: series
    };
    if (kind === "accuracy") opts.scales.y = { range: function (u, min, max) { return [Math.max(0, Math.min(min, 1) - 0.05), Math.min(1, max + 0.05)]; } };
    var plot = new window.uPlot(opts, table.data, el);
    plot.root.setAttribute("data-chart-kind", kind);
    return plot;
  }

  function shortNumber(t) {
    if (t === 0) return "0";
    var a = Math.abs(t);
    if (a >= 1e4 || a < 1e-3) return t.toExponential(1);
    return String(Number(t.toPrecision(4)));
  }

  function drawCharts() {
    var curves = readCurves();
    if (!curves) return;
    if (typeof window.uPlot !== "function") {
      if (window.console) console.warn("uPlot did not load: no charts");
      return;
    }
    var nodes = document.querySelectorAll(".chart[data-chart]");
    var plots = [];
    for (var i = 0; i < nodes.length; i++) {
      var el = nodes[i];
      var kind = el.getAttribute("data-chart");
      var spec = CHARTS[kind];
      if (!spec) continue;
      var table = curves.runs ? compareTable(curves.runs, spec) : runTable(curves, spec);
      var plot = draw(el, table, spec, kind);
      if (plot) plots.push({ plot: plot, el: el });
    }
    var pending = null;
    window.addEventListener("resize", function () {
      if (pending) clearTimeout(pending);
      pending = setTimeout(function () {
        for (var k = 0; k < plots.length; k++) plots[k].plot.setSize({ width: chartWidth(plots[k].el), height: HEIGHT });
      }, 150);
    });
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
    drawCharts();
    setupVerify();
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
