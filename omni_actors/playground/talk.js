// Talk: the microphone streams to /v1/realtime (pcm16 24 kHz), server VAD ends turns, answers play as they stream.
import { StreamPlayer, WIRE_RATE, b64ToBytes, bytesToB64, floatToPcm16, openMicrophone } from "./audio.js";

const AUDIO_DELTAS = new Set(["response.audio.delta", "response.output_audio.delta"]);
const OPEN_TIMEOUT_MS = 10000;
const TRANSCRIPT_DELTAS = new Set(["response.audio_transcript.delta", "response.output_audio_transcript.delta",
                                   "response.text.delta", "response.output_text.delta"]);

export class Talk {
  // onAnswer(delta, fresh): assistant text; onUser(itemId, text, done): the user's turn, deltas then the
  // whole transcript (done, text null when transcription failed); onState(word); onError(message).
  // transcribe: ask for the user's transcripts (only a model with a speech recognizer makes them).
  // onClosed(): the socket closed without stop() (the server went away or ended the session).
  constructor({ model, key, transcribe, onAnswer, onUser, onState, onError, onClosed = () => {} }) {
    Object.assign(this, { model, key, transcribe, onAnswer, onUser, onState, onError, onClosed });
    this.player = new StreamPlayer(WIRE_RATE);
    this.ws = null;
    this.ctx = null;
    this.stream = null;
    this.stopped = false;
  }

  // Each await may outlive a stop() (a click, a model switch): past one, what start made is released.
  async #unlessStopped(promise) {
    const value = await promise;
    if (this.stopped) {
      await this.stop();
      throw new Error("stopped while connecting");
    }
    return value;
  }

  async start() {
    this.onState("connecting");
    this.stream = await this.#unlessStopped(openMicrophone({ channelCount: 1, echoCancellation: true }));
    this.ctx = new AudioContext({ sampleRate: WIRE_RATE });
    await this.#unlessStopped(this.ctx.audioWorklet.addModule("/playground/capture-worklet.js"));
    const node = new AudioWorkletNode(this.ctx, "omni-capture");
    this.ctx.createMediaStreamSource(this.stream).connect(node);
    const url = new URL(`/v1/realtime?model=${encodeURIComponent(this.model)}`, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const protocols = ["realtime"];
    if (this.key) protocols.push(`openai-insecure-api-key.${this.key}`);
    const ws = this.ws = new WebSocket(url, protocols);
    ws.onmessage = (msg) => this.onEvent(JSON.parse(msg.data));
    ws.onerror = () => this.onError("the realtime connection failed");
    let timer;
    await this.#unlessStopped(new Promise((resolve, reject) => {
      ws.onopen = resolve;
      ws.onclose = () => reject(new Error("the realtime connection was refused"));
      timer = setTimeout(() => reject(new Error("the realtime connection did not open")), OPEN_TIMEOUT_MS);
    }).finally(() => clearTimeout(timer)));
    ws.onclose = () => {
      this.onState("closed");
      if (!this.stopped) this.onClosed();
    };
    const session = { modalities: ["text", "audio"], turn_detection: { type: "server_vad" } };
    if (this.transcribe) session.input_audio_transcription = { model: "whisper-1" };
    this.send({ type: "session.update", session });
    node.port.onmessage = (e) => {
      if (this.ws?.readyState === WebSocket.OPEN) {
        this.send({ type: "input_audio_buffer.append", audio: bytesToB64(floatToPcm16(e.data)) });
      }
    };
    this.onState("listening");
  }

  send(event) { this.ws.send(JSON.stringify(event)); }

  onEvent(ev) {
    if (AUDIO_DELTAS.has(ev.type)) {
      this.player.push(b64ToBytes(ev.delta));
      this.onState("speaking");
    } else if (TRANSCRIPT_DELTAS.has(ev.type)) {
      this.onAnswer(ev.delta, false);
    } else if (ev.type === "response.created") {
      this.onAnswer("", true);
    } else if (ev.type === "input_audio_buffer.speech_started") {
      this.player.stop();  // barge-in: the server truncates the answer, we stop playing it
      this.onState("hearing you");
    } else if (ev.type === "conversation.item.input_audio_transcription.delta") {
      this.onUser(ev.item_id, ev.delta, false);  // the user's words as the model hears them
    } else if (ev.type === "conversation.item.input_audio_transcription.completed") {
      this.onUser(ev.item_id, ev.transcript, true);  // replaces the deltas of the same item
    } else if (ev.type === "conversation.item.input_audio_transcription.failed") {
      this.onUser(ev.item_id, null, true);
    } else if (ev.type === "response.done") {
      this.onState("listening");
    } else if (ev.type === "error") {
      this.onError(ev.error?.message || "realtime error");
    }
  }

  get playedSeconds() { return this.player.playedSeconds; }

  async stop() {
    this.stopped = true;
    if (this.ws) this.ws.onclose = null;
    this.ws?.close();
    this.ws = null;
    this.stream?.getTracks().forEach((t) => t.stop());
    const ctx = this.ctx;  // (taken first: a second stop() while this one waits finds nothing to close)
    this.ctx = null;
    if (ctx && ctx.state !== "closed") await ctx.close();
    await this.player.close();
    this.onState("idle");
  }
}
