// The playground page: finds what each loaded pipeline can do (the model picker switches between them),
// shows those panels as tabs, keeps the API key, shows errors with the panel they belong to.
import { bindPanels } from "./panels.js";
import { bindStatus, refreshStatus, serverAnswered, serverGone, showHealth } from "./pipeline.js";
import { following } from "./sse.js";
import { Talk } from "./talk.js";
import { bindStops, stopPanel } from "./work.js";

const KEY_STORE = "omni-actors.api-key";
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
    const failed = shown !== b.dataset.tab && errors.has(b.dataset.tab);
    b.classList.toggle("failed", failed);  // a red "!" (style.css) to the eye, words to a screen reader
    if (failed) b.setAttribute("aria-description", "has an error");
    else b.removeAttribute("aria-description");
  }
}

export async function api(path, options = {}, again = false) {
  const headers = new Headers(options.headers || {});
  if (state.key) headers.set("Authorization", `Bearer ${state.key}`);
  let resp;
  try {
    resp = await fetch(path, { signal: state.abort.signal, ...options, headers });
  } catch (err) {
    if (err.name === "AbortError") throw err;
    serverGone();
    throw new Error(`the server did not answer (${err.message}): is it still running?`);
  }
  serverAnswered();
  if (resp.status === 503 && !again && await loadingAgain(resp, options.signal ?? state.abort.signal)) {
    return api(path, options, true);
  }
  if (resp.status === 401) {
    askForKey();
    throw Object.assign(new Error(state.key ? "the API key was not accepted: enter the right one" : "this server needs an API key"),
                        { status: 401 });
  }
  if (!resp.ok) {
    let error = {};
    try { error = (await resp.json()).error || {}; } catch { /* not JSON */ }
    // (a 404 can mean "already gone"; `param` names the field a 400 is about, for a form to point at)
    throw Object.assign(new Error(error.message || `${resp.status} ${resp.statusText}`),
                        { status: resp.status, param: error.param ?? null, code: error.code ?? null });
  }
  return resp;
}

// A server restarted under the page refuses model routes while it loads (503, code "loading"): nothing was
// started, so the request waits for the load (shown as at start) and is sent again. True once loaded.
let loadingNow = null;
async function loadingAgain(resp, signal) {
  let code = null;
  try { code = (await resp.clone().json()).error?.code; } catch { /* not JSON */ }
  if (code !== "loading") return false;
  loadingNow ??= loaded().finally(() => { loadingNow = null; refreshStatus(); });
  await new Promise((resolve, reject) => {  // (a Stop or a model switch meanwhile ends the wait)
    if (signal?.aborted) return reject(signal.reason);
    signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
    loadingNow.then(resolve, reject);
  });
  return true;
}

