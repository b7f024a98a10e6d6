// The speak panel: text to /v1/audio/speech as a streamed WAV, played as it arrives, then kept as a clip.
import { StreamPlayer, WIRE_RATE, wavBlob } from "./audio.js";
import { nextPart } from "./sse.js";
import { bindVoices, pickedVoice } from "./voices.js";
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);
const WAV_HEADER_BYTES = 44;

export function bindSpeak({ api, state, showError }) {
  bindVoices({ api, state, showError });
  document.addEventListener("model-changed", () => {  // the last model's clip is not this one's
    $("speak-note").textContent = "";
    $("speak-audio").removeAttribute("src");
  });
  let lastPlayer = null;  // the previous click's: closed at the next (a page holds only a few audio contexts)
  $("speak-button").onclick = async () => {
    const text = $("speak-input").value.trim();
    if (!text) return ask("speak-input", "speak-note", "type what to say");
    const voice = pickedVoice();
    if (!voice) return showError("this model speaks only in a custom voice: make one first");
    // (a click while the last answer still plays: that work ends here, its voice silenced)
    const work = new Work("speak", state.abort.signal);
    showError("");
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
