// The transcribe panel (a model that makes transcripts): an audio file, or a clip recorded in the page,
// to /v1/audio/transcriptions with stream=true; the words show as they are recognised.
import { bindRecord, fileOf } from "./record.js";
import { following, readSse } from "./sse.js";
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);

export function bindTranscribe({ api, state, showError }) {
  bindRecord($("transcribe-file-record"), showError);
  document.addEventListener("model-changed", () => {
    $("transcribe-output").textContent = "";
    $("transcribe-note").textContent = "";
  });
  $("transcribe-button").onclick = async () => {
    const file = fileOf("transcribe-file");
    if (!file) return ask("transcribe-file", "transcribe-note", "pick an audio file, or record one");
    const out = $("transcribe-output");
    const work = new Work("transcribe", state.abort.signal);
    showError("");
    out.textContent = "";
    out.classList.add("live");
    try {
      const audio = await work.until(file);  // (a clip just recorded: ready once the microphone has closed)
      const form = new FormData();
      form.append("model", state.model.id);
      form.append("file", audio, audio.name || "audio.wav");
      form.append("stream", "true");
      const language = $("transcribe-language").value.trim();
      if (language) form.append("language", language);
      const resp = await api("/v1/audio/transcriptions", { method: "POST", body: form, signal: work.signal });
      let text = "", done = false;
      await readSse(resp, (ev) => {
        if (ev.type === "transcript.text.delta") following(out, () => { out.textContent = (text += ev.delta); });
        else if (ev.type === "transcript.text.done") { following(out, () => { out.textContent = ev.text; }); done = true; }
      });
      if (!done) throw new Error("the transcript was cut off: the connection closed before it ended");
    } catch (err) {
      showError(err);
    } finally {
      if (work.latest) out.classList.remove("live");  // (else a newer click's transcript is live there)
      work.done();
    }
  };
}
