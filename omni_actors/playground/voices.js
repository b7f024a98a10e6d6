// Speak's voice picker: the model's built-in voices and the server's custom ones, a custom voice made from a
// reference clip and a consent (OpenAI's shapes), and deleted.
import { bindRecord, fileOf, forgetRecording } from "./record.js";
import { ask } from "./work.js";

const $ = (id) => document.getElementById(id);
const MAX_CONSENTS = 100;  // the server's largest page of voice consents: the consent picker lists one page

const customOption = (v) => new Option(`${v.name} (custom)`, JSON.stringify({ id: v.id }));

// The picked voice as the speech request takes it: a built-in name, or a custom voice's {"id"}; "" if none.
export function pickedVoice() {
  const raw = $("speak-voice").value;
  return raw.startsWith("{") ? JSON.parse(raw) : raw;
}

// "Delete voice" shows while a custom voice (the server's, an {"id"} value) is picked; its question, asked about
// the voice picked then, goes with any change of the picker.
function syncVoiceButtons() {
  const select = $("speak-voice");
  $("speak-voice-confirm").hidden = true;
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

// The form's field a server's 400 names (its `param`): the error is said by the button and the focus goes there.
const FIELD_OF_PARAM = {
  name: "clone-name", audio_sample: "clone-sample", transcript: "clone-transcript", consent: "clone-consent",
  recording: "clone-consent-file", language: "clone-language",
};

// A custom voice the server's way: a consent recording once, then the voice's clip under it.
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
    // Nothing to send yet: the form says what is missing, by its button, and the focus goes there.
    if (!name) return ask("clone-name", "clone-status", "a custom voice needs a name");
    if (!sample) return ask("clone-sample", "clone-status", "a custom voice needs a reference clip: pick or record one");
    if (!consent && !recording) {
      return ask("clone-consent-file", "clone-status", "a custom voice needs the speaker's consent: upload or record it");
    }
    const hadFocus = document.activeElement === button;
    button.disabled = true;  // (which takes the focus away: it comes back once the upload is done)
    showError("");
    status.classList.remove("failed");
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
        forgetRecording("clone-consent-file");
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
      $("speak-note").textContent = "";  // (it may have asked for a voice)
      status.textContent = `made voice ${voice.name} (${voice.id})`;
    } catch (err) {
      status.textContent = "";
      // The server refused what the form sent (a silent clip, one too short, a consent gone): said by the
      // button, where the user is looking, with the focus on the field it names. The key, a server gone and
      // such are the page's to say (its foot).
      if (err.status >= 400 && err.status < 500 && err.status !== 401) {
        status.textContent = err.message;
        status.classList.add("failed");
        if (err.param === "consent" && err.code === "not_found") {  // deleted elsewhere: not offered again
          consentSelect.querySelector(`option[value="${CSS.escape(consent)}"]`)?.remove();
          consentSelect.value = "";  // (a new one is uploaded instead)
          consentSelect.onchange();
        }
        $(FIELD_OF_PARAM[err.param])?.focus();
      } else showError(err);
    } finally {
      button.disabled = false;
      if (hadFocus && document.activeElement === document.body) button.focus();
    }
  };
}

// Delete the picked custom voice on the server (DELETE /v1/audio/voices/{id}); its consent stays. It cannot be
// undone, so "Delete voice" first asks, in the row: "Delete voice hum? [Delete] [Keep]", the focus on Keep
// (Escape keeps it too); a keyboard or a screen reader meets the question where the button was.
function bindVoiceDelete({ api, showError }) {
  const ask = $("speak-voice-delete");
  const confirm = $("speak-voice-confirm");
  let pending = null;  // the voice asked about
  const nameOf = (option) => option.text.replace(/ \(custom\)$/, "");
  const keep = () => {
    const hadFocus = confirm.contains(document.activeElement);
    syncVoiceButtons();
    if (hadFocus) (ask.hidden ? $("speak-voice") : ask).focus();
  };
  $("speak-voice").onchange = syncVoiceButtons;
  ask.onclick = () => {
    const option = $("speak-voice").selectedOptions[0];
    if (!option?.value.startsWith("{")) return;
    pending = option;
    $("speak-voice-confirm-text").textContent = `Delete voice ${nameOf(option)}? This cannot be undone.`;
    confirm.hidden = false;
    ask.hidden = true;
    $("speak-voice-delete-keep").focus();
  };
  $("speak-voice-delete-keep").onclick = keep;
  confirm.addEventListener("keydown", (e) => {
    if (e.key !== "Escape") return;
    e.stopPropagation();  // (the page's Escape would stop Speak's voice)
    keep();
  });
  $("speak-voice-delete-yes").onclick = async () => {
    const option = pending;
    const yes = $("speak-voice-delete-yes");
    const hadFocus = confirm.contains(document.activeElement);  // (before it is disabled, which drops the focus)
    if (!option?.isConnected || !option.selected) return keep();
    yes.disabled = true;
    showError("");
    $("clone-status").classList.remove("failed");
    const name = nameOf(option);
    let gone = true;
    try {
      await api(`/v1/audio/voices/${encodeURIComponent(JSON.parse(option.value).id)}`, { method: "DELETE" });
      $("clone-status").textContent = `deleted voice ${name}`;
    } catch (err) {
      gone = err.status === 404;  // deleted elsewhere meanwhile (another tab, the API): not left listed here
      if (gone) $("clone-status").textContent = `voice ${name} was already deleted`;
      else showError(err);
    } finally {
      yes.disabled = false;
    }
    if (gone) option.remove();
    syncVoiceButtons();
    const none = $("speak-voice").options.length === 0;
    $("speak-voice-needed").hidden = !none;
    if (none) $("speak-clone").open = true;  // the only way to speak again: make a voice
    // A keyboard user carries on from "Delete voice" (another custom voice picked, or this one kept by an
    // error), else from the picker, or from the form that makes a voice when none is left, rather than from
    // the top of the page.
    if (hadFocus) (!ask.hidden ? ask : none ? $("clone-name") : $("speak-voice")).focus();
  };
}

// A model switch lists the new model's voices (a model that speaks), the last one's are gone.
export function bindVoices({ api, state, showError }) {
  bindClone({ api, showError });
  bindVoiceDelete({ api, showError });
  document.addEventListener("model-changed", () => {
    $("speak-voice").replaceChildren();
    $("speak-voice-delete").hidden = true;
    $("speak-voice-confirm").hidden = true;
    $("speak-clone").hidden = true;
    $("speak-voice-needed").hidden = true;
    $("clone-status").textContent = "";
    $("clone-status").classList.remove("failed");
    if ((state.model.output_types || []).includes("audio")) loadVoices({ api, state, showError });
  });
}
