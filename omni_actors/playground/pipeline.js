// The Pipeline tab and the health pill: /v1/status drawn as a graph of the chosen model's stages and
// replicas, updated in place while the tab is shown; the pill says whether the server answers and is healthy.
const $ = (id) => document.getElementById(id);
const STATUS_REFRESH_MS = 2000;

function svg(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

const W = 236, H = 114, GAP = 60;
const MIN_SCALE = 0.8;  // the graph shrinks to fit no further (its 12 px text stays readable): a narrow screen scrolls it
const ms = (v) => (v == null ? "–" : `${v < 1 ? v.toFixed(2) : Math.round(v * 10) / 10} ms`);

// The graph's shape (stages, edges, replica counts): drawn anew only when it changes (a model switch, a
// replica added); each refresh otherwise updates the same nodes, so a hovered replica keeps its tooltip.
const shapeOf = (status) => `${status.pipeline}|${status.stages.map((s) => `${s.stage_id}<${s.inputs}>${s.replicas.length}`).join(";")}`;

function buildGraph(status) {
  const depth = new Map();
  for (const s of status.stages) depth.set(s.stage_id, Math.max(0, ...s.inputs.map((i) => depth.get(i) + 1)));
  const rows = new Map();
  const pos = new Map();
  for (const s of status.stages) {
    const d = depth.get(s.stage_id);
    const r = rows.get(d) || 0;
    rows.set(d, r + 1);
    pos.set(s.stage_id, { x: 10 + d * (W + GAP), y: 10 + r * (H + 20) });
  }
  const width = 20 + (Math.max(...depth.values()) + 1) * (W + GAP);
  const height = 20 + Math.max(...rows.values()) * (H + 20);
  // A group, not an image: a screen reader reaches each stage and replica by its own name.
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": `pipeline ${status.pipeline}` });
  root.style.minWidth = `${Math.round(width * MIN_SCALE)}px`;
  const defs = svg("defs", {});
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b8" }));
  defs.append(marker);
  root.append(defs);
  for (const s of status.stages) {
    for (const src of s.inputs) {
      const a = pos.get(src), b = pos.get(s.stage_id);
      root.append(svg("path", { class: "edge", "aria-hidden": "true", d: `M${a.x + W},${a.y + H / 2} L${b.x},${b.y + H / 2}` }));
    }
  }
  for (const s of status.stages) {
    const { x, y } = pos.get(s.stage_id);
    const g = svg("g", { role: "group", "data-stage": s.stage_id, "data-testid": `stage-${s.stage_id}` });
    g.append(svg("rect", { x, y, width: W, height: H, rx: 8 }));
    g.append(svg("text", { x: x + 10, y: y + 18, class: "title", "aria-hidden": "true" }, `${s.stage_id} · ${s.name}`));
    g.append(svg("text", { x: x + 10, y: y + 36, "aria-hidden": "true" },
                 s.execution_type + (s.final_output_type ? ` → ${s.final_output_type}` : "")));
    for (const [field, dy] of [["load", 54], ["engine", 72], ["times", 90]]) {
      const attrs = { x: x + 10, y: y + dy, "data-field": field, "aria-hidden": "true" };
      if (field === "times") attrs["data-testid"] = `stage-${s.stage_id}-times`;
      g.append(svg("text", attrs));
    }
    s.replicas.forEach((r, i) => {
      // In the Tab order, its words (the hover's tooltip) shown on focus too: a keyboard reaches them.
      const dot = svg("circle", { cx: x + 14 + i * 16, cy: y + H - 10, r: 5, role: "img", tabindex: 0,
                                  "data-replica": i, "data-testid": `replica-${s.stage_id}-${i}` });
      dot.append(svg("title", {}));
      g.append(dot);
    });
    root.append(g);
  }
  return root;
}

// The numbers and health of each stage and replica, set on the nodes buildGraph made.
function updateGraph(root, status) {
  for (const s of status.stages) {
    const g = root.querySelector(`[data-stage="${s.stage_id}"]`);
    const health = s.healthy ? "healthy" : "unhealthy";
    g.setAttribute("class", `stage ${health}`);
    // (queue_limit is each replica's: the stage admits that many per replica before a 429)
    const load = `in flight ${s.in_flight} / limit ${s.queue_limit * s.replicas.length}`;
    const times = `step ${ms(s.step_ms)} · first out ${ms(s.first_output_ms)}`;
    g.setAttribute("aria-label", `stage ${s.stage_id} ${s.name} (${s.execution_type}): ${health}, ${load}, ${times}`);
    g.querySelector("[data-field=load]").textContent = load;
    g.querySelector("[data-field=engine]").textContent = `engine requests ${s.engine_requests}`;
    g.querySelector("[data-field=times]").textContent = times;
    s.replicas.forEach((r, i) => {
      const dot = g.querySelector(`[data-replica="${i}"]`);
      const words = `replica ${r.replica}: ${r.ready ? "ready" : "not ready"}, pid ${r.pid}, ${r.in_flight} in flight, ${r.restarts} restarts, ${r.steps} steps of ${ms(r.step_ms)}`;
      dot.setAttribute("class", `replica ${r.ready ? "ready" : "down"}`);
      dot.setAttribute("aria-label", `stage ${s.stage_id} ${words}`);
      const title = dot.querySelector("title");
      if (title.textContent !== words) title.textContent = words;
      if (tipFor === dot) showTip(dot);  // (its words changed while it has the focus)
    });
  }
}

// A focused replica's words (its name, as the hover's tooltip says them) shown by it, in the panel rather
// than the graph's box (which scrolls and would clip them); Escape or a blur hides them.
let tipFor = null;
function showTip(dot) {
  const panel = $("panel-pipeline");
  let tip = $("pipeline-tip");
  if (!tip) {
    tip = document.createElement("div");
    Object.assign(tip, { id: "pipeline-tip", role: "tooltip", className: "tip" });
    tip.setAttribute("data-testid", "pipeline-tip");
    panel.append(tip);
  }
  tipFor = dot;
  tip.textContent = dot.getAttribute("aria-label");
  tip.hidden = false;
  const at = dot.getBoundingClientRect(), inPanel = panel.getBoundingClientRect();
  const left = at.left - inPanel.left + at.width / 2 - tip.offsetWidth / 2;
  tip.style.left = `${Math.max(0, Math.min(left, panel.clientWidth - tip.offsetWidth))}px`;
  const above = at.top - inPanel.top - tip.offsetHeight - 6;
  tip.style.top = `${above >= 0 ? above : at.bottom - inPanel.top + 6}px`;
}

function hideTip() {
  tipFor = null;
  const tip = $("pipeline-tip");
  if (tip) tip.hidden = true;
}

function bindTips(box) {
  box.addEventListener("focusin", (e) => { if (e.target.dataset?.replica !== undefined) showTip(e.target); });
  box.addEventListener("focusout", hideTip);
  box.addEventListener("scroll", () => { if (tipFor) showTip(tipFor); });  // (it stays by its replica)
  box.addEventListener("keydown", (e) => {
    if (e.key === "Escape" && tipFor) {
      hideTip();
      e.stopPropagation();  // (Escape's page-wide meaning, stopping a panel, is not this one's)
    }
  });
}

function drawPipeline(status) {
  const box = $("pipeline-graph");
  const shape = shapeOf(status);
  if (!box.firstElementChild || box.dataset.shape !== shape) {  // (a model switch empties it)
    // A replica that has the focus keeps it in the new drawing, if it is still there.
    const focused = box.contains(document.activeElement) ? document.activeElement.dataset.testid : null;
    hideTip();
    box.replaceChildren(buildGraph(status));
    box.dataset.shape = shape;
    if (focused) box.querySelector(`[data-testid="${focused}"]`)?.focus();
  }
  updateGraph(box.firstElementChild, status);
}

// The pill is a live region (a screen reader hears "unreachable"): set only when it changes, not each refresh.
export function showHealth(word, ok = null) {
  const pill = $("health");
  if (pill.textContent !== word) pill.textContent = word;
  pill.className = ok === null ? "pill" : `pill ${ok ? "ok" : "bad"}`;
}

// /v1/status cannot tell a stage still loading its model (a server started or restarted under the page)
// from one that went down: /health (public) can, its status "loading" until every stage is ready.
async function stillLoading() {
  try {
    return (await (await fetch("/health")).json()).status === "loading";
  } catch {
    return false;  // (not answering: the status read just now did, so say what it said)
  }
}

let ctx = null;  // { api, state, showError }, from bindStatus
let statusTimer = null;
let refreshing = false;
let statusFailed = false;  // the error shown is the status's own: cleared when the server answers again
let unreachable = false;   // a request found no server: the pill says so until one answers again

export function bindStatus(context) {
  ctx = context;
  bindTips($("pipeline-graph"));
}

export async function refreshStatus() {
  const { api, state, showError } = ctx;
  clearTimeout(statusTimer);
  refreshing = true;
  try {
    const status = await (await api("/v1/status")).json();
    // A server of several pipelines lists each; draw the one behind the chosen model.
    const all = status.pipelines || [status];
    const shown = all.find((p) => p.models.includes(state.model?.id));
    if (shown) drawPipeline(shown);  // (none before the models are known)
    const healthy = all.every((p) => p.healthy);
    if (healthy) showHealth("healthy", true);
    else if (await stillLoading()) showHealth("loading");  // (as the pill reads while the page waits for it)
    else showHealth("degraded", false);
    if (statusFailed) showError("");  // the server answers again: its last failure is over
    statusFailed = false;
  } catch (err) {
    if (err.name === "AbortError") return;  // the model changed: its own refresh is under way
    statusFailed = true;
    showError(`server status: ${err.message}`);
    if (err.status === 401) {  // the server answered: the key prompt is up, and the page reads again once it is used
      showHealth("API key needed", false);
      return;
    }
    showHealth(unreachable ? "unreachable" : `error ${err.status || ""}`.trim(), false);
  } finally {
    refreshing = false;
  }
  if (!$("panel-pipeline").hidden) statusTimer = setTimeout(refreshStatus, STATUS_REFRESH_MS);
}

// Any request (a panel's too) that finds no server says so in the pill, whichever tab is shown; the next
// that gets an answer has the status read again.
export function serverGone() {
  unreachable = true;
  showHealth("unreachable", false);
}

export function serverAnswered() {
  if (!unreachable) return;
  unreachable = false;
  if (!refreshing) refreshStatus();
}
