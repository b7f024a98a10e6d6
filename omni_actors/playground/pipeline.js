// The Pipeline tab and the health pill: /v1/status drawn as a graph of the chosen model's stages and
// replicas, redrawn while the tab is shown; the pill says whether the server answers and is healthy.
const $ = (id) => document.getElementById(id);
const STATUS_REFRESH_MS = 2000;

function svg(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function drawPipeline(status) {
  const W = 236, H = 114, GAP = 60;
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
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": `pipeline ${status.pipeline}` });
  const defs = svg("defs", {});
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" });
  marker.append(svg("path", { d: "M0,0 L10,5 L0,10 z", fill: "#9aa3b8" }));
  defs.append(marker);
  root.append(defs);
  for (const s of status.stages) {
    for (const src of s.inputs) {
      const a = pos.get(src), b = pos.get(s.stage_id);
      root.append(svg("path", { class: "edge", d: `M${a.x + W},${a.y + H / 2} L${b.x},${b.y + H / 2}` }));
    }
  }
  for (const s of status.stages) {
    const { x, y } = pos.get(s.stage_id);
    const g = svg("g", { class: `stage ${s.healthy ? "healthy" : "unhealthy"}`, "data-stage": s.stage_id,
                         "data-testid": `stage-${s.stage_id}` });
    g.append(svg("rect", { x, y, width: W, height: H, rx: 8 }));
    g.append(svg("text", { x: x + 10, y: y + 18, class: "title" }, `${s.stage_id} · ${s.name}`));
    g.append(svg("text", { x: x + 10, y: y + 36 }, s.execution_type + (s.final_output_type ? ` → ${s.final_output_type}` : "")));
    g.append(svg("text", { x: x + 10, y: y + 54 }, `in flight ${s.in_flight} / queue ${s.queue_limit}`));
    g.append(svg("text", { x: x + 10, y: y + 72 }, `engine requests ${s.engine_requests}`));
    const ms = (v) => (v == null ? "–" : `${v < 1 ? v.toFixed(2) : Math.round(v * 10) / 10} ms`);
    g.append(svg("text", { x: x + 10, y: y + 90, "data-testid": `stage-${s.stage_id}-times` },
                 `step ${ms(s.step_ms)} · first out ${ms(s.first_output_ms)}`));
    s.replicas.forEach((r, i) => {
      const dot = svg("circle", { cx: x + 14 + i * 16, cy: y + H - 10, r: 5, class: `replica ${r.ready ? "ready" : "down"}` });
      dot.append(svg("title", {}, `replica ${r.replica}: ${r.ready ? "ready" : "not ready"}, pid ${r.pid}, ${r.in_flight} in flight, ${r.restarts} restarts, ${r.steps} steps of ${ms(r.step_ms)}`));
      g.append(dot);
    });
    root.append(g);
  }
  $("pipeline-graph").replaceChildren(root);
}

export function showHealth(word, ok = null) {
  const pill = $("health");
  pill.textContent = word;
  pill.className = ok === null ? "pill" : `pill ${ok ? "ok" : "bad"}`;
}

let ctx = null;  // { api, state, showError }, from bindStatus
let statusTimer = null;
let refreshing = false;
let statusFailed = false;  // the error shown is the status's own: cleared when the server answers again
let unreachable = false;   // a request found no server: the pill says so until one answers again

export function bindStatus(context) { ctx = context; }

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
    showHealth(healthy ? "healthy" : "degraded", healthy);
    if (statusFailed) showError("");  // the server answers again: its last failure is over
    statusFailed = false;
  } catch (err) {
    if (err.name === "AbortError") return;  // the model changed: its own refresh is under way
    statusFailed = true;
    showHealth("unreachable", false);
    showError(`server status: ${err.message}`);
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
