// Conveyor's dashboard: hash-routed pages over /ui/api, the REST API (/v1) and Queen's
// admin API (/api/v1). Every call carries the token the page asked for (kept in
// sessionStorage, so it goes when the tab does). Data is put in the page as text nodes,
// never as HTML.
import { lineChart, setChartZone } from "/ui/static/chart.js";

const TOKEN_KEY = "conveyor.token";
const RANGES = [[15, "15 min"], [60, "1 h"], [360, "6 h"], [1440, "24 h"]];
const view = document.getElementById("view");
let me = null;          // {role, may_admin, auth_mode}
let liveTimer = null;

// -- DOM ---------------------------------------------------------------------------------

function h(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "text") node.textContent = v;
    else if (k === "class") node.className = v;
    else if (k === "style") Object.assign(node.style, v);  // the DOM's style object: the CSP refuses style=""
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

const num = (v) => (v === null || v === undefined ? "–" : Number(v).toLocaleString("en-US"));
const rate = (v) => (v === null || v === undefined ? "–" : `${Number(v).toFixed(2)}/s`);
function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.round(Number(seconds));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}
// Every time the page shows carries its zone: the browser's own, or UTC (the switch in the
// header, kept for the tab), so a schedule's "At 02:00 (Europe/Paris)" and its next fire
// times can be read side by side.
const ZONE_KEY = "conveyor.zone";
const zone = () => (sessionStorage.getItem(ZONE_KEY) === "UTC" ? "UTC" : undefined);
function when(iso) {
  if (!iso) return "–";
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toLocaleString("en-GB", { timeZone: zone(), year: "numeric", month: "short", day: "numeric",
    hour: "2-digit", minute: "2-digit", second: "2-digit", timeZoneName: "short" });
}
const plural = (n, one, many = `${one}s`) => `${num(n)} ${Number(n) === 1 ? one : many}`;
const enc = encodeURIComponent;
const link = (href, text) => h("a", { href }, text);
const card = (k, v) => h("div", { class: "card" }, h("div", { class: "v", text: v }), h("div", { class: "k", text: k }));
const badge = (text, kind = "") => h("span", { class: `badge ${kind}`, text });

function table(columns, rows, empty = "Nothing here yet.") {
  if (!rows.length) return h("div", { class: "empty", text: empty });
  return h("table", {},
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { class: c.n ? "n" : "", text: c.title })))),
    h("tbody", {}, rows.map((r) => h("tr", {}, columns.map((c) => {
      const v = c.cell(r);
      return h("td", { class: c.n ? "n" : "" }, v instanceof Node ? v : String(v ?? "–"));
    })))));
}

function toast(text, bad = false) {
  const t = document.getElementById("toast");
  t.textContent = text;
  t.className = bad ? "bad" : "";
  t.hidden = false;
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.hidden = true; }, 4000);
}

// -- the server --------------------------------------------------------------------------

class Unauthorized extends Error {}

function authorization() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (!token) return null;
  return token.includes(" ") ? token : `Bearer ${token}`;
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  const auth = authorization();
  if (auth) headers.Authorization = auth;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const r = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  const data = text ? JSON.parse(text) : null;
  if (r.status === 401) throw new Unauthorized(data?.error ?? "sign in");
  if (!r.ok) throw new Error(data?.error || `${r.status} ${r.statusText}`);
  return data;
}

function confirmAction(title, text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-title").textContent = title;
  document.getElementById("confirm-text").textContent = text;
  dialog.returnValue = "";
  dialog.showModal();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
  });
}

// An admin action: the admin role, a confirmation, then the call and a redraw. "danger"
// (red) for what cannot be undone (purge, delete); "caution" for what can (a replay).
function adminButton(label, title, text, run, kind = "danger") {
  return h("button", {
    class: kind, type: "button", disabled: !me?.may_admin,
    title: me?.may_admin ? null : "needs the admin role",
    onclick: async () => {
      if (!(await confirmAction(title, text))) return;
      try {
        const result = await run();
        toast(result || `${label}: done`);
        await render();
      } catch (e) { failed(e); }
    },
  }, label);
}

// -- charts ------------------------------------------------------------------------------

function minutes() { return Number(sessionStorage.getItem("conveyor.minutes") || 60); }

