// The request panels: chat (text streamed, spoken answer), speak (streamed playback), images, videos.
// Each click is a Work (work.js): Stop ends its requests and keeps what already came.
import { MicRecorder, StreamPlayer, WIRE_RATE, b64ToBytes, bytesToB64, wavBlob } from "./audio.js";
import { Work } from "./work.js";

const $ = (id) => document.getElementById(id);
const VIDEO_WAIT_S = 30; // each status read waits on the server for the job's next progress (no timer)
const WAV_HEADER_BYTES = 44;
const MAX_CONSENTS = 100;  // the server's largest page of voice consents: the consent picker lists one page

// A body's next part; a connection lost on the way says so (the browser's own words are "network error").
async function nextPart(reader) {
  try {
    return await reader.read();
  } catch (err) {
    if (err.name === "AbortError") throw err;
    throw new Error(`the connection to the server was lost before the end (${err.message})`);
  }
}

// Reads an SSE body, calling onEvent(parsed JSON) for each `data:` line; true once [DONE] came, false when
// the body ended without it. An error the server sends in-band (its headers were out) throws its message.
export async function readSse(resp, onEvent) {
  const reader = resp.body.getReader();
  const text = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await nextPart(reader);
    if (done) return false;
    buf += text.decode(value, { stream: true });
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      for (const line of block.split("\n")) {
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return true;
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message || "the server failed this request");
        onEvent(event);
      }
    }
  }
}

function busy(button, on) { button.disabled = on; }

// Nothing to send: the field that needs filling gets the focus, the panel's note says what it needs.
function ask(field, note, what) {
  $(note).textContent = what;
  $(field).focus();
}

// The chat's input_audio formats a file can be (the server also takes raw pcm16, which no file is).
const CHAT_AUDIO = { wav: "wav", wave: "wav", mp3: "mp3", mpeg: "mp3", flac: "flac" };
const audioFormat = (file) => CHAT_AUDIO[file.name.toLowerCase().split(".").pop()]
  || CHAT_AUDIO[(file.type.split("/")[1] || "").replace(/^x-/, "")];

function bindChat({ api, state, showError }) {
  $("chat-send").onclick = async () => {
    const out = $("chat-output");
    const audioEl = $("chat-audio");
    const prompt = $("chat-input").value.trim();
    const file = $("chat-file").files[0];
    if (!prompt && !file) return ask("chat-input", "chat-note", "type a question, or pick an audio file");
    const format = file && audioFormat(file);
    if (file && !format) return showError(`chat takes a WAV, MP3 or FLAC file, not ${file.name}`);
    const work = new Work("chat", state.abort.signal);
    showError("");
    out.textContent = "";
    audioEl.hidden = true;
    const pcm = [];
    try {
      const content = [];
      if (prompt) content.push({ type: "text", text: prompt });
      if (file) {
        const bytes = new Uint8Array(await work.until(file.arrayBuffer()));
        content.push({ type: "input_audio", input_audio: { data: bytesToB64(bytes), format } });
      }
      const body = { model: state.model.id, stream: true, messages: [{ role: "user", content }] };
      if ($("chat-speak").checked) {
        Object.assign(body, { modalities: ["text", "audio"], audio: { voice: "alloy", format: "pcm16" } });
      }
      const resp = await api("/v1/chat/completions", {
        method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
        signal: work.signal,
      });
      // The answer's words come as text, as the audio's transcript, or as both (this server sends both
      // when the model writes and speaks): the text wins, the transcript shows only where no text came.
      let text = "", transcript = "";
      const finished = await readSse(resp, (chunk) => {
        const delta = chunk.choices?.[0]?.delta || {};
        if (delta.content) text += delta.content;
        if (delta.audio?.transcript) transcript += delta.audio.transcript;
        if (delta.audio?.data) pcm.push(b64ToBytes(delta.audio.data));
        out.textContent = text || transcript;
      });
      if (!finished) throw new Error("the answer was cut off: the connection closed before it ended");
    } catch (err) {
      showError(err);
    } finally {
      // What was spoken so far, stopped or not (a model switch clears it).
      if (pcm.length && work.latest && (work.stopped || !work.signal.aborted)) {
        if (audioEl.src.startsWith("blob:")) URL.revokeObjectURL(audioEl.src);
        audioEl.src = URL.createObjectURL(wavBlob(pcm, WIRE_RATE));
        audioEl.hidden = false;
      }
      work.done();
    }
  };
}

