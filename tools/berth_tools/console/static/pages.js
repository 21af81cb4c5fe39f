// Berth console pages. Each renders into <main> from the API; every value is text, never HTML.
"use strict";

const ENDED = ["COMPLETED", "FAILED", "CANCELED"];

function runSeconds(job) {
  if (!job.started_at) return null;
  const end = ENDED.includes(job.status) ? Date.parse(job.updated_at) : Date.now();
  return (end - Date.parse(job.started_at)) / 1000;
}

function arrayProgress(job) {
  const counts = job.array.counts || {};
  const ended = ENDED.reduce((n, s) => n + (counts[s] || 0), 0);
  const pct = job.array.size ? Math.round((100 * ended) / job.array.size) : 0;
  return el("div", { title: JSON.stringify(counts) },
    el("div", { class: "bar" }, el("span", { style: null, "data-pct": pct })),
    el("span", { class: "muted" }, `${ended} of ${job.array.size} ended`));
}

Berth.pages.jobs = async (main) => {
  const status = el("select", { "aria-label": "status" },
    ["", "QUEUED", "STARTING", "RUNNING", "RETRYING", "COMPLETED", "FAILED", "CANCELING", "CANCELED"]
      .map((s) => el("option", { value: s }, s || "any status")));
  const site = el("select", { "aria-label": "site" },
    ["", "onprem", "cloud"].map((s) => el("option", { value: s }, s || "any site")));
  const gpu = el("input", { placeholder: "GPU type", "aria-label": "GPU type", size: 8 });
  const text = el("input", { placeholder: "search name or id", "aria-label": "search" });
  const body = el("tbody");
  main.replaceChildren(el("h1", {}, "Jobs"), el("div", { class: "filters" }, status, site, gpu, text),
    el("table", { "data-testid": "jobs" },
      el("thead", {}, el("tr", {}, ["Job", "Name", "Status", "Where", "GPUs", "Age", "Run time", "Cost", "Why waiting"]
        .map((h) => el("th", {}, h)))), body));
  let jobs = [];
  const draw = () => {
    const q = text.value.trim().toLowerCase();
    const g = gpu.value.trim().toLowerCase();
    const rows = jobs.filter((j) => (!site.value || (j.site || "") === site.value) &&
      (!g || String(j.spec.resources?.gpu_type || "").toLowerCase().includes(g)) &&
      (!q || j.id.includes(q) || String(j.spec.name).toLowerCase().includes(q)));
    body.replaceChildren(...rows.map((j) => el("tr", { "data-job": j.id },
      el("td", {}, el("a", { href: "#/job/" + encodeURIComponent(j.id) }, j.id)),
      el("td", {}, j.spec.name),
      el("td", {}, statusBadge(j.status)),
      el("td", {}, j.array ? "array" : where(j)),
      el("td", {}, `${j.spec.resources?.gpus ?? 1} × ${j.spec.resources?.gpu_type ?? ""}`),
      el("td", {}, fmtAge(j.created_at)),
      el("td", {}, j.array ? arrayProgress(j) : fmtSeconds(runSeconds(j))),
      el("td", {}, j.array ? "" : usd(j.cost_usd)),
      el("td", { class: "muted" }, queueLine(j)))));
    if (!rows.length) body.replaceChildren(el("tr", {}, el("td", { colspan: 9, class: "muted" }, "No jobs.")));
  };
  const load = async () => {
    const qs = status.value ? "&status=" + encodeURIComponent(status.value) : "";
    jobs = (await api("GET", "/v1/jobs?limit=100" + qs)).jobs;
    draw();
  };
  status.addEventListener("change", load);
  for (const f of [site, gpu, text]) f.addEventListener("input", draw);
  await load();
  every(5000, () => load().catch(() => {}));
};

