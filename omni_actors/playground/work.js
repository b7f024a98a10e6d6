// What a panel is doing (a request in flight, then perhaps its speech still playing) and its Stop: while it
// runs the panel's action button is disabled and its Stop shown; Stop or Escape ends it with a short note, a
// model switch ends every panel's. Each has its own abort signal, so ending one ends none of the others.
// A click with nothing to send starts no work: `ask` says what is missing.
const $ = (id) => document.getElementById(id);

// Per panel (its section's data-panel): the action button, its Stop, where "stopped" is said.
const PANELS = {
  chat: { button: "chat-send", stop: "chat-stop", note: "chat-note" },
  speak: { button: "speak-button", stop: "speak-stop", note: "speak-note" },
  images: { button: "image-button", stop: "image-stop", note: "image-status" },
  videos: { button: "video-button", stop: "video-stop", note: "video-status" },
  transcribe: { button: "transcribe-button", stop: "transcribe-stop", note: "transcribe-note" },
};
const running = new Map();  // panel -> its Work still live
const latest = new Map();   // panel -> the number of its newest Work
let made = 0;

export class Work {
  #ctl = new AbortController();
  #onAbort = [];
  #live = true;

  // parent: the model's signal (state.abort): a model switch ends this work too.
  constructor(panel, parent) {
    this.panel = panel;
    this.id = ++made;
    this.signal = AbortSignal.any([parent, this.#ctl.signal]);  // for every request this work makes
    this.stopped = false;  // ended by the user (Stop, Escape), not by a model switch
    const { button, stop, note } = PANELS[panel];
    Object.assign(this, { button: $(button), stopButton: $(stop), note: $(note) });
    running.get(panel)?.#end(true);  // (only one that lingers, its request done: its speech stops)
    running.set(panel, this);
    latest.set(panel, this.id);
    const hadFocus = document.activeElement === this.button;
    this.button.disabled = true;  // (a disabled button loses the focus: to the page's top, for a keyboard)
    this.stopButton.hidden = false;
    if (hadFocus) this.stopButton.focus({ preventScroll: true });  // a keyboard's next Enter stops it
    this.note.textContent = "";
    parent.addEventListener("abort", () => this.#end(true), { once: true, signal: this.#ctl.signal });
  }

  // No newer work began on this panel: what this one made may still be shown.
  get latest() { return latest.get(this.panel) === this.id; }

  // fn() runs if the work is ended before it is done (Stop, Escape, a model switch), at once.
  onAbort(fn) { this.#onAbort.push(fn); }

  // `promise`, or this work's AbortError as soon as it is ended (for waits that take no signal).
  until(promise) {
    return new Promise((resolve, reject) => {
      const abort = () => reject(this.signal.reason);
      if (this.signal.aborted) return abort();
      this.signal.addEventListener("abort", abort, { once: true });
      Promise.resolve(promise).then(resolve, reject).finally(() => this.signal.removeEventListener("abort", abort));
    });
  }

  // The user's Stop: the panel is ready again at once (its requests end as they can), the note says so.
  stop(note = "stopped") {
    if (!this.#live) return false;
    this.stopped = true;
    this.note.textContent = note;
    this.#end(true);
    return true;
  }

  // Its requests are done: the action button is free again. Given `until` (speech still playing), Stop
  // stays shown until that settles.
  done(until = null) {
    if (!until) return this.#end(false);
    if (this.#live && running.get(this.panel) === this) this.button.disabled = false;
    Promise.resolve(until).finally(() => this.#end(false));
  }

  #end(aborted) {
    if (!this.#live) return;
    this.#live = false;
    this.#ctl.abort();
    if (running.get(this.panel) === this) {
      running.delete(this.panel);
      const hadFocus = document.activeElement === this.stopButton;
      this.stopButton.hidden = true;
      this.button.disabled = false;
      // (a hidden button's focus would fall to the page; where the reader scrolled to stays: an answer's end)
      if (hadFocus) this.button.focus({ preventScroll: true });
    }
    if (aborted) for (const fn of this.#onAbort) fn();
  }
}

// Nothing to send: the field that needs filling gets the focus, the panel's note says what it needs.
export function ask(field, note, what) {
  $(note).textContent = what;
  $(field).focus();
}

// Stop (or Escape) on the panel shown; true if it was doing something.
export function stopPanel(panel) {
  return running.get(panel)?.stop() || false;
}

export function bindStops() {
  for (const [panel, { stop }] of Object.entries(PANELS)) $(stop).onclick = () => stopPanel(panel);
}