function rangeButtons() {
  return h("div", { class: "toolbar ranges" }, "History:", RANGES.map(([m, label]) => h("button", {
    type: "button", class: m === minutes() ? "on" : "",
    onclick: () => { sessionStorage.setItem("conveyor.minutes", String(m)); render(); },
  }, label)));
}

async function charts(kind, name, panels) {
  const data = await api(`/ui/api/history?kind=${enc(kind)}&name=${enc(name)}&minutes=${minutes()}`);
  const pts = data.points.map((p) => ({ ...p, t: new Date(p.sampled_at) }));
  // the range asked for, or less while the history is younger than that
  const to = new Date(), asked = to.getTime() - data.minutes * 60000;
  const from = new Date(Math.max(asked, pts[0] ? pts[0].t.getTime() : asked));
  return h("div", { class: "charts", "data-samples": String(pts.length) }, panels.map(({ title, series }) => {
    const lines = series.map(([label, key, color]) => ({ label, color, points: pts.map((p) => ({ t: p.t, v: p[key] })) }));
    return h("div", { class: "chart" }, h("h3", { text: title }), lineChart(lines, { from, to }),
      h("div", { class: "legend" }, series.map(([label, , color]) => h("span", {}, h("i", { style: { background: color } }), label))));
  }));
}

const QUEUE_PANELS = [
  { title: "Depth", series: [["visible", "depth", "#2f6fde"], ["in flight", "in_flight", "#d9822b"], ["delayed", "delayed", "#8a63d2"]] },
  { title: "Rates (messages/s)", series: [["sent", "sent_per_sec", "#2e9d5b"], ["done", "done_per_sec", "#c8372d"]] },
];

// -- pages -------------------------------------------------------------------------------

async function queuesPage() {
  const qs = await api("/ui/api/queues");
  const sum = (k) => qs.reduce((a, q) => a + Number(q[k] || 0), 0);
  return [h("h1", { text: "Queues" }),
    h("div", { class: "cards" }, card("queues", num(qs.length)), card("visible", num(sum("depth"))),
      card("in flight", num(sum("in_flight"))), card("sent/s", rate(sum("sent_per_sec")))),
    table([
      { title: "Queue", cell: (q) => link(`#/queues/${enc(q.name)}`, q.name) },
      { title: "Visible", n: 1, cell: (q) => num(q.depth) },
      { title: "In flight", n: 1, cell: (q) => num(q.in_flight) },
      { title: "Delayed", n: 1, cell: (q) => num(q.delayed) },
      { title: "Oldest", n: 1, cell: (q) => age(q.oldest_age_sec) },
      { title: "Sent", n: 1, cell: (q) => rate(q.sent_per_sec) },
      { title: "Done", n: 1, cell: (q) => rate(q.done_per_sec) },
      { title: "Dead-letter queue", cell: (q) => (q.dead_letter_queue
        ? h("span", {}, link(`#/dead-letters/queue/${enc(q.dead_letter_queue)}`, q.dead_letter_queue), ` (${num(q.dead_letter_length)})`)
        : (q.dead_letter_of.length ? badge(`DLQ of ${q.dead_letter_of.join(", ")}`, "warn") : "–")) },
    ], qs, "No queues yet: create one with POST /v1/queues, an SQS client or conveyor.queue_create().")];
}

async function queuePage(name) {
  const [q] = (await api("/ui/api/queues")).filter((x) => x.name === name);
  if (!q) throw new Error(`queue ${name} does not exist`);
  const peek = await api(`/ui/api/queues/${enc(name)}/messages?limit=20`);
  return [h("h1", { text: `Queue ${name}` }),
    h("div", { class: "cards" }, card("visible", num(q.depth)), card("in flight", num(q.in_flight)),
      card("delayed", num(q.delayed)), card("oldest", age(q.oldest_age_sec)), card("sent total", num(q.total_sent)),
      card("sent/s", rate(q.sent_per_sec)), card("done/s", rate(q.done_per_sec))),
    storageNote(q),
    q.dead_letter_queue ? h("p", {}, "Dead letters go to ", link(`#/dead-letters/queue/${enc(q.dead_letter_queue)}`, q.dead_letter_queue),
      ` after ${plural(q.max_receive_count, "receive")}.`) : null,
    q.dead_letter_of.length ? h("p", {}, "This is the dead-letter queue of ", q.dead_letter_of.join(", "), ": ",
      link(`#/dead-letters/queue/${enc(name)}`, "browse, replay or purge"), ".") : null,
    rangeButtons(), await charts("queue", name, QUEUE_PANELS),
    h("h2", { text: "Oldest messages" }), messagesTable(name, peek)];
}