Berth.pages.job = async (main, jobId) => {
  const job = await api("GET", "/v1/jobs/" + encodeURIComponent(jobId));
  const head = el("div", { class: "card grid", "data-testid": "job-head" });
  const why = el("div", { class: "card", "data-testid": "why" });
  const timeline = el("tbody");
  const logs = el("pre", { "data-testid": "logs" });
  const chart = el("div", { "data-testid": "chart" });
  const actions = el("div", { class: "filters" });
  main.replaceChildren(el("h1", {}, job.spec.name + " ", el("span", { class: "muted" }, job.id)),
    actions, head, why,
    el("h2", {}, "Timeline"), el("table", { "data-testid": "timeline" },
      el("thead", {}, el("tr", {}, ["At", "From", "To", "Reason"].map((h) => el("th", {}, h)))), timeline),
    el("h2", {}, "Output"), logs,
    el("h2", {}, "Usage"), chart,
    el("h2", {}, "Spec"), el("pre", { "data-testid": "spec" }, JSON.stringify(job.spec, null, 2)));

  const drawHead = (j) => {
    const rows = [["Status", statusBadge(j.status)], ["Reason", j.reason], ["Tenant", j.tenant],
      ["Owner", j.actor || j.owner], ["Where", j.array ? "array" : where(j)], ["Attempts", j.attempts],
      ["Cost so far", j.array ? "per task" : usd(j.cost_usd)], ["Created", j.created_at],
      ["Run time", fmtSeconds(runSeconds(j))]];
    if (j.array) rows.push(["Tasks", arrayProgress(j)]);
    head.replaceChildren(...rows.flatMap(([k, v]) => [el("strong", {}, k), el("span", {}, v)]));
    // The button is rebuilt only when it changes: one replaced at every refresh could lose a click
    // that lands while the page redraws.
    const label = ENDED.includes(j.status) || j.status === "CANCELING" ? "" : (j.array ? "Cancel all tasks" : "Cancel");
    if (actions.dataset.cancel === label) return;
    actions.dataset.cancel = label;
    actions.replaceChildren();
    if (label) {
      actions.appendChild(el("button", { class: "danger", "data-testid": "cancel", onclick: async () => {
        const what = j.array ? `all ${j.array.size} tasks of array ${j.id}` : `job ${j.id}`;
        if (!window.confirm(`Cancel ${what}?`)) return;
        try { await api("POST", "/v1/jobs/" + encodeURIComponent(j.id) + "/cancel"); await refresh(); }
        catch (err) { actions.appendChild(errorBox(err)); }
      } }, label));
    }
  };
  // The explanation runs a scheduling pass in the API: asked for at most every 30 s.
  let explained = null; let explainedAt = 0;
  const drawWhy = async (j) => {
    if (j.status !== "QUEUED") { why.hidden = true; return; }
    why.hidden = false;
    const parts = [el("h2", {}, "Why is it waiting"), el("p", {}, j.reason), el("p", {}, queueLine(j))];
    const fresh = explained && Date.now() - explainedAt <= 30000;
    if (!fresh) why.replaceChildren(...parts, el("p", { class: "muted" }, "Asking the scheduler…"));
    try {
      if (!fresh) {
        explained = await api("GET", "/v1/jobs/" + encodeURIComponent(j.id) + "/explain");
        explainedAt = Date.now();
      }
      const ex = explained;
      const e = ex.explanation;
      if (e) {
        parts.push(el("p", { "data-testid": "explain" }, "Scheduler now: " + (e.summary || ex.outcome)));
        if (e.rules && e.rules.length) parts.push(el("p", { class: "muted" }, "rules: " + e.rules.join(", ")));
        if (e.queue_position) parts.push(el("p", { class: "muted" }, "position in a pass now: " + e.queue_position));
      }
    } catch (err) { parts.push(errorBox(err)); }
    why.replaceChildren(...parts);
  };
  const drawEvents = async (j) => {
    const ev = (await api("GET", "/v1/jobs/" + encodeURIComponent(j.id) + "/events")).events;
    timeline.replaceChildren(...ev.map((e) => el("tr", {}, el("td", {}, e.at), el("td", {}, e.from || ""),
      el("td", {}, statusBadge(e.to)), el("td", {}, e.reason))));
  };
  let current = job;
  const refresh = async () => {
    current = await api("GET", "/v1/jobs/" + encodeURIComponent(jobId));
    drawHead(current);
    await Promise.all([drawWhy(current), drawEvents(current)]);
  };

  // Live log tail: the API's next_token continues where the last page ended (one attempt at a time).
  let attempt = null; let token = null; let busy = false;
  const tail = async () => {
    if (busy || current.array) return;
    busy = true;
    try {
      const want = current.attempts || null;
      if (want !== attempt) { attempt = want; token = null; logs.textContent = ""; }
      if (!attempt) { logs.textContent = "(not started)"; return; }
      const q = "?attempt=" + attempt + (token ? "&next_token=" + encodeURIComponent(token) : "");
      const page = await api("GET", "/v1/jobs/" + encodeURIComponent(jobId) + "/logs" + q);
      token = page.next_token || token;
      if (page.events.length) {
        const stick = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
        logs.append(page.events.map((e) => e.message).join("\n") + "\n");
        if (stick) logs.scrollTop = logs.scrollHeight;
      } else if (!logs.textContent && page.reason) logs.textContent = "(" + page.reason + ")";
    } finally { busy = false; }
  };
  const usage = async () => {
    if (current.array || !current.attempts) return;
    const m = await api("GET", "/v1/jobs/" + encodeURIComponent(jobId) + "/metrics");
    const t = (s) => Date.parse(s.at) / 1000;
    const hasGpu = m.samples.some((s) => s.gpu_util_pct !== null);
    const series = hasGpu
      ? [{ name: "GPU util %", cls: "u", max: 100, points: m.samples.filter((s) => s.gpu_util_pct !== null).map((s) => [t(s), s.gpu_util_pct]) },
         { name: "GPU memory MiB", cls: "m", points: m.samples.filter((s) => s.gpu_mem_used_mib !== null).map((s) => [t(s), s.gpu_mem_used_mib]) }]
      : [{ name: "CPU %", cls: "u", points: m.samples.map((s) => [t(s), s.cpu_pct]) },
         { name: "RSS MiB", cls: "m", points: m.samples.map((s) => [t(s), s.rss_mib]) }];
    const note = hasGpu ? "" : " (no GPU readings on this host: simulated GPUs; CPU and memory shown)";
    chart.replaceChildren(
      m.samples.length ? lineChart(series, 640, 180) : el("p", { class: "muted" }, "No samples yet."),
      el("p", { class: "muted" }, `${m.samples.length} samples` + note));
  };
  // The page is shown once its head is drawn; the timeline, output, chart and the scheduler's
  // explanation fill in as their answers arrive (route() records when the last one did).
  drawHead(job);
  const rest = [drawWhy(job), drawEvents(job), tail(), usage()].map((p) => p.catch(() => {}));
  every(1000, () => { if (!ENDED.includes(current.status) || token) tail().catch(() => {}); });
  every(3000, () => refresh().catch(() => {}));
  every(5000, () => usage().catch(() => {}));
  return rest;
};

