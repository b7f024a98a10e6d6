// Audio helpers shared by the panels: base64 <-> pcm16, WAV files, a gapless streaming player.

export const WIRE_RATE = 24000;

export function b64ToBytes(b64) {
  const bin = atob(b64);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

export function bytesToB64(bytes) {
  let bin = "";
  for (let i = 0; i < bytes.length; i += 0x8000) bin += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(bin);
}

export function floatToPcm16(samples) {
  const out = new Int16Array(samples.length);
  for (let i = 0; i < samples.length; i++) {
    const s = Math.max(-1, Math.min(1, samples[i]));
    out[i] = s < 0 ? s * 0x8000 : s * 0x7fff;
  }
  return new Uint8Array(out.buffer);
}

export function pcm16ToFloat(bytes) {
  const even = bytes.length - (bytes.length % 2);
  const view = new DataView(bytes.buffer, bytes.byteOffset, even);
  const out = new Float32Array(even / 2);
  for (let i = 0; i < out.length; i++) out[i] = view.getInt16(2 * i, true) / 0x8000;
  return out;
}

export function wavBlob(pcmChunks, rate) {
  const size = pcmChunks.reduce((n, c) => n + c.length, 0);
  const head = new DataView(new ArrayBuffer(44));
  const put = (o, s) => [...s].forEach((ch, i) => head.setUint8(o + i, ch.charCodeAt(0)));
  put(0, "RIFF"); head.setUint32(4, 36 + size, true); put(8, "WAVE"); put(12, "fmt ");
  head.setUint32(16, 16, true); head.setUint16(20, 1, true); head.setUint16(22, 1, true);
  head.setUint32(24, rate, true); head.setUint32(28, rate * 2, true); head.setUint16(32, 2, true);
  head.setUint16(34, 16, true); put(36, "data"); head.setUint32(40, size, true);
  return new Blob([head, ...pcmChunks], { type: "audio/wav" });
}

// Plays pcm16 chunks back to back as they arrive; `stop()` silences what is queued (barge-in);
// `drained()` resolves once what was pushed has played, or was silenced.
export class StreamPlayer {
  #drainWaiters = [];
  constructor(rate = WIRE_RATE) {
    this.rate = rate;
    this.ctx = null;
    this.next = 0;
    this.sources = new Set();
    this.playedSeconds = 0;
  }
  drained() {
    return this.sources.size ? new Promise((resolve) => this.#drainWaiters.push(resolve)) : Promise.resolve();
  }
  #drainedNow() {
    for (const resolve of this.#drainWaiters.splice(0)) resolve();
  }
  push(pcmBytes) {
    this.ctx ??= new AudioContext({ sampleRate: this.rate });
    const samples = pcm16ToFloat(pcmBytes);
    if (!samples.length) return;
    const buf = this.ctx.createBuffer(1, samples.length, this.rate);
    buf.copyToChannel(samples, 0);
    const src = this.ctx.createBufferSource();
    src.buffer = buf;
    src.connect(this.ctx.destination);
    const at = Math.max(this.ctx.currentTime + 0.02, this.next);
    src.start(at);
    this.next = at + buf.duration;
    this.playedSeconds += buf.duration;
    this.sources.add(src);
    src.onended = () => {
      this.sources.delete(src);
      if (!this.sources.size) this.#drainedNow();
    };
  }
  stop() {
    for (const src of this.sources) { try { src.stop(); } catch { /* already ended */ } }
    this.sources.clear();
    this.next = 0;
    this.#drainedNow();
  }
  async close() {
    this.stop();
    const ctx = this.ctx;  // (taken first: a second close() while this one waits finds nothing to close)
    this.ctx = null;
    if (ctx) await ctx.close();
  }
}

// The microphone (a MediaStream), or an error that says in words why not. A browser offers it only to a secure
// page (https, or http://localhost): served over plain http from another host (omni-run on a GPU box, opened by
// its name) the page has no navigator.mediaDevices at all, which would read "Cannot read properties of undefined".
export async function openMicrophone(audio) {
  if (!navigator.mediaDevices?.getUserMedia) {
    const port = location.port || "80";
    throw new Error(`microphone: the browser offers none to a page served over plain http from ${location.hostname}: ` +
                    `open it over https, or as http://localhost:${port}/ (from another machine through a tunnel: ` +
                    `ssh -L ${port}:localhost:${port} ${location.hostname})`);
  }
  try {
    return await navigator.mediaDevices.getUserMedia({ audio });
  } catch (err) {
    throw new Error(`microphone: ${err.message}`);  // (else "Requested device not found", with no word of what)
  }
}

// Records the microphone to a WAV file (pcm16 at WIRE_RATE): `await start()`, then `await stop()` gives
// { blob, seconds }; onProgress(seconds) after each ~100 ms block. Through the same capture worklet as
// Talk, so it needs no codec in the browser.
export class MicRecorder {
  constructor(onProgress = () => {}) {
    this.onProgress = onProgress;
    this.chunks = [];
    this.samples = 0;
    this.stream = null;
    this.ctx = null;
  }
  async start() {
    this.stream = await openMicrophone({ channelCount: 1, echoCancellation: false });
    this.ctx = new AudioContext({ sampleRate: WIRE_RATE });
    await this.ctx.audioWorklet.addModule("/playground/capture-worklet.js");
    const node = new AudioWorkletNode(this.ctx, "omni-capture");
    node.port.onmessage = (e) => {
      this.chunks.push(floatToPcm16(e.data));
      this.samples += e.data.length;
      this.onProgress(this.samples / WIRE_RATE);
    };
    this.ctx.createMediaStreamSource(this.stream).connect(node);
  }
  async stop() {
    this.stream?.getTracks().forEach((t) => t.stop());
    const ctx = this.ctx;  // (taken first: a second stop() while this one waits finds nothing to close)
    this.stream = this.ctx = null;
    if (ctx) await ctx.close();
    return { blob: wavBlob(this.chunks, WIRE_RATE), seconds: this.samples / WIRE_RATE };
  }
}