// A queue with storage of its own says so (docs/architecture.md, queue storage kinds).
function storageNote(q) {
  if (q.storage === "unlogged") {
    return h("p", { class: "storage" }, badge("unlogged", "warn"),
      " Stored unlogged: fast, but emptied by a crash of PostgreSQL and absent on replicas.");
  }
  if (q.storage !== "partitioned") return null;
  const p = q.partitioning;
  const span = (v) => (p.by === "id" ? `${num(v)} ids` : v);
  return h("p", { class: "storage" }, badge("partitioned"),
    ` Partitioned by ${p.by}, ${span(p.interval)} a partition, ${p.premake} made ahead; `,
    p.retention === null ? "partitions are kept." : `partitions are dropped ${span(p.retention)} on.`);
}

function messagesTable(queue, msgs) {
  return table([
    { title: "Id", cell: (m) => link(`#/lookup/queue/${enc(queue)}/${m.id}`, String(m.id)) },
    { title: "Sent", cell: (m) => when(m.sent_at) },
    { title: "Receives", n: 1, cell: (m) => num(m.receive_count) },
    { title: "Visible at", cell: (m) => when(m.visible_at) },
    { title: "Body", cell: (m) => h("pre", { text: m.body.length > 300 ? `${m.body.slice(0, 300)}…` : m.body }) },
  ], msgs, "No messages.");
}

async function pqueuesPage() {
  const [res, groups] = await Promise.all([api("/api/v1/resources/queues?limit=1000"), api("/api/v1/consumer-groups")]);
  return [h("h1", { text: "Partitioned queues" }),
    table([
      { title: "Queue", cell: (q) => link(`#/pqueues/${enc(q.name)}`, q.name) },
      { title: "Namespace / task", cell: (q) => [q.namespace, q.task].filter(Boolean).join(" / ") || "–" },
      { title: "Partitions", n: 1, cell: (q) => num(q.partitions) },
      { title: "Pending", n: 1, cell: (q) => num(q.messages.pending) },
      { title: "Processing", n: 1, cell: (q) => num(q.messages.processing) },
      { title: "Dead letters", n: 1, cell: (q) => num(q.messages.deadLetter) },
      { title: "Consumer groups", n: 1, cell: (q) => num(q.consumerGroups) },
    ], res.queues, "No partitioned queues yet (Queen's API: POST /api/v1/configure or a push)."),
    h("h2", { text: "Consumer groups" }), groupsTable(groups)];
}

function groupsTable(groups) {
  return table([
    { title: "Group", cell: (g) => g.name },
    { title: "Queue", cell: (g) => link(`#/pqueues/${enc(g.queueName)}`, g.queueName) },
    { title: "Lag", n: 1, cell: (g) => num(g.totalLag) },
    { title: "Partitions behind", n: 1, cell: (g) => num(g.partitionsWithLag) },
    { title: "Oldest pending", n: 1, cell: (g) => age(g.maxTimeLag) },
    { title: "Leases", n: 1, cell: (g) => num(g.members) },
    { title: "State", cell: (g) => badge(g.state, g.state === "Stable" ? "ok" : "warn") },
  ], groups, "No consumer groups.");
}

async function pqueuePage(name) {
  const q = await api(`/api/v1/resources/queues/${enc(name)}`);
  return [h("h1", { text: `Partitioned queue ${name}` }),
    h("div", { class: "cards" }, card("partitions", num(q.partitions)), card("pending", num(q.messages.pending)),
      card("processing", num(q.messages.processing)), card("dead letters", num(q.messages.deadLetter))),
    rangeButtons(), await charts("pqueue", name, [
      { title: "Lag (all groups) and leases", series: [["lag", "depth", "#2f6fde"], ["leases", "in_flight", "#d9822b"]] },
      { title: "Pushed (messages/s)", series: [["pushed", "sent_per_sec", "#2e9d5b"]] }]),
    h("h2", { text: "Consumer groups" }), groupsTable(q.consumerGroupDetails),
    h("h2", { text: "Partitions" }), table([
      { title: "Partition", cell: (p) => p.name },
      { title: "Messages", n: 1, cell: (p) => num(p.messages) },
      { title: "Head", n: 1, cell: (p) => num(p.head) },
      { title: "Last message", cell: (p) => when(p.lastMessageAt) },
      { title: "Consumers (pending)", cell: (p) => p.consumers.map((c) => `${c.consumerGroup === "__QUEUE_MODE__" ? "queue mode" : c.consumerGroup}: ${c.pending}`).join(", ") || "–" },
    ], q.partitionDetails, "No partitions yet.")];
}

