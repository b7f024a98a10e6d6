// The chat panel: a question typed and/or an audio file to /v1/chat/completions, the answer's text streamed
// in, its spoken answer (when asked for) kept as a clip to play.
import { WIRE_RATE, b64ToBytes, bytesToB64, wavBlob } from "./audio.js";
import { following, readSse } from "./sse.js";
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);

// The chat's input_audio formats a file can be (the server also takes raw pcm16, which no file is).
const CHAT_AUDIO = { wav: "wav", wave: "wav", mp3: "mp3", mpeg: "mp3", flac: "flac" };
const audioFormat = (file) => CHAT_AUDIO[file.name.toLowerCase().split(".").pop()]
  || CHAT_AUDIO[(file.type.split("/")[1] || "").replace(/^x-/, "")];

export function bindChat({ api, state, showError }) {
  document.addEventListener("model-changed", () => {  // the last model's answer is not this one's
    // "spoken answer" only where the model speaks (else the server refuses the audio modality)
    const speaks = (state.model.output_types || []).includes("audio");
    $("chat-speech").hidden = !speaks;
    if (!speaks) $("chat-speak").checked = false;
    // The model's built-in voices, as Speak offers them (chat takes a name only; one that lists none takes any)
    const voices = Array.isArray(state.model.voices) && state.model.voices.length ? state.model.voices : ["alloy"];
    $("chat-voice").replaceChildren(...voices.map((n) => new Option(n, n)));
    $("chat-note").textContent = "";
    $("chat-output").textContent = "";
    $("chat-audio").hidden = true;
    $("chat-audio").removeAttribute("src");
  });
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
        Object.assign(body, { modalities: ["text", "audio"], audio: { voice: $("chat-voice").value, format: "pcm16" } });
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
        following(out, () => { out.textContent = text || transcript; });
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
