// Talk: the microphone streams to /v1/realtime (pcm16 24 kHz), server VAD ends turns, answers play as they stream.
import { StreamPlayer, WIRE_RATE, b64ToBytes, bytesToB64, floatToPcm16 } from "./audio.js";

const AUDIO_DELTAS = new Set(["response.audio.delta", "response.output_audio.delta"]);
const TRANSCRIPT_DELTAS = new Set(["response.audio_transcript.delta", "response.output_audio_transcript.delta",
                                   "response.text.delta", "response.output_text.delta"]);

export class Talk {
  // onAnswer(delta, fresh): assistant text; onUser(itemId, text, done): the user's turn, deltas then the
  // whole transcript (done, text null when transcription failed); onState(word); onError(message).
  // transcribe: ask for the user's transcripts (only a model with a speech recognizer makes them).
  constructor({ model, key, transcribe, onAnswer, onUser, onState, onError }) {
    Object.assign(this, { model, key, transcribe, onAnswer, onUser, onState, onError });
    this.player = new StreamPlayer(WIRE_RATE);
    this.ws = null;
    this.ctx = null;
    this.stream = null;
  }

  async start() {
    this.onState("connecting");
    this.stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
    this.ctx = new AudioContext({ sampleRate: WIRE_RATE });
    await this.ctx.audioWorklet.addModule("/playground/capture-worklet.js");
    const node = new AudioWorkletNode(this.ctx, "omni-capture");
    this.ctx.createMediaStreamSource(this.stream).connect(node);
    const url = new URL(`/v1/realtime?model=${encodeURIComponent(this.model)}`, location.href);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const protocols = ["realtime"];
    if (this.key) protocols.push(`openai-insecure-api-key.${this.key}`);
    this.ws = new WebSocket(url, protocols);
    this.ws.onmessage = (msg) => this.onEvent(JSON.parse(msg.data));
    this.ws.onclose = () => this.onState("closed");
    this.ws.onerror = () => this.onError("the realtime connection failed");
    await new Promise((resolve, reject) => {
      this.ws.onopen = resolve;
      setTimeout(() => reject(new Error("the realtime connection did not open")), 10000);
    });
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
    this.ws?.close();
    this.ws = null;
    this.stream?.getTracks().forEach((t) => t.stop());
    if (this.ctx) await this.ctx.close();
    this.ctx = null;
    await this.player.close();
    this.onState("idle");
  }
}