async function streamsPage() {
  const ss = await api("/ui/api/streams");
  return [h("h1", { text: "Streams" }), table([
    { title: "Stream", cell: (s) => link(`#/streams/${enc(s.stream)}`, s.stream) },
    { title: "Events", n: 1, cell: (s) => num(s.depth) },
    { title: "Events/s", n: 1, cell: (s) => rate(s.events_per_sec) },
    { title: "Oldest", n: 1, cell: (s) => age(s.oldest_event_age) },
    { title: "Consumers", n: 1, cell: (s) => num(s.consumers) },
    { title: "Retries", n: 1, cell: (s) => num(s.pending_retries) },
    { title: "Dead letters", n: 1, cell: (s) => (s.dead_letters ? link(`#/dead-letters/stream/${enc(s.stream)}`, num(s.dead_letters)) : "0") },
    { title: "Last tick", cell: (s) => when(s.last_tick_time) },
    { title: "Ticker", cell: (s) => (s.ticker_paused ? badge("paused", "warn") : badge("running", "ok")) },
  ], ss, "No streams yet: conveyor streams create NAME, or POST /v1/streams."),
  h("h2", { text: "Consumers" }), consumersTable(ss.flatMap((s) => s.consumer_list))];
}

function consumersTable(cs) {
  return table([
    { title: "Stream", cell: (c) => c.stream },
    // `conveyor pipeline archive` reads as conveyor-archive (docs/pipeline.md): its lag is what is not archived yet
    { title: "Consumer", cell: (c) => (c.consumer.startsWith("conveyor-archive") ? `${c.consumer} (pipeline archive)` : c.consumer) },
    { title: "Pending events", n: 1, cell: (c) => num(c.pending_events) },
    { title: "Lag", n: 1, cell: (c) => age(c.lag) },
    { title: "Batch open", cell: (c) => (c.batch_active ? `#${c.batch_id} for ${age(c.batch_age)}` : "–") },
    { title: "Last seen", cell: (c) => when(c.last_seen) },
  ], cs, "No consumers.");
}

async function streamPage(name) {
  const [s] = (await api("/ui/api/streams")).filter((x) => x.stream === name);
  if (!s) throw new Error(`stream ${name} does not exist`);
  return [h("h1", { text: `Stream ${name}` }),
    h("div", { class: "cards" }, card("events", num(s.depth)), card("events/s", rate(s.events_per_sec)),
      card("consumers", num(s.consumers)), card("dead letters", num(s.dead_letters))),
    rangeButtons(), await charts("stream", name, [
      { title: "Events kept, retries and delayed", series: [["events", "depth", "#2f6fde"], ["retries + delayed", "delayed", "#8a63d2"], ["dead letters", "dead_letters", "#c8372d"]] },
      { title: "Events/s", series: [["appended", "sent_per_sec", "#2e9d5b"]] }]),
    h("h2", { text: "Consumers" }), consumersTable(s.consumer_list),
    h("p", {}, link(`#/dead-letters/stream/${enc(name)}`, "Dead letters of this stream"))];
}