// The team's queue in the order the scheduler serves it: the head its last pass ranked (one read
// however deep the queue). Guarantees and the fair-share line fill in after the table is shown.
Berth.pages.queue = async (main) => {
  const queue = await api("GET", "/v1/queue?limit=100");
  const jobs = queue.jobs;
  const fair = el("div", { "data-testid": "fair-share-box" });
  const guarantees = el("div", { "data-testid": "guarantees" });
  const head = queue.as_of ? `${queue.waiting} waiting; positions from the scheduling pass at ` +
    new Date(queue.as_of).toLocaleString() + (jobs.length < queue.waiting ? `; the first ${jobs.length} shown` : "")
    : "No scheduling pass has ranked this team's queue yet.";
  const parts = [el("h1", {}, "Queue"), el("p", { class: "muted", "data-testid": "queue-head" }, head),
    el("table", { "data-testid": "queue" },
      el("thead", {}, el("tr", {}, ["Position", "Job", "Waiting", "Estimated start (an estimate)", "Reason"]
        .map((h) => el("th", {}, h)))),
      el("tbody", {}, jobs.length ? jobs.map((j) => el("tr", {},
        el("td", {}, j.queue_position ? `${j.queue_position} of ${j.queue_length}` : "not ranked yet"),
        el("td", {}, el("a", { href: "#/job/" + encodeURIComponent(j.id) }, j.spec.name + " " + j.id)),
        el("td", {}, fmtAge(j.created_at)),
        el("td", { class: "estimate" }, j.estimated_start ? new Date(j.estimated_start).toLocaleString() +
          (j.estimated_start_basis === "burst" ? " (burst wait ends)" : " (on-prem predicted free)") : "no estimate"),
        el("td", { class: "muted" }, j.reason)))
        : el("tr", {}, el("td", { colspan: 5, class: "muted" }, "Nothing waiting.")))),
    fair, guarantees];
  main.replaceChildren(...parts);
  const quota = api("GET", "/v1/tenants/" + encodeURIComponent(queue.tenant) + "/quota").then((q) => {
    const gpus = Object.entries(q.gpus || {});
    guarantees.replaceChildren(el("h2", {}, "Team " + queue.tenant + ": guarantees and borrowing"),
      el("p", { class: "muted" }, `fair-share weight ${q.weight ?? 1}; at most ${q.max_active_jobs ?? "?"} active jobs`),
      el("table", {}, el("thead", {}, el("tr", {}, ["GPU model", "Guaranteed", "May borrow"].map((h) => el("th", {}, h)))),
        el("tbody", {}, gpus.length ? gpus.map(([m, g]) => el("tr", {}, el("td", {}, m), el("td", {}, g.guaranteed ?? 0),
          el("td", {}, g.borrow_limit ?? "no limit")))
          : el("tr", {}, el("td", { colspan: 3, class: "muted" }, "No guarantees: the team shares the fleet by fair share.")))));
  }, (err) => guarantees.replaceChildren(errorBox(err)));
  if (!jobs.length) return [quota];
  // Fair share: the scheduler core's explanation of the team's next job, a pass over the store now,
  // so it is asked for after the page is shown.
  fair.replaceChildren(el("p", { class: "muted" }, "Asking the scheduler for the team's fair share…"));
  const fairShare = api("GET", "/v1/jobs/" + encodeURIComponent(jobs[0].id) + "/explain").then((ex) => {
    const e = ex.explanation;
    fair.replaceChildren(...(e && e.tenants ? [el("p", { "data-testid": "fair-share" },
      `Fair share now: ${Number(e.fair_share).toFixed(3)} ` +
      `(rank ${e.fair_share_rank} of ${e.tenants} teams; the lowest share is served first)`)] : []));
  }, (err) => fair.replaceChildren(errorBox(err)));
  return [quota, fairShare];
};