const customOption = (v) => new Option(`${v.name} (custom)`, JSON.stringify({ id: v.id }));

// "Delete voice" shows while a custom voice (the server's, an {"id"} value) is picked.
function syncVoiceButtons() {
  const select = $("speak-voice");
  $("speak-voice-delete").hidden = !select.value.startsWith("{");
  select.disabled = !select.options.length;
}

// The voice picker: the server's custom voices when the model clones, then its built-in voices. A model
// that declares none speaks only in a custom voice (no "alloy" then); one that does not say takes any name.
async function loadVoices({ api, state, showError }) {
  const model = state.model;
  const clones = Boolean(model.custom_voices) && state.routes.has("/v1/audio/voices");
  const options = [];
  if (clones) {
    try {
      const custom = await (await api("/v1/audio/voices")).json();
      options.push(...(custom.data || []).map(customOption));
    } catch (err) {
      if (err.name !== "AbortError") showError(`custom voices: ${err.message}`);
    }
  }
  if (state.model !== model) return;  // the picker moved on while the list came
  const builtin = Array.isArray(model.voices) ? model.voices : ["alloy"];
  options.push(...builtin.map((n) => new Option(n, n)));
  $("speak-voice").replaceChildren(...options);
  syncVoiceButtons();
  $("speak-clone").hidden = !clones;
  const needed = $("speak-voice-needed");
  needed.textContent = clones
    ? "This model has no built-in voices: it speaks only in a custom voice. Upload a reference clip below to make one."
    : "This model has no built-in voices and this server cannot make custom ones.";
  needed.hidden = options.length > 0;
  if (!options.length) $("speak-clone").open = true;  // the only way to speak here
  if (clones) await loadConsents({ api, showError });
}

async function loadConsents({ api, showError }) {
  const select = $("clone-consent");
  const options = [new Option("new: upload the recording", "")];
  try {
    const page = await (await api(`/v1/audio/voice_consents?limit=${MAX_CONSENTS}`)).json();
    options.push(...page.data.map((c) => new Option(`${c.name} (${c.language})`, c.id)));
  } catch (err) {
    if (err.name !== "AbortError") showError(`voice consents: ${err.message}`);
  }
  select.replaceChildren(...options);
  select.onchange();
}

// A clip recorded in the page, per file input (its id): kept until a file is picked there instead. A
// promise of its File: taken at Stop, it is ready once the microphone has closed (a click that sends
// it at once waits for that).
const recorded = new Map();

// Record / Stop beside a file input: the microphone as a WAV file the form sends in the file's place.
export function bindRecord(button, showError) {
  const input = $(button.dataset.for);
  const label = $(`${button.dataset.for}-recorded`);
  let recorder = null;
  input.addEventListener("change", () => { recorded.delete(input.id); label.textContent = ""; });
  document.addEventListener("model-changed", async () => {  // the microphone is not left open behind a switch
    if (!recorder) return;
    const stopping = recorder;
    recorder = null;
    button.textContent = "Record";
    label.textContent = "";
    await stopping.stop();
  });
  button.onclick = async () => {
    if (!recorder) {
      const starting = recorder = new MicRecorder((seconds) => {
        label.textContent = `recording… ${seconds.toFixed(1)} s`;
      });
      button.disabled = true;  // opening the microphone: a second click must not stop what has not started
      try {
        await starting.start();
      } catch (err) {
        await starting.stop();  // (what it had opened)
        if (recorder !== starting) return;  // a model switch stopped it while it opened
        recorder = null;
        return showError(`microphone: ${err.message}`);
      } finally {
        button.disabled = false;
      }
      if (recorder !== starting) return starting.stop();  // a model switch came while it opened
      button.textContent = "Stop";
      label.textContent = "recording…";
      return;
    }
    const stopping = recorder;
    recorder = null;
    button.textContent = "Record";
    input.value = "";
    stopping.onProgress = () => {};  // (blocks still come while it closes)
    label.textContent = `recorded ${(stopping.samples / WIRE_RATE).toFixed(1)} s`;
    const clip = stopping.stop().then(({ blob }) => new File([blob], `${input.id}.wav`, { type: "audio/wav" }));
    recorded.set(input.id, clip);
    clip.catch((err) => {
      if (recorded.get(input.id) === clip) {
        recorded.delete(input.id);
        label.textContent = "";
      }
      showError(`microphone: ${err.message}`);
    });
  };
}