async function topicsPage() {
  const t = await api("/ui/api/topics");
  const o = t.outbox;
  return [h("h1", { text: "Topics" }), table([
    { title: "Topic", cell: (x) => x.name },
    { title: "FIFO", cell: (x) => (x.fifo ? "yes" : "no") },
    { title: "Subscriptions", n: 1, cell: (x) => num(x.subscriptions) },
    { title: "Created", cell: (x) => when(x.created_at) },
  ], t.topics, "No SNS topics (routing-key subscriptions below need none)."),
  h("h2", { text: "Subscriptions" }), table([
    { title: "Pattern", cell: (s) => s.pattern },
    { title: "Protocol", cell: (s) => s.protocol },
    { title: "Target", cell: (s) => (s.queue ? link(`#/queues/${enc(s.queue)}`, s.queue) : s.endpoint) },
    { title: "Filter", cell: (s) => (s.filter_policy ? h("pre", { text: JSON.stringify(s.filter_policy) }) : "–") },
    { title: "Confirmed", cell: (s) => (s.confirmed ? badge("yes", "ok") : badge("pending", "warn")) },
  ], t.subscriptions, "No subscriptions."),
  h("h2", { text: "Webhook outbox" }),
  h("div", { class: "cards" }, card("pending", num(o.pending)), card("due now", num(o.due)), card("held", num(o.held)),
    card("exhausted", num(o.exhausted)), card("oldest pending", age(o.oldest_pending_age))),
  rangeButtons(), await charts("outbox", "webhooks", [
    { title: "Outbox", series: [["pending", "depth", "#2f6fde"], ["due", "in_flight", "#d9822b"], ["held + exhausted", "dead_letters", "#c8372d"]] }]),
  h("h2", { text: "Deliveries held or exhausted" }), deliveriesTable(o.stuck_deliveries),
  h("h2", { text: "Deliveries pending" }), deliveriesTable(o.pending_deliveries)];
}

function deliveriesTable(ds) {
  return table([
    { title: "Id", cell: (d) => String(d.id) },
    { title: "Endpoint", cell: (d) => d.endpoint },
    { title: "State", cell: (d) => badge(d.state, d.state === "pending" ? "" : "bad") },
    { title: "Attempts", n: 1, cell: (d) => `${d.attempt}/${d.max_attempts}` },
    { title: "Next attempt", cell: (d) => when(d.next_attempt_at) },
    { title: "Last error", cell: (d) => d.held_reason || d.last_error || "–" },
  ], ds, "None.");
}

async function schedulesPage() {
  const ss = await api("/v1/schedules");
  return [h("h1", { text: "Schedules" }), table([
    { title: "Schedule", cell: (s) => s.name },
    { title: "When", cell: (s) => h("span", { title: s.cron || "" }, s.human_readable) },
    { title: "Target", cell: (s) => (s.target_kind === "queue" ? link(`#/queues/${enc(s.target)}`, s.target) : `${s.target_kind} ${s.target}`) },
    { title: "Status", cell: (s) => badge(s.status, s.status === "active" ? "ok" : "warn") },
    { title: "Next fires", cell: (s) => h("span", { class: "next-fires" }, (s.next_fires || []).slice(0, 3).map(when).join(" · ") || "–") },
    { title: "Last fired", cell: (s) => when(s.last_fired_at) },
    { title: "Fired", n: 1, cell: (s) => num(s.fire_count) },
    { title: "Failures", n: 1, cell: (s) => (s.consecutive_failures ? h("span", { class: "error", title: s.last_error || "" }, String(s.consecutive_failures)) : "0") },
  ], ss, "No schedules yet: POST /v1/schedules or conveyor schedules create.")];
}

// -- dead letters --------------------------------------------------------------------------

async function deadLettersPage() {
  const [qs, ss, pq] = await Promise.all([api("/ui/api/queues"), api("/ui/api/streams"), api("/api/v1/dlq?limit=1")]);
  const dlqs = qs.filter((q) => q.dead_letter_of.length);
  return [h("h1", { text: "Dead letters" }),
    h("h2", { text: "Dead-letter queues" }), table([
      { title: "Queue", cell: (q) => link(`#/dead-letters/queue/${enc(q.name)}`, q.name) },
      { title: "Of", cell: (q) => q.dead_letter_of.join(", ") },
      { title: "Messages", n: 1, cell: (q) => num(q.depth + q.in_flight + q.delayed) },
      { title: "Oldest", n: 1, cell: (q) => age(q.oldest_age_sec) },
      { title: "", cell: (q) => h("span", { class: "toolbar" }, replayQueueButton(q.name), purgeQueueButton(q.name)) },
    ], dlqs, "No queue has a dead-letter queue (a redrive policy)."),
    h("h2", { text: "Streams" }), table([
      { title: "Stream", cell: (s) => link(`#/dead-letters/stream/${enc(s.stream)}`, s.stream) },
      { title: "Dead letters", n: 1, cell: (s) => num(s.dead_letters) },
    ], ss, "No streams."),
    h("h2", { text: "Partitioned queues" }),
    h("p", {}, link("#/dead-letters/pqueue", `${num(pq.total)} dead letters`), " in partitioned queues.")];
}