// What the Fleet page shows of GET /v1/capacity, as plain data (tests/unit/test_console_fleet.py runs
// it in node): the totals line, each host's health (as `berth capacity` words it, worst first) and
// one row per GPU fault, fatal ones (out of placement until `berth gpu-clear`) before warnings.
function fleetPageData(cap) {
  const t = cap.totals;
  const health = (h) => !h.alive ? "lease lost" : h.healthy === false ? "unhealthy"
    : h.degraded ? "degraded (GPU fault)" : "healthy";
  return {
    summary: `${t.hosts} hosts, ${t.gpus} GPUs: ${t.used_gpus} used, ${t.free_gpus} free, ${t.unavailable_gpus} unavailable`
      + (t.faulted_gpus ? `, ${t.faulted_gpus} faulted` : ""),
    health: Object.fromEntries(cap.hosts.map((h) => [h.host_id, health(h)])),
    faults: cap.hosts.flatMap((h) => (h.gpu_faults || []).map((f) => ({
      host: h.host_id,
      gpu: f.index === null || f.index === undefined ? f.gpu_id : `${f.index} (${f.gpu_id})`,
      severity: f.severity === "fatal" ? "fatal: out of placement" : "warning",
      fault: f.reason,
      since: f.at,
    }))),
  };
}