// The file picked, or the clip recorded (a promise of its File), or undefined.
export const fileOf = (id) => $(id).files[0] || recorded.get(id);

// A custom voice the server's way (OpenAI's shapes): a consent recording once, then the voice's clip under it.
function bindClone({ api, showError }) {
  const consentSelect = $("clone-consent");
  consentSelect.onchange = () => { $("clone-consent-file").parentElement.hidden = consentSelect.value !== ""; };
  for (const id of ["clone-sample-record", "clone-consent-file-record"]) bindRecord($(id), showError);
  $("clone-button").onclick = async () => {
    const button = $("clone-button");
    const status = $("clone-status");
    const name = $("clone-name").value.trim();
    const sample = fileOf("clone-sample");
    const recording = fileOf("clone-consent-file");
    let consent = consentSelect.value;
    if (!name || !sample) return showError("a custom voice needs a name and a reference clip");
    if (!consent && !recording) return showError("a custom voice needs the speaker's consent: upload its recording");
    busy(button, true);
    showError("");
    status.textContent = "uploading…";
    try {
      const [sampleFile, recordingFile] = await Promise.all([sample, recording]);
      if (!consent) {
        const form = new FormData();
        form.append("name", name);
        form.append("language", $("clone-language").value.trim() || "en-US");
        form.append("recording", recordingFile);
        const made = await (await api("/v1/audio/voice_consents", { method: "POST", body: form })).json();
        consent = made.id;
        consentSelect.append(new Option(`${made.name} (${made.language})`, made.id));
        consentSelect.value = made.id;  // later voices reuse it
        consentSelect.onchange();
        $("clone-consent-file").value = "";
        recorded.delete("clone-consent-file");
        $("clone-consent-file-recorded").textContent = "";
      }
      const form = new FormData();
      form.append("name", name);
      form.append("consent", consent);
      form.append("audio_sample", sampleFile);
      const transcript = $("clone-transcript").value.trim();
      if (transcript) form.append("transcript", transcript);
      const voice = await (await api("/v1/audio/voices", { method: "POST", body: form })).json();
      const option = customOption(voice);
      $("speak-voice").prepend(option);
      option.selected = true;
      syncVoiceButtons();
      $("speak-voice-needed").hidden = true;
      status.textContent = `made voice ${voice.name} (${voice.id})`;
    } catch (err) {
      status.textContent = "";
      showError(err);
    } finally {
      busy(button, false);
    }
  };
}

// Delete the picked custom voice on the server (DELETE /v1/audio/voices/{id}); its consent stays.
function bindVoiceDelete({ api, showError }) {
  $("speak-voice").onchange = syncVoiceButtons;
  $("speak-voice-delete").onclick = async () => {
    const button = $("speak-voice-delete");
    const option = $("speak-voice").selectedOptions[0];
    if (!option || !option.value.startsWith("{")) return;
    busy(button, true);
    showError("");
    try {
      await api(`/v1/audio/voices/${encodeURIComponent(JSON.parse(option.value).id)}`, { method: "DELETE" });
      option.remove();
      $("clone-status").textContent = `deleted voice ${option.text.replace(/ \(custom\)$/, "")}`;
      $("speak-voice-needed").hidden = $("speak-voice").options.length > 0;
    } catch (err) {
      showError(err);
    } finally {
      busy(button, false);
      syncVoiceButtons();
    }
  };
}

