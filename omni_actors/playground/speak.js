// The speak panel: text to /v1/audio/speech as a streamed WAV, played as it arrives, then kept as a clip.
import { StreamPlayer, WIRE_RATE, wavBlob } from "./audio.js";
import { nextPart } from "./sse.js";
import { bindVoices, pickedVoice } from "./voices.js";
import { Work, ask } from "./work.js";

const $ = (id) => document.getElementById(id);
const WAV_HEADER_BYTES = 44;
const MAX_INPUT_CHARS = 4096;  // the server refuses a longer `input` (400 string_above_max_length: api/speech.py)

// Characters as the server counts them (code points: an emoji is one), of the text as it is sent (trimmed).
const charsOf = (text) => [...text.trim()].length;
const tooLong = (n) => `${n} characters: at most ${MAX_INPUT_CHARS} can be spoken at once (${n - MAX_INPUT_CHARS} too many)`;

// The count under the text box, red past the limit, which the note (read out) then says in words: a user
// learns before sending, and a paste of more is kept whole (nothing cut off unsaid) for them to shorten.
function showCount() {
  const input = $("speak-input"), count = $("speak-count"), note = $("speak-note");
  const n = charsOf(input.value);
  const over = n > MAX_INPUT_CHARS;
  count.textContent = `${n} / ${MAX_INPUT_CHARS} characters`;
  count.classList.toggle("over", over);
  if (over) input.setAttribute("aria-invalid", "true");
  else input.removeAttribute("aria-invalid");
  if (over) note.textContent = tooLong(n);
  else if (note.textContent.endsWith("too many)")) note.textContent = "";  // (the count's own words only)
}

export function bindSpeak({ api, state, showError }) {
  bindVoices({ api, state, showError });
  document.addEventListener("model-changed", () => {  // the last model's clip is not this one's
    $("speak-note").textContent = "";
    $("speak-audio").removeAttribute("src");
    $("speak-audio").hidden = true;  // (an empty player is a stop in the Tab order with nothing to play)
    showCount();
  });
  $("speak-input").addEventListener("input", showCount);
  showCount();
  let lastPlayer = null;  // the previous click's: closed at the next (a page holds only a few audio contexts)
  $("speak-button").onclick = async () => {
    const text = $("speak-input").value.trim();
    if (!text) return ask("speak-input", "speak-note", "type what to say");
    if (charsOf(text) > MAX_INPUT_CHARS) return ask("speak-input", "speak-note", tooLong(charsOf(text)));
    const voice = pickedVoice();
    if (!voice && $("speak-clone").hidden) {
      return showError("this model speaks only in a custom voice, which this server cannot make");
    }
    if (!voice) {  // what is missing is a voice: the form that makes one, open, has the focus
      $("speak-clone").open = true;
      return ask("clone-name", "speak-note", "this model speaks only in a custom voice: make one below first");
    }
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
        el.hidden = false;
        el.dataset.seconds = String(player ? player.playedSeconds : 0);
      }
      work.done(player?.drained());  // Speak is free again; Stop stays while the voice still plays
    }
  };
}