const replayQueueButton = (name) => adminButton("Replay all", `Replay ${name}?`,
  `Move every message of ${name} back to the queue it was dead-lettered from.`,
  async () => { const t = await api(`/ui/api/queues/${enc(name)}/redrives`, { method: "POST" }); return `replaying ${plural(t.to_move, "message")}`; },
  "caution");

const purgeQueueButton = (name) => adminButton("Purge", `Purge ${name}?`,
  `Delete every message of ${name}. This cannot be undone.`,
  async () => { const r = await api(`/v1/queues/${enc(name)}/purge`, { method: "POST" }); return `purged ${r.deleted} messages`; });

async function queueDeadLettersPage(name) {
  const [msgs, tasks] = await Promise.all([api(`/ui/api/queues/${enc(name)}/messages?limit=100`),
    api(`/ui/api/queues/${enc(name)}/redrives`)]);
  return [h("h1", { text: `Dead letters in ${name}` }),
    h("div", { class: "toolbar" }, replayQueueButton(name), purgeQueueButton(name), link(`#/queues/${enc(name)}`, "queue charts")),
    tasks.length ? h("p", { class: "muted" }, `Last replay: ${tasks[0].status}, ${tasks[0].moved} of ${tasks[0].to_move} moved (${when(tasks[0].started_at)}).`) : null,
    messagesTable(name, msgs)];
}

async function streamDeadLettersPage(name) {
  const dls = await api(`/v1/streams/${enc(name)}/dead-letters?max=200`);
  const base = `/v1/streams/${enc(name)}/dead-letters`;
  return [h("h1", { text: `Dead letters of stream ${name}` }),
    h("div", { class: "toolbar" },
      adminButton("Replay all", `Replay every dead letter of ${name}?`, "Each is appended to the stream again; every consumer sees it.",
        async () => `replayed ${(await api(`${base}/replay`, { method: "POST" })).replayed}`, "caution"),
      adminButton("Purge", `Purge the dead letters of ${name}?`, "Delete every dead letter of this stream. This cannot be undone.",
        async () => `purged ${(await api(`${base}?older_than=0`, { method: "DELETE" })).purged}`)),
    table([
      { title: "Id", cell: (d) => String(d.id) },
      { title: "Consumer", cell: (d) => d.consumer },
      { title: "Dead since", cell: (d) => when(d.dead_at) },
      { title: "Reason", cell: (d) => d.reason || "–" },
      { title: "Event", cell: (d) => h("pre", { text: `${d.event.type ?? ""} ${d.event.data ?? ""}`.trim() }) },
      { title: "", cell: (d) => adminButton("Replay", `Replay dead letter ${d.id}?`, "Append this event to the stream again.",
        async () => `replayed as event ${(await api(`${base}/${d.id}/replay`, { method: "POST" })).event_id}`) },
    ], dls, "No dead letters.")];
}

async function pqueueDeadLettersPage() {
  const found = await api("/api/v1/dlq?limit=200");
  return [h("h1", { text: "Dead letters of partitioned queues" }), table([
    { title: "Queue", cell: (d) => link(`#/pqueues/${enc(d.queue)}`, d.queue) },
    { title: "Partition", cell: (d) => d.partition },
    { title: "Group", cell: (d) => d.consumerGroup || "queue mode" },
    { title: "Failed", cell: (d) => when(d.failedAt) },
    { title: "Error", cell: (d) => d.errorMessage || "–" },
    { title: "Message", cell: (d) => link(`#/lookup/pqueue/${d.partitionId}/${enc(d.transactionId)}`, d.transactionId) },
    { title: "Payload", cell: (d) => h("pre", { text: JSON.stringify(d.data) }) },
    { title: "", cell: (d) => adminButton("Retry", `Retry ${d.transactionId}?`, "Push the message back into its partition.",
      async () => { await api(`/api/v1/messages/${d.partitionId}/${enc(d.transactionId)}/retry`, { method: "POST" }); return "retried"; }) },
  ], found.messages, "No dead letters.")];
}

// -- message lookup ------------------------------------------------------------------------