function bindSpeak({ api, state, showError }) {
  bindClone({ api, showError });
  bindVoiceDelete({ api, showError });
  document.addEventListener("model-changed", () => {
    $("speak-voice").replaceChildren();
    $("speak-voice-delete").hidden = true;
    $("speak-clone").hidden = true;
    $("speak-voice-needed").hidden = true;
    $("clone-status").textContent = "";
    if ((state.model.output_types || []).includes("audio")) loadVoices({ api, state, showError });
  });
  let lastPlayer = null;  // the previous click's: closed at the next (a page holds only a few audio contexts)
  $("speak-button").onclick = async () => {
    const text = $("speak-input").value.trim();
    if (!text) return ask("speak-input", "speak-note", "type what to say");
    const raw = $("speak-voice").value;
    if (!raw) return showError("this model speaks only in a custom voice: make one first");
    // (a click while the last answer still plays: that work ends here, its voice silenced)
    const work = new Work("speak", state.abort.signal);
    showError("");
    const voice = raw.startsWith("{") ? JSON.parse(raw) : raw;
    let player = null;
    work.onAbort(() => player?.stop());  // Stop silences what is queued to play too
    const pcm = [];
    let rate = WIRE_RATE;
    try {
      // A streamed WAV: the header gives the voice's own rate, the rest is pcm16 as it is made.
      const resp = await api("/v1/audio/speech", {
        method: "POST", headers: { "content-type": "application/json" },
        body: JSON.stringify({ model: state.model.id, input: text, voice, response_format: "wav", stream_format: "audio" }),
        signal: work.signal,
      });
      const reader = resp.body.getReader();
      let pending = new Uint8Array(0);
      let headerDone = false;
      for (;;) {
        const { value, done } = await nextPart(reader);
        if (done) break;
        const joined = new Uint8Array(pending.length + value.length);
        joined.set(pending);
        joined.set(value, pending.length);
        pending = joined;
        if (!headerDone) {
          if (pending.length < WAV_HEADER_BYTES) continue;
          rate = new DataView(pending.buffer, pending.byteOffset).getUint32(24, true);
          const previous = lastPlayer;
          lastPlayer = null;
          await work.until(previous?.close());
          player = lastPlayer = new StreamPlayer(rate);
          pending = pending.slice(WAV_HEADER_BYTES);
          headerDone = true;
        }
        const even = pending.length - (pending.length % 2);
        const part = pending.slice(0, even);
        pending = pending.slice(even);
        player.push(part);  // plays while the rest is still being made
        pcm.push(part);
      }
    } catch (err) {
      showError(err);
    } finally {
      // What came, stopped or not, as a clip to play again (a model switch clears it).
      if (pcm.length && work.latest && (work.stopped || !work.signal.aborted)) {
        const el = $("speak-audio");
        if (el.src.startsWith("blob:")) URL.revokeObjectURL(el.src);
        el.src = URL.createObjectURL(wavBlob(pcm, rate));
        el.dataset.seconds = String(player ? player.playedSeconds : 0);
      }
      work.done(player?.drained());  // Speak is free again; Stop stays while the voice still plays
    }
  };
}

function addImage(b64, format = "png") {
  const img = document.createElement("img");
  img.src = `data:image/${format};base64,${b64}`;
  $("image-result").append(img);
}

function bindImages({ api, state, showError }) {
  $("image-button").onclick = async () => {
    const prompt = $("image-prompt").value.trim();
    if (!prompt) return ask("image-prompt", "image-status", "describe the image first");
    const work = new Work("images", state.abort.signal);
    showError("");
    $("image-result").replaceChildren();
    const progress = $("image-progress");
    const status = $("image-status");
    // Indeterminate ("working") until the first step event (the server's `stream_progress` events:
    // step of total, then the decode), then each step moves the bar.
    progress.removeAttribute("value");
    delete progress.dataset.steps;
    status.textContent = "working…";
    work.onAbort(() => { if (!progress.hasAttribute("value")) progress.value = 0; });  // no bar left "working"
    const file = $("image-file").files[0];
    const size = $("image-size").value.trim();
    const steps = Number($("image-steps").value) || undefined;
    try {
      let resp;
      if (file) {
        const form = new FormData();
        form.append("model", state.model.id);
        form.append("prompt", prompt);
        form.append("size", size);
        form.append("image", file);
        if (steps) form.append("num_inference_steps", String(steps));
        form.append("stream", "true");
        form.append("stream_progress", "true");
        resp = await api("/v1/images/edits", { method: "POST", body: form, signal: work.signal });
      } else {
        resp = await api("/v1/images/generations", {
          method: "POST", headers: { "content-type": "application/json" },
          body: JSON.stringify({ model: state.model.id, prompt, size, num_inference_steps: steps,
                                 response_format: "b64_json", stream: true, partial_images: 2,
                                 stream_progress: true }),
          signal: work.signal,
        });
      }
      if ((resp.headers.get("content-type") || "").includes("text/event-stream")) {
        await readSse(resp, (ev) => {
          if (ev.type?.endsWith(".progress")) {
            progress.value = ev.phase === "decode" ? 0.97 : 0.95 * ev.progress;
            progress.dataset.steps = String(ev.step);
            status.textContent = ev.phase === "decode" ? "decoding…" : `step ${ev.step} of ${ev.total}`;
          } else if (ev.type?.endsWith("partial_image")) {
            $("image-result").replaceChildren();
            addImage(ev.b64_json, ev.output_format);
          } else if (ev.type?.endsWith("completed")) {
            $("image-result").replaceChildren();
            addImage(ev.b64_json, ev.output_format);
          }
        });
      } else {
        for (const d of (await resp.json()).data) addImage(d.b64_json);
      }
      if (!$("image-result").children.length) throw new Error("no image came back: the connection closed first");
      progress.value = 1;
      status.textContent = "";
    } catch (err) {
      if (work.signal.aborted) return;  // stopped: the bar stays where the steps got to, a partial image stays
      progress.value = 0;
      status.textContent = "";
      showError(err);
    } finally {
      work.done();
    }
  };
}

