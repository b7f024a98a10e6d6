// The playground page: finds what each loaded pipeline can do (the model picker switches between them),
// shows those panels, keeps the API key.
import { bindPanels } from "./panels.js";
import { bindTranscribe } from "./transcribe.js";
import { Talk } from "./talk.js";
import { bindStops, stopPanel } from "./work.js";

const KEY_STORE = "omni-actors.api-key";
const STATUS_REFRESH_MS = 2000;
const LOADING_RETRY_MS = 1000;
const $ = (id) => document.getElementById(id);

// abort: every API call's signal; a model switch aborts it (the last model's answers are not this one's).
// A panel's requests take their own signal under it (work.js), which its Stop aborts.
export const state = { key: sessionStorage.getItem(KEY_STORE) || "", models: [], model: null, talk: null,
                       routes: new Set(), abort: new AbortController() };
window.__playground = state;  // read by the browser tests

// Errors: the page's own (status, key, models: panel "") and each panel's, shown with that panel only (a
// request that fails while another tab is shown waits there; its tab is marked). A message, or an Error
// (its message; an aborted request's says nothing: the user stopped it or moved on); "" clears.
const errors = new Map();
export function showError(message, panel = "") {
  if (message instanceof Error || message instanceof DOMException) {
    if (message.name === "AbortError") return;
    message = message.message;
  }
  if (message) errors.set(panel, message);
  else errors.delete(panel);
  renderErrors();
}

function renderErrors() {
  const shown = $("tabs").querySelector("[aria-selected=true]")?.dataset.tab;
  const message = [errors.get(shown), errors.get("")].filter(Boolean).join("\n");
  const el = $("error");
  el.textContent = message;
  el.hidden = !message;
  for (const b of $("tabs").querySelectorAll("button")) {
    b.classList.toggle("failed", shown !== b.dataset.tab && errors.has(b.dataset.tab));
  }
}

export async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  if (state.key) headers.set("Authorization", `Bearer ${state.key}`);
  let resp;
  try {
    resp = await fetch(path, { signal: state.abort.signal, ...options, headers });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Error(`the server did not answer (${err.message}): is it still running?`);
  }
  if (resp.status === 401) {
    $("key-form").hidden = false;
    throw new Error("this server needs an API key");
  }
  if (!resp.ok) {
    let message = `${resp.status} ${resp.statusText}`;
    try { message = (await resp.json()).error?.message || message; } catch { /* not JSON */ }
    throw new Error(message);
  }
  return resp;
}

function panelsFor(model) {
  // A full-duplex model (Moshi) is served only as realtime sessions: Talk, not the REST panels.
  if ((model.features || []).includes("full_duplex")) return ["talk", "pipeline"];
  const out = new Set(model.output_types || []);
  const panels = [];
  if (out.has("audio") && out.has("text")) panels.push("talk");
  if (out.has("text")) panels.push("chat");
  if (out.has("audio")) panels.push("speak");
  if (out.has("image")) panels.push("images");
  if (out.has("video")) panels.push("videos");
  if (out.has("transcript")) panels.push("transcribe");
  panels.push("pipeline");
  return panels;
}

function selectTab(name) {
  for (const section of document.querySelectorAll("section[data-panel]")) section.hidden = section.dataset.panel !== name;
  for (const b of document.querySelectorAll("#tabs button")) {
    b.setAttribute("aria-selected", String(b.dataset.tab === name));
    b.tabIndex = b.dataset.tab === name ? 0 : -1;
  }
  renderErrors();
  if (name === "pipeline") refreshStatus();
}

function showModel(name) {
  state.abort.abort();  // the last model's requests end here
  state.abort = new AbortController();
  stopTalk();  // its realtime session and microphone too (Talk may not even be a tab now)
  state.model = state.models.find((m) => m.id === name);
  $("pipeline-graph").replaceChildren();  // the last model's graph is not this one's: redrawn on its next status
  const tabs = $("tabs");
  tabs.replaceChildren();
  const panels = panelsFor(state.model);
  for (const p of panels) {
    const b = document.createElement("button");
    b.textContent = p[0].toUpperCase() + p.slice(1);
    b.dataset.tab = p;
    b.setAttribute("data-testid", `tab-${p}`);
    b.setAttribute("role", "tab");
    b.setAttribute("aria-controls", `panel-${p}`);
    b.onclick = () => selectTab(p);
    tabs.append(b);
  }
  errors.clear();  // (the last model's)
  selectTab(panels[0]);
  document.dispatchEvent(new CustomEvent("model-changed", { detail: state.model }));
}

// ---- the pipeline view ------------------------------------------------------

function svg(tag, attrs, text) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