function lookupForms(queue = "", id = "", pid = "", tid = "") {
  return h("div", {},
    h("form", { class: "inline", id: "lookup-queue", onsubmit: (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      location.hash = `#/lookup/queue/${enc(f.get("queue"))}/${enc(f.get("id"))}`;
    } }, h("label", {}, "Queue", h("input", { name: "queue", value: queue, required: true })),
      h("label", {}, "Message id", h("input", { name: "id", value: id, required: true, inputmode: "numeric", pattern: "[0-9]+" })),
      h("button", { class: "primary", type: "submit" }, "Look up")),
    h("form", { class: "inline", id: "lookup-pqueue", onsubmit: (e) => {
      e.preventDefault();
      const f = new FormData(e.target);
      location.hash = `#/lookup/pqueue/${enc(f.get("pid"))}/${enc(f.get("tid"))}`;
    } }, h("label", {}, "Partition id", h("input", { name: "pid", value: pid, required: true, size: 36 })),
      h("label", {}, "Transaction id", h("input", { name: "tid", value: tid, required: true, size: 36 })),
      h("button", { class: "primary", type: "submit" }, "Look up")));
}

function traceOf(copy) {
  const sys = copy.system_attributes || {}, hdr = copy.headers || {};
  return sys.AWSTraceHeader || sys.traceparent || hdr.traceparent || null;
}

async function lookupPage(kind, a, b) {
  const out = [h("h1", { text: "Message lookup" })];
  if (kind === "queue") {
    out.push(lookupForms(a, b));
    const m = await api(`/ui/api/queues/${enc(a)}/messages/${enc(b)}`);
    if (!m.found) { out.push(h("p", { class: "error", text: m.error })); return out; }
    const trace = m.copies.map(traceOf).find(Boolean);
    out.push(h("div", { class: "cards" }, card("message uuid", m.message_uuid), card("trace", trace || "none")),
      h("h2", { text: "History" }), table([
        { title: "Queue", cell: (c) => link(`#/queues/${enc(c.queue)}`, c.queue) },
        { title: "Id", n: 1, cell: (c) => String(c.id) },
        { title: "State", cell: (c) => badge(c.state, { completed: "ok", failed: "bad", visible: "", in_flight: "warn" }[c.state] ?? "") },
        { title: "Sent", cell: (c) => when(c.sent_at) },
        { title: "First received", cell: (c) => when(c.first_received_at) },
        { title: "Receives", n: 1, cell: (c) => num(c.receive_count) },
        { title: "Dead-lettered from", cell: (c) => c.dead_lettered_from || "–" },
        { title: "Archived", cell: (c) => when(c.archived_at) },
        { title: "Error", cell: (c) => c.error || "–" },
      ], m.copies),
      h("h2", { text: "Body" }), h("pre", { class: "body", text: m.copies.at(-1)?.body ?? "" }));
  } else if (kind === "pqueue") {
    out.push(lookupForms("", "", a, b));
    const [m, t] = await Promise.all([api(`/api/v1/messages/${enc(a)}/${enc(b)}`), api(`/api/v1/traces/${enc(a)}/${enc(b)}`)]);
    out.push(h("div", { class: "cards" }, card("queue", m.queuePath), card("status", m.status), card("retries", num(m.retryCount)),
      card("trace id", m.traceId || "none")),
    h("h2", { text: "Consumer groups" }), table([
      { title: "Group", cell: (g) => (g.name === "__QUEUE_MODE__" ? "queue mode" : g.name) },
      { title: "Consumed", cell: (g) => (g.consumed ? badge("yes", "ok") : badge("no", "warn")) },
      { title: "Lease until", cell: (g) => when(g.leaseExpiresAt) },
    ], m.consumerGroups, "No consumer has read this partition."),
    h("h2", { text: "Trace" }), table([
      { title: "At", cell: (x) => when(x.createdAt) },
      { title: "Event", cell: (x) => x.eventType },
      { title: "Group", cell: (x) => x.consumerGroup || "–" },
      { title: "Names", cell: (x) => (x.traceNames || []).join(", ") || "–" },
      { title: "Data", cell: (x) => h("pre", { text: JSON.stringify(x.data) }) },
    ], t.traces, "No trace events recorded (POST /api/v1/traces)."),
    h("h2", { text: "Payload" }), h("pre", { class: "body", text: JSON.stringify(m.payload, null, 2) }));
  } else {
    out.push(lookupForms());
  }
  return out;
}

// -- routing -------------------------------------------------------------------------------

