// Record / Stop beside a file input: the microphone as a WAV file the form sends in the file's place.
import { MicRecorder, WIRE_RATE } from "./audio.js";

const $ = (id) => document.getElementById(id);

// A clip recorded in the page, per file input (its id): kept until a file is picked there instead. A
// promise of its File: taken at Stop, it is ready once the microphone has closed (a click that sends
// it at once waits for that).
const recorded = new Map();

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
    delete button.dataset.recording;
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
        return showError(err.message.startsWith("microphone: ") ? err.message : `microphone: ${err.message}`);
      } finally {
        button.disabled = false;
      }
      if (recorder !== starting) return starting.stop();  // a model switch came while it opened
      button.textContent = "Stop";
      button.dataset.recording = "true";  // (Escape in its panel is this Stop too: app.js)
      label.textContent = "recording…";
      return;
    }
    const stopping = recorder;
    recorder = null;
    button.textContent = "Record";
    delete button.dataset.recording;
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

// The clip recorded for a file input is used: the next send needs a new one (or a file).
export function forgetRecording(id) {
  $(id).value = "";
  recorded.delete(id);
  $(`${id}-recorded`).textContent = "";
}