// The key form, its field focused with what was typed selected (a wrong key is typed over). Where the focus
// was goes back there once a key works (else to the tab shown): a keyboard user carries on where they were.
let keyAsked = false, keyAskedFrom = null;
function askForKey() {
  if (!$("key-form").hidden) return;  // (already asked: the focus stays where the user put it)
  keyAsked = true;
  if (document.activeElement !== document.body) keyAskedFrom = document.activeElement;
  $("key-form").hidden = false;
  $("key-input").focus();
  $("key-input").select();
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
    b.id = `tab-${p}`;  // (its panel is labelled by it)
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

// ---- talk --------------------------------------------------------------------

// One line per user turn (its item id): deltas append while it is spoken, the completed transcript replaces them.
function showUserTurn(itemId, text, done) {
  const box = $("talk-user");
  following(box, () => userLine(box, itemId, text, done));
}

function userLine(box, itemId, text, done) {
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
    // A refused socket cannot say why: a cheap authenticated GET first, whose 401 asks for the key.
    button.disabled = true;
    const model = state.model;
    try {
      await api("/v1/models");
    } catch (err) {
      say(err);
      return;
    } finally {
      button.disabled = false;
    }
    if (state.model !== model) return;  // (switched meanwhile: that model's tabs are shown now)
    const answer = $("talk-transcript");
    const talk = new Talk({
      model: state.model.id, key: state.key,
      transcribe: (state.model.output_types || []).includes("transcript"),  // else the server says .failed per turn
      onAnswer: (delta, fresh) => following(answer, () => {
        if (fresh && answer.textContent) answer.textContent += "\n";
        answer.textContent += delta;
      }),
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
    showHealth("loading");
    await new Promise((resolve) => setTimeout(resolve, LOADING_RETRY_MS));
  }
}

// /v1/models lists each name a request may use: a pipeline's served name and its pipeline's own (`tiny-sd` and
// `diffusion`). The picker offers each pipeline once, by its first name (/v1/status lists each one's names).
function onePerPipeline(models, pipelines) {
  const others = new Set((pipelines || []).flatMap((p) => p.models.slice(1)));
  return models.filter((m) => !others.has(m.id));
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
    const models = (await (await api("/v1/models")).json()).data;
    const status = await api("/v1/status").then((resp) => resp.json(), () => ({}));  // (without it: every name)
    state.models = onePerPipeline(models, status.pipelines);
    // The routes this server serves (public): panels only call what is there.
    state.routes = new Set(Object.keys((await (await fetch("/openapi.json")).json()).paths || {}));
  } catch (err) {
    showError(err);
    if (err.status === 401) showHealth("API key needed", false);  // (it answered: not "…" until a key works)
    return;
  }
  if (!state.models.length) {  // (a deploy that loaded nothing): nothing to show but that
    showError("this server lists no models (GET /v1/models is empty): check the pipelines it was started with");
    showHealth("no models", false);
    return;
  }
  showError("");
  // A key asked for again mid-session (its 401): the page comes back to the model and tab it was on.
  const was = { model: state.model?.id, tab: $("tabs").querySelector("[aria-selected=true]")?.dataset.tab };
  const model = state.models.some((m) => m.id === was.model) ? was.model : state.models[0].id;
  const select = $("model");
  select.replaceChildren(...state.models.map((m) => new Option(m.id, m.id)));
  select.value = model;
  select.onchange = () => showModel(select.value);
  showModel(model);
  const tab = was.tab && $("tabs").querySelector(`[data-tab=${was.tab}]`) ? was.tab : null;
  if (tab) selectTab(tab);
  if (tab !== "pipeline") refreshStatus();  // (the Pipeline tab has read it)
  if (keyAsked && document.activeElement === document.body) {  // (the key's field, now hidden, had it)
    const from = keyAskedFrom;
    const back = from?.isConnected && !from.disabled && !from.closest("[hidden]") ? from : null;
    (back || $("tabs").querySelector("[aria-selected=true]"))?.focus();
  }
  keyAsked = false;
  keyAskedFrom = null;
  document.body.dataset.ready = "true";
}

// The tabs as a tab list: arrow keys move between them, Home and End to the first and the last (only the
// chosen one is in the Tab order).
$("tabs").onkeydown = (e) => {
  const tabs = [...$("tabs").querySelectorAll("button")];
  const at = tabs.indexOf(document.activeElement);
  const to = { ArrowRight: at + 1, ArrowLeft: at - 1, Home: 0, End: tabs.length - 1 }[e.key];
  if (at < 0 || to === undefined) return;
  e.preventDefault();  // (Home and End would scroll the page)
  const next = tabs[(to + tabs.length) % tabs.length];
  next.focus();
  next.click();
};

// Keys: Enter in a panel's prompt (or one of its fields) sends it, Shift+Enter is a new line; Escape
// stops what the shown panel is doing (its request, its speech, or the Talk session), else a recording
// of its microphone (as that Record's Stop: the clip is kept).
const SUBMIT = {
  "chat-input": "chat-send", "speak-input": "speak-button", "image-prompt": "image-button",
  "image-size": "image-button", "image-steps": "image-button", "video-prompt": "video-button",
  "video-size": "video-button", "video-seconds": "video-button", "video-steps": "video-button",
  "transcribe-language": "transcribe-button", "clone-name": "clone-button", "clone-transcript": "clone-button",
  "clone-language": "clone-button",
};
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && SUBMIT[e.target.id] && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    $(SUBMIT[e.target.id]).click();  // (nothing while it is disabled: the last request is still running)
  } else if (e.key === "Escape") {
    const shown = document.querySelector("section[data-panel]:not([hidden])")?.dataset.panel;
    const recording = document.querySelector(`#panel-${shown} [data-recording=true]`);
    if (shown === "talk" && state.talk) stopTalk();
    else if (stopPanel(shown)) e.preventDefault();
    else if (recording) {
      e.preventDefault();
      recording.click();
    }
  }
});

bindTalk();
bindStops();
bindStatus({ api, state, showError });
bindPanels({ api, state, showError });
boot();