function bindVideos({ api, state, showError }) {
  // A stopped job is deleted on the server (DELETE aborts it between denoising steps, and answers once it
  // has ended); a Stop says so when it has. A model switch deletes it too: the page can no longer show it.
  async function cancelJob(created, work) {
    const say = (text) => { if (work.stopped && work.latest) $("video-status").textContent = text; };
    say("stopping…");
    let job;
    try {
      job = await created;
    } catch {
      return say("stopped");  // no job was made
    }
    try {
      await api(`/v1/videos/${job.id}`, { method: "DELETE", signal: null });
      say("stopped");
    } catch (err) {
      say(`stopped here; the server did not confirm it ended job ${job.id}: ${err.message}`);
    }
  }

  $("video-button").onclick = async () => {
    const prompt = $("video-prompt").value.trim();
    if (!prompt) return ask("video-prompt", "video-status", "describe the video first");
    const work = new Work("videos", state.abort.signal);
    showError("");
    const status = $("video-status");
    const bar = $("video-progress");
    const player = $("video-result");
    player.hidden = true;
    bar.value = 0;
    status.textContent = "creating…";
    // The create is not aborted by a Stop (a job it made would run on, unknown to the page): a Stop
    // waits for its answer, then deletes the job.
    const created = api("/v1/videos", {
      method: "POST", headers: { "content-type": "application/json" }, signal: null,
      body: JSON.stringify({ model: state.model.id, prompt, size: $("video-size").value.trim(),
                             seconds: $("video-seconds").value.trim(),
                             num_inference_steps: Number($("video-steps").value) || undefined }),
    }).then((resp) => resp.json());
    work.onAbort(() => cancelJob(created, work));
    try {
      let job = await work.until(created);
      while (job.status === "queued" || job.status === "in_progress") {
        status.textContent = job.status;
        bar.value = job.progress || 0;
        const next = new URLSearchParams({ wait_s: VIDEO_WAIT_S, past: job.status,
                                           progress_past: Math.min(job.progress || 0, 99) });
        job = await (await api(`/v1/videos/${job.id}?${next}`, { signal: work.signal })).json();
      }
      status.textContent = job.status;
      if (job.status !== "completed") throw new Error(job.error?.message || `video ${job.status}`);
      bar.value = 100;
      const blob = await (await api(`/v1/videos/${job.id}/content`, { signal: work.signal })).blob();
      if (player.src.startsWith("blob:")) URL.revokeObjectURL(player.src);
      player.src = URL.createObjectURL(blob);
      player.hidden = false;
    } catch (err) {
      if (!work.signal.aborted && status.textContent === "creating…") status.textContent = "";
      showError(err);
    } finally {
      work.done();
    }
  };
}

// A model switch aborts the last model's requests (api's signal); what it made is not this model's.
function clearOutputs() {
  for (const id of ["chat-note", "speak-note"]) $(id).textContent = "";
  $("chat-output").textContent = "";
  $("chat-audio").hidden = true;
  $("chat-audio").removeAttribute("src");
  $("speak-audio").removeAttribute("src");
  $("image-result").replaceChildren();
  $("image-status").textContent = "";
  $("image-progress").value = 0;
  $("video-status").textContent = "";
  $("video-progress").value = 0;
  $("video-result").hidden = true;
  $("video-result").removeAttribute("src");
}

// ctx.showError(message, panel): each panel's errors are its own (shown with it).
export function bindPanels(ctx) {
  const of = (panel) => ({ ...ctx, showError: (message) => ctx.showError(message, panel) });
  document.addEventListener("model-changed", clearOutputs);
  bindChat(of("chat"));
  bindSpeak(of("speak"));
  bindImages(of("images"));
  bindVideos(of("videos"));
}
