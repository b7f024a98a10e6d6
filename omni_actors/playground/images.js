// The images panel: a prompt to /v1/images/generations, or with a picked image to /v1/images/edits, both
// streamed with their step progress and partial images.
import { readSse } from "./sse.js";
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);

const ALT_PROMPT_CHARS = 120;  // an image's name quotes its prompt up to this long

// `partial`: a preview while the image is still made (its name says so).
function addImage(b64, prompt, { format = "png", partial = false } = {}) {
  const img = document.createElement("img");
  img.src = `data:image/${format};base64,${b64}`;
  const quoted = prompt.length > ALT_PROMPT_CHARS ? `${prompt.slice(0, ALT_PROMPT_CHARS)}…` : prompt;
  img.alt = `${partial ? "partial image" : "image"} for: ${quoted}`;
  $("image-result").append(img);
}

function request({ api, state, work, prompt }) {
  const file = $("image-file").files[0];
  const size = $("image-size").value.trim();
  // Empty: the model's default. What is typed is sent as typed (0 too: the server says what it takes, where
  // `|| undefined` made an image of the default steps under a field that says 0).
  const stepsText = $("image-steps").value.trim();
  const steps = stepsText === "" ? undefined : Number(stepsText);
  if (file) {
    const form = new FormData();
    form.append("model", state.model.id);
    form.append("prompt", prompt);
    form.append("size", size);
    form.append("image", file);
    if (steps !== undefined) form.append("num_inference_steps", stepsText);
    form.append("stream", "true");
    form.append("stream_progress", "true");
    return api("/v1/images/edits", { method: "POST", body: form, signal: work.signal });
  }
  return api("/v1/images/generations", {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: state.model.id, prompt, size, num_inference_steps: steps,
                           response_format: "b64_json", stream: true, partial_images: 2,
                           stream_progress: true }),
    signal: work.signal,
  });
}

export function bindImages({ api, state, showError }) {
  document.addEventListener("model-changed", () => {  // the last model's images are not this one's
    $("image-result").replaceChildren();
    $("image-status").textContent = "";
    $("image-progress").value = 0;
  });
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
    try {
      const resp = await request({ api, state, work, prompt });
      if ((resp.headers.get("content-type") || "").includes("text/event-stream")) {
        await readSse(resp, (ev) => {
          if (ev.type?.endsWith(".progress")) {
            progress.value = ev.phase === "decode" ? 0.97 : 0.95 * ev.progress;
            progress.dataset.steps = String(ev.step);
            status.textContent = ev.phase === "decode" ? "decoding…" : `step ${ev.step} of ${ev.total}`;
          } else if (ev.type?.endsWith("partial_image") || ev.type?.endsWith("completed")) {
            $("image-result").replaceChildren();
            addImage(ev.b64_json, prompt, { format: ev.output_format, partial: ev.type.endsWith("partial_image") });
          }
        });
      } else {
        for (const d of (await resp.json()).data) addImage(d.b64_json, prompt);
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