const ROUTES = [
  [/^#\/queues$/, queuesPage, "queues"],
  [/^#\/queues\/(.+)$/, queuePage, "queues"],
  [/^#\/pqueues$/, pqueuesPage, "pqueues"],
  [/^#\/pqueues\/(.+)$/, pqueuePage, "pqueues"],
  [/^#\/streams$/, streamsPage, "streams"],
  [/^#\/streams\/(.+)$/, streamPage, "streams"],
  [/^#\/topics$/, topicsPage, "topics"],
  [/^#\/schedules$/, schedulesPage, "schedules"],
  [/^#\/dead-letters$/, deadLettersPage, "dead-letters"],
  [/^#\/dead-letters\/queue\/(.+)$/, queueDeadLettersPage, "dead-letters"],
  [/^#\/dead-letters\/stream\/(.+)$/, streamDeadLettersPage, "dead-letters"],
  [/^#\/dead-letters\/pqueue$/, pqueueDeadLettersPage, "dead-letters"],
  [/^#\/lookup$/, () => lookupPage(), "lookup"],
  [/^#\/lookup\/(queue|pqueue)\/([^/]+)\/([^/]+)$/, lookupPage, "lookup"],
];

function failed(e) {
  if (e instanceof Unauthorized) { signIn(e.message); return; }
  toast(e.message, true);
}

let rendering = 0;  // the latest render wins: an older one still waiting on the API draws nothing

async function render() {
  if (!authorization()) { signIn(); return; }
  const turn = ++rendering;
  const hash = location.hash || "#/queues";
  const route = ROUTES.find(([re]) => re.test(hash));
  for (const a of document.querySelectorAll("#nav a")) a.classList.toggle("active", a.dataset.page === route?.[2]);
  if (!route) { view.replaceChildren(h("p", { class: "error", text: "No such page." })); return; }
  const args = hash.match(route[0]).slice(1).map(decodeURIComponent);
  try {
    if (!me) await whoami();
    const content = await route[1](...args);
    if (turn !== rendering) return;
    view.replaceChildren(...[content].flat().filter(Boolean));
    view.dataset.page = route[2];
    view.dataset.hash = hash;
    view.dataset.loaded = String(Date.now());
  } catch (e) {
    if (turn !== rendering) return;
    if (e instanceof Unauthorized) { signIn(e.message); return; }
    view.replaceChildren(h("p", { class: "error", role: "alert", text: e.message }));
    view.dataset.hash = hash;
    view.dataset.loaded = String(Date.now());
  }
}

async function whoami() {
  me = await api("/ui/api/whoami");
  document.getElementById("who").textContent = `role: ${me.role}`;
  document.getElementById("logout").hidden = false;
}

function signIn(message) {
  me = null;
  sessionStorage.removeItem(TOKEN_KEY);
  document.getElementById("who").textContent = "";
  document.getElementById("logout").hidden = true;  // nobody to sign out on the sign-in screen
  const err = document.getElementById("login-error");
  err.hidden = !message;
  err.textContent = message || "";
  const dialog = document.getElementById("login");
  if (!dialog.open) dialog.showModal();
}

document.getElementById("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const token = document.getElementById("token").value.trim();
  if (!token) return;
  sessionStorage.setItem(TOKEN_KEY, token);
  try {
    await whoami();
  } catch (err) {
    sessionStorage.removeItem(TOKEN_KEY);
    const box = document.getElementById("login-error");
    box.textContent = err.message;
    box.hidden = false;
    return;
  }
  document.getElementById("token").value = "";
  document.getElementById("login").close();
  render();
});
document.getElementById("login").addEventListener("cancel", (e) => e.preventDefault());
document.getElementById("logout").addEventListener("click", () => { signIn(); view.replaceChildren(); });
document.getElementById("live").addEventListener("change", (e) => {
  clearInterval(liveTimer);
  if (e.target.checked) liveTimer = setInterval(() => { if (!document.querySelector("dialog[open]")) render(); }, 10000);
});
const zoneSwitch = document.getElementById("zone");
zoneSwitch.value = zone() ?? "local";
zoneSwitch.addEventListener("change", (e) => {
  if (e.target.value === "UTC") sessionStorage.setItem(ZONE_KEY, "UTC"); else sessionStorage.removeItem(ZONE_KEY);
  setChartZone(zone());
  render();
});
setChartZone(zone());
window.addEventListener("hashchange", render);
render();