export function drawPipeline(status) {
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

let statusTimer = null;
let statusFailed = false;  // the error shown is the status's own: cleared when the server answers again
async function refreshStatus() {
  clearTimeout(statusTimer);
  try {
    const status = await (await api("/v1/status")).json();
    // A server of several pipelines lists each; draw the one behind the chosen model.
    const all = status.pipelines || [status];
    drawPipeline(all.find((p) => p.models.includes(state.model?.id)) || status);
    const healthy = all.every((p) => p.healthy);
    const pill = $("health");
    pill.textContent = healthy ? "healthy" : "degraded";
    pill.className = `pill ${healthy ? "ok" : "bad"}`;
    if (statusFailed) showError("");  // the server answers again: its last failure is over
    statusFailed = false;
  } catch (err) {
    if (err.name === "AbortError") return;  // the model changed: its own refresh is under way
    statusFailed = true;
    const pill = $("health");
    pill.textContent = "unreachable";
    pill.className = "pill bad";
    showError(`server status: ${err.message}`);
  }
  if (!$("panel-pipeline").hidden) statusTimer = setTimeout(refreshStatus, STATUS_REFRESH_MS);
}

// ---- talk --------------------------------------------------------------------

// One line per user turn (its item id): deltas append while it is spoken, the completed transcript replaces them.
function showUserTurn(itemId, text, done) {
  const box = $("talk-user");
  let line = [...box.children].find((el) => el.dataset.item === itemId);
  if (!line) {
    line = document.createElement("div");
    line.dataset.item = itemId;
    box.append(line);
  }
  line.classList.toggle("live", !done);
  if (!done) line.textContent += text;
  else if (text !== null) line.textContent = text.trim();
  else {  // transcription failed: keep what was heard so far
    line.classList.add("failed");
    if (!line.textContent) line.textContent = "(not transcribed)";
  }
}

// Ends the session (a click on Stop, a model switch, or the server closing the socket): mic and socket closed.
async function stopTalk() {
  const talk = state.talk;
  if (!talk) return;
  state.talk = null;
  $("talk-button").textContent = "Start talking";
  await talk.stop();
}

function bindTalk() {
  const button = $("talk-button");
  const say = (message) => showError(message, "talk");
  button.onclick = async () => {
    if (state.talk) return stopTalk();
    say("");
    const answer = $("talk-transcript");
    const talk = new Talk({
      model: state.model.id, key: state.key,
      transcribe: (state.model.output_types || []).includes("transcript"),  // else the server says .failed per turn
      onAnswer: (delta, fresh) => { if (fresh && answer.textContent) answer.textContent += "\n"; answer.textContent += delta; },
      onUser: showUserTurn,
      onState: (s) => { $("talk-state").textContent = s; },
      onError: say,
      onClosed: () => { if (state.talk === talk) { say("the realtime connection closed"); stopTalk(); } },
    });
    state.talk = talk;
    button.textContent = "Stop";
    button.disabled = true;  // connecting: a second click must not start a second session
    try {
      await talk.start();
    } catch (err) {
      if (state.talk === talk) {  // (else it was stopped while connecting: nothing to say)
        say(err);
        await stopTalk();
      }
    } finally {
      button.disabled = false;
    }
  };
}

// ---- start -------------------------------------------------------------------

// While omni-run loads its models the server already answers: /health says which stages are still loading.
async function loaded() {
  const started = performance.now();
  for (;;) {
    let health = null;
    try { health = await (await fetch("/health")).json(); } catch { /* not answering yet */ }
    if (health?.status !== "loading") {
      $("loading").hidden = true;
      return;
    }
    const waiting = (health.unhealthy_stages || []).map((s) => s.pipeline ? `${s.pipeline}/${s.model_stage}` : s.model_stage);
    const el = $("loading");
    el.textContent = `Loading models: ${waiting.join(", ")} (${Math.round((performance.now() - started) / 1000)} s)…`;
    el.hidden = false;
    $("health").textContent = "loading";
    await new Promise((resolve) => setTimeout(resolve, LOADING_RETRY_MS));
  }
}

async function boot() {
  $("key-form").onsubmit = (e) => {
    e.preventDefault();
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    $("key-form").hidden = true;
    boot();
  };
  await loaded();
  try {
    state.models = (await (await api("/v1/models")).json()).data;
    // The routes this server serves (public): panels only call what is there.
    state.routes = new Set(Object.keys((await (await fetch("/openapi.json")).json()).paths || {}));
  } catch (err) {
    showError(err);
    return;
  }
  showError("");
  const select = $("model");
  select.replaceChildren(...state.models.map((m) => new Option(m.id, m.id)));
  select.onchange = () => showModel(select.value);
  showModel(state.models[0].id);
  refreshStatus();
  document.body.dataset.ready = "true";
}

// The tabs as a tab list: arrow keys move between them (only the chosen one is in the Tab order).
$("tabs").onkeydown = (e) => {
  const tabs = [...$("tabs").querySelectorAll("button")];
  const at = tabs.indexOf(document.activeElement);
  const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
  if (at < 0 || !step) return;
  const next = tabs[(at + step + tabs.length) % tabs.length];
  next.focus();
  next.click();
};

// Keys: Enter in a panel's prompt (or one of its fields) sends it, Shift+Enter is a new line; Escape
// stops what the shown panel is doing (its request, its speech, or the Talk session).
const SUBMIT = {
  "chat-input": "chat-send", "speak-input": "speak-button", "image-prompt": "image-button",
  "image-size": "image-button", "image-steps": "image-button", "video-prompt": "video-button",
  "video-size": "video-button", "video-seconds": "video-button", "video-steps": "video-button",
  "transcribe-language": "transcribe-button",
};
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && SUBMIT[e.target.id] && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $(SUBMIT[e.target.id]).click();  // (nothing while it is disabled: the last request is still running)
  } else if (e.key === "Escape") {
    const shown = document.querySelector("section[data-panel]:not([hidden])")?.dataset.panel;
    if (shown === "talk" && state.talk) stopTalk();
    else if (stopPanel(shown)) e.preventDefault();
  }
});

bindTalk();
bindStops();
bindPanels({ api, state, showError });
bindTranscribe({ api, state, showError: (message) => showError(message, "transcribe") });
boot();