Berth.pages.fleet = async (main) => {
  const cap = await api("GET", "/v1/capacity");
  const data = fleetPageData(cap);
  const drain = (h) => el("button", { "data-testid": "drain-" + h.host_id, onclick: async (ev) => {
    if (!window.confirm(`${h.draining ? "Undrain" : "Drain"} host ${h.host_id}?`)) return;
    try { await api("PUT", "/v1/hosts/" + encodeURIComponent(h.host_id) + "/drain", { drain: !h.draining }); route(); }
    catch (err) { ev.target.after(errorBox(err)); }
  } }, h.draining ? "Undrain" : "Drain");
  const regions = (cap.cloud && cap.cloud.regions) || [];
  const faults = data.faults.length ? [el("h2", {}, "GPU faults"),
    el("p", { class: "muted" }, "A fatal fault keeps the GPU out of placement until an admin clears it (berth gpu-clear HOST GPU)."),
    el("table", { "data-testid": "gpu-faults" },
      el("thead", {}, el("tr", {}, ["Host", "GPU", "Severity", "Fault", "Age"].map((h) => el("th", {}, h)))),
      el("tbody", {}, data.faults.map((f) => el("tr", { "data-host": f.host },
        el("td", {}, f.host), el("td", {}, f.gpu), el("td", {}, f.severity), el("td", {}, f.fault),
        el("td", { class: "muted" }, fmtAge(f.since))))))] : [];
  main.replaceChildren(el("h1", {}, "Fleet"),
    el("p", {}, data.summary),
    el("table", { "data-testid": "hosts" },
      el("thead", {}, el("tr", {}, ["Host", "Pool", "GPUs", "Used", "Free", "Health", "Drain", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, cap.hosts.map((h) => el("tr", { "data-host": h.host_id },
        el("td", {}, h.host_id), el("td", {}, h.pool), el("td", {}, `${h.gpus} × ${h.gpu_type}`),
        el("td", {}, h.used_gpus), el("td", {}, h.free_gpus),
        el("td", {}, data.health[h.host_id]),
        el("td", {}, h.draining ? "draining" : ""), el("td", {}, drain(h)))))),
    ...faults,
    el("h2", {}, "Cloud regions" + (cap.cloud && cap.cloud.enabled === false ? " (cloud disabled)" : "")),
    el("table", { "data-testid": "regions" },
      el("thead", {}, el("tr", {}, ["Region", "Circuit", "Instance types"].map((h) => el("th", {}, h)))),
      el("tbody", {}, regions.map((r) => el("tr", {}, el("td", {}, r.region), el("td", {}, r.circuit),
        el("td", { class: "muted" }, (r.instance_types || []).map((i) => `${i.instance_type} (${i.circuit})`).join(", ")))))));
};

Berth.pages.costs = async (main) => {
  const u = await api("GET", "/v1/usage");
  const budget = u.monthly_budget_usd;
  const spent = u.cloud_cost_usd || 0;
  const pct = budget ? Math.min(100, Math.round((100 * spent) / budget)) : null;
  main.replaceChildren(el("h1", {}, `Costs: ${u.tenant}, ${u.month}`),
    el("table", { "data-testid": "usage" },
      el("thead", {}, el("tr", {}, ["Site", "GPU-hours", "Spend"].map((h) => el("th", {}, h)))),
      el("tbody", {}, (u.sites || []).map((s) => el("tr", {}, el("td", {}, s.site), el("td", {}, Number(s.gpu_hours).toFixed(2)),
        el("td", {}, usd(s.cost_usd)))),
        el("tr", {}, el("th", {}, "Total"), el("th", {}, Number(u.total_gpu_hours || 0).toFixed(2)), el("th", {}, usd(u.total_cost_usd))))),
    el("h2", {}, "Cloud budget"),
    budget ? el("div", { class: "card" }, el("p", {}, `${usd(spent)} of ${usd(budget)} this month (${pct}%), ${usd(u.budget_left_usd)} left`),
      el("div", { class: "bar" }, el("span", { "data-pct": pct })))
      : el("p", { class: "muted" }, `No monthly cloud budget; cloud spend so far ${usd(spent)}.`));
};

// Bar widths from data-pct (the CSP allows no inline style attribute).
new MutationObserver(() => {
  for (const b of document.querySelectorAll(".bar > span[data-pct]")) b.style.width = b.dataset.pct + "%";
}).observe(document.documentElement, { childList: true, subtree: true });
