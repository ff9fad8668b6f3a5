// atlantis console: live updates in plain JavaScript, no build step.
// Handler-controlled text is only ever set through textContent, never as HTML.
(function () {
  "use strict";
  var paused = false;
  var statusEl, pauseBtn;
  var POLL_MS = 5000;
  var MIN_REFRESH_MS = 250;

  function setStatus(text, cls) {
    if (!statusEl) return;
    statusEl.textContent = text;
    statusEl.className = "live " + (cls || "");
  }

  function duration(s) {
    s = Math.max(0, Math.round(s));
    if (s < 60) return s + "s";
    var m = Math.floor(s / 60), sec = s % 60;
    if (m < 60) return m + "m" + (sec ? sec + "s" : "");
    var h = Math.floor(m / 60), min = m % 60;
    if (h < 24) return h + "h" + (min ? min + "m" : "");
    var d = Math.floor(h / 24);
    return d + "d" + (h % 24 ? (h % 24) + "h" : "");
  }

  function sparkPoints(values, width, height, top) {
    if (!values.length) return "";
    var peak = top || Math.max.apply(null, values.concat([1]));
    var step = width / Math.max(values.length - 1, 1);
    var pts = values.map(function (v, i) {
      var y = height - (Math.min(v, peak) / peak) * (height - 2) - 1;
      return (i * step).toFixed(1) + "," + y.toFixed(1);
    });
    if (pts.length === 1) pts.push(width.toFixed(1) + "," + pts[0].split(",")[1]);
    return pts.join(" ");
  }

  // Confirmations on forms (no inline handlers: the CSP forbids them).
  document.addEventListener("submit", function (ev) {
    var form = ev.target;
    var question = form.getAttribute && form.getAttribute("data-confirm");
    if (question && !window.confirm(question)) ev.preventDefault();
  });

  // ---- list pages: refresh #live on "refresh" events, debounced --------------------------
  // A workflow's page too: it reads itself again on each "workflow" event of its stream.
  function listPage(url, eventName) {
    var busy = false, again = false, last = 0, timer = null, source = null, poller = null;

    function refresh() {
      if (paused) return;
      var wait = MIN_REFRESH_MS - (Date.now() - last);
      if (busy || wait > 0) {
        again = true;
        if (!busy && !timer) timer = setTimeout(function () { timer = null; refresh(); }, wait);
        return;
      }
      busy = true; again = false; last = Date.now();
      fetch(window.location.href, {credentials: "same-origin", headers: {"X-Requested-With": "console"}})
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var doc = new DOMParser().parseFromString(html, "text/html");
          var fresh = doc.getElementById("live"), current = document.getElementById("live");
          if (!fresh || !current) return;
          var checked = {};
          current.querySelectorAll("input[type=checkbox][name=ids]:checked").forEach(function (c) { checked[c.value] = true; });
          current.replaceWith(fresh);
          fresh.querySelectorAll("input[type=checkbox][name=ids]").forEach(function (c) { if (checked[c.value]) c.checked = true; });
        })
        .catch(function () {})
        .then(function () { busy = false; if (again) refresh(); });
    }

    function startPolling() {
      if (!poller) poller = setInterval(refresh, POLL_MS);
      setStatus("polling", "polling");
    }
    function stopPolling() { if (poller) { clearInterval(poller); poller = null; } }

    if (window.EventSource) {
      source = new EventSource(url);
      source.addEventListener("open", function () { stopPolling(); setStatus("live", "on"); });
      source.addEventListener(eventName, refresh);
      source.addEventListener("error", startPolling);
    } else {
      startPolling();
    }
    return refresh;
  }

  // ---- the job page: its row and its log, streamed ---------------------------------------
  function jobPage(main) {
    var id = main.getAttribute("data-job-id");
    var logEl = document.getElementById("log");
    var lastLogId = 0, lastAttempt = null, lastRun = null, poller = null, source = null, pending = [];
    var attemptEl = document.getElementById("log-attempt");
    var runEl = document.getElementById("log-run");
    if (attemptEl) lastAttempt = parseInt(attemptEl.textContent, 10);
    if (runEl) lastRun = parseInt(runEl.textContent, 10);
    if (logEl) logEl.querySelectorAll(".line").forEach(function (l) {
      lastLogId = Math.max(lastLogId, parseInt(l.getAttribute("data-id"), 10) || 0);
    });
    var ticking = {};

    function text(elId, value) {
      var el = document.getElementById(elId);
      if (el) el.textContent = value;
    }
    function tick(elId, seconds, grow, past) {
      var el = document.getElementById(elId);
      if (!el) return;
      ticking[elId] = seconds === null || seconds === undefined || isNaN(seconds) ? null : {at: Date.now(), s: seconds, grow: grow, past: past || "expired "};
      render(elId);
    }
    function render(elId) {
      var el = document.getElementById(elId), t = ticking[elId];
      if (!el) return;
      if (!t) { el.textContent = "-"; return; }
      var s = t.s + (t.grow ? 1 : -1) * (Date.now() - t.at) / 1000;
      el.textContent = t.grow ? duration(s) + " ago" : (s > 0 ? "in " + duration(s) : t.past + duration(-s) + " ago");
    }
    setInterval(function () { Object.keys(ticking).forEach(render); }, 1000);

    function size(n) {
      var units = [["TB", 1099511627776], ["GB", 1073741824], ["MB", 1048576], ["KB", 1024]];
      for (var i = 0; i < units.length; i++) {
        if (n >= units[i][1]) { var v = n / units[i][1]; return (v === Math.floor(v) ? v.toFixed(0) : v.toFixed(1)) + units[i][0]; }
      }
      return n + "B";
    }
    function stamp(iso) {
      var d = new Date(iso);
      return isNaN(d.getTime()) ? String(iso) : d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
    }
    // Handler steps (the count, their size, the last few) and what an asleep job waits for.
    function applySteps(job) {
      var hs = job.handler_steps;
      var block = document.getElementById("steps-block");
      if (block) block.hidden = !hs.records;
      text("steps-count", hs.records);
      text("steps-bytes", size(hs.bytes));
      text("steps-more", hs.records > hs.last.length
        ? "the last " + hs.last.length + " below; tide job steps " + job.id + " lists them all"
        : "tide job steps " + job.id + " shows their values");
      var body = document.getElementById("steps-last");
      if (body) {
        while (body.firstChild) body.removeChild(body.firstChild);
        hs.last.forEach(function (st) {
          var tr = document.createElement("tr");
          [st.name, st.kind, stamp(st.at), size(st.bytes)].forEach(function (v, i) {
            var td = document.createElement("td");
            if (i === 2) td.className = "when";
            td.textContent = v;
            tr.appendChild(td);
          });
          body.appendChild(tr);
        });
      }
      // What it waits for, in the server's words (job.suspension: the page's own text).
      var asleep = document.getElementById("asleep");
      if (!asleep) return;
      var waits = job.suspension;
      asleep.hidden = !waits || job.state !== "available";
      var until = waits ? job.suspended_until : null;
      var when = document.getElementById("asleep-when");
      if (when) when.hidden = !until;
      if (waits) {
        text("asleep-label", waits.label);
        text("asleep-text", waits.text);
      }
      if (!until) { tick("asleep-in", null, false); return; }
      text("asleep-until", stamp(until));
      tick("asleep-in", (Date.parse(until) - Date.parse(job.now)) / 1000, false, "due ");
    }

    // The children's section, read again from the page when their counts changed (the
    // server renders it: its counts, its first 100 rows and "and N more").
    var childrenBusy = false;
    function countsKey(counts) {
      return Object.keys(counts).sort().map(function (k) { return k + "=" + counts[k]; }).join(" ");
    }
    function applyChildren(counts) {
      var section = document.getElementById("children");
      if (!section || childrenBusy || countsKey(counts) === section.getAttribute("data-counts")) return;
      childrenBusy = true;
      fetch(window.location.pathname, {credentials: "same-origin", headers: {"X-Requested-With": "console"}})
        .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
        .then(function (html) {
          var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("children");
          var current = document.getElementById("children");
          if (fresh && current) current.replaceWith(fresh);
        })
        .catch(function () {})
        .then(function () { childrenBusy = false; });
    }

    function applyJob(job) {
      if (paused) { pending.push(["job", job]); return; }
      var state = document.getElementById("state");
      if (state) { state.textContent = job.state; state.className = "badge state-" + job.state; }
      var bar = document.getElementById("progress");
      if (bar) bar.value = job.progress_pct === null ? 0 : job.progress_pct;
      text("pct", job.progress_pct === null ? "no checkpoint yet" : job.progress_pct + "%");
      text("message", job.progress_msg || "");
      text("rate", job.rate === null ? "-" : job.rate.toFixed(1) + " %/min");
      text("eta", job.eta_seconds === null ? "-" : duration(job.eta_seconds));
      document.querySelectorAll("[data-field=attempt]").forEach(function (el) { el.textContent = job.attempt; });
      document.querySelectorAll("[data-field=run]").forEach(function (el) { el.textContent = job.run; });
      var runBadge = document.getElementById("run");
      if (runBadge) runBadge.hidden = !(job.run > 1);
      var stalled = document.getElementById("stalled");
      if (stalled) stalled.hidden = !job.stalled;
      var cr = document.getElementById("cancel-requested");
      if (cr) cr.hidden = !(job.cancel_requested_at && job.state === "running");
      var held = document.getElementById("held");
      if (held) {
        // Stream events carry no "held" (GET /api/jobs/{id} does): keep the last one read.
        if (job.held !== undefined) text("held-text", job.held || "");
        held.hidden = job.state !== "available" || !document.getElementById("held-text").textContent;
      }
      text("holder", job.holder ? job.holder.host + " pid " + (job.holder.pid === null ? "?" : job.holder.pid) : "-");
      tick("lease", job.lease_expires_in, false);
      tick("since-checkpoint", job.since_checkpoint, true);
      tick("since-renewal", job.since_renewal, true);
      var spark = document.getElementById("spark");
      if (spark) {
        var values = (job.progress_history || []).map(function (h) { return Number(h.pct) || 0; });
        spark.setAttribute("points", sparkPoints(values, 240, 32, 100));
      }
      var fin = document.getElementById("finished");
      if (fin) fin.hidden = !job.finished_at;
      var result = document.getElementById("result-block");
      if (result) {
        var has = job.result !== null && job.result !== undefined;
        result.hidden = !has;
        text("result", has ? JSON.stringify(job.result, null, 2) : "");
      }
      document.querySelectorAll("form.act[data-states]").forEach(function (f) {
        f.hidden = f.getAttribute("data-states").split(" ").indexOf(job.state) < 0;
      });
      if (job.handler_steps !== undefined) applySteps(job);
      if (job.children !== undefined) applyChildren(job.children);
    }

    function applyLog(lines) {
      if (paused) { pending.push(["log", lines]); return; }
      if (!logEl) return;
      lines.forEach(function (l) {
        if (l.id <= lastLogId) return;
        // A retry starts the next run, whose attempts count from 1 again: a new (run,
        // attempt) gets a separator naming both once the job has had more than one run.
        var run = l.run || 1;
        if (lastAttempt !== null && (l.attempt !== lastAttempt || (lastRun !== null && run !== lastRun))) {
          var sep = document.createElement("span");
          sep.className = "line sep";
          sep.textContent = "--- " + (run > 1 ? "run " + run + " " : "") + "attempt " + l.attempt + " ---\n";
          logEl.appendChild(sep);
        }
        lastAttempt = l.attempt;
        lastRun = run;
        if (attemptEl) attemptEl.textContent = l.attempt;
        if (runEl) runEl.textContent = run;
        var runPart = document.getElementById("log-run-part");
        if (runPart && run > 1) runPart.hidden = false;
        lastLogId = l.id;
        var span = document.createElement("span");
        span.className = "line " + (l.stream === "stderr" ? "stderr" : "stdout");
        span.setAttribute("data-id", l.id);
        span.textContent = l.line + "\n";
        logEl.appendChild(span);
      });
      var empty = document.getElementById("log-empty");
      if (empty && logEl.childNodes.length) empty.hidden = true;
      logEl.scrollTop = logEl.scrollHeight;
    }

    function poll() {
      if (paused) return;
      fetch("/api/jobs/" + id, {credentials: "same-origin"}).then(function (r) { return r.json(); }).then(applyJob).catch(function () {});
      fetch("/api/jobs/" + id + "/logs?after=" + lastLogId + (lastRun ? "&run=" + lastRun : "") + (lastAttempt ? "&attempt=" + lastAttempt : ""), {credentials: "same-origin"})
        .then(function (r) { return r.json(); }).then(function (d) { applyLog(d.lines || []); }).catch(function () {});
    }
    function startPolling() { if (!poller) poller = setInterval(poll, POLL_MS); setStatus("polling", "polling"); }
    function stopPolling() { if (poller) { clearInterval(poller); poller = null; } }

    if (window.EventSource) {
      source = new EventSource("/api/jobs/" + id + "/stream");
      source.addEventListener("open", function () { stopPolling(); setStatus("live", "on"); });
      source.addEventListener("job", function (ev) { applyJob(JSON.parse(ev.data)); });
      source.addEventListener("log", function (ev) { applyLog(JSON.parse(ev.data)); });
      source.addEventListener("error", startPolling);
    } else {
      startPolling();
    }
    return function flush() {
      var queued = pending; pending = [];
      queued.forEach(function (p) { if (p[0] === "job") applyJob(p[1]); else applyLog(p[1]); });
    };
  }

  document.addEventListener("DOMContentLoaded", function () {
    statusEl = document.getElementById("live-status");
    pauseBtn = document.getElementById("pause-toggle");
    var main = document.querySelector("main[data-live]");
    if (!main) { if (statusEl) statusEl.hidden = true; if (pauseBtn) pauseBtn.hidden = true; return; }
    var live = main.getAttribute("data-live"), resume;
    if (live === "job") resume = jobPage(main);
    else if (live === "workflow") resume = listPage("/api/workflows/" + main.getAttribute("data-workflow-id") + "/stream", "workflow");
    else resume = listPage("/api/events", "refresh");
    if (pauseBtn) pauseBtn.addEventListener("click", function () {
      paused = !paused;
      pauseBtn.textContent = paused ? "Resume updates" : "Pause updates";
      setStatus(paused ? "paused" : "live", paused ? "paused" : "on");
      if (!paused) resume();
    });
  });
})();
