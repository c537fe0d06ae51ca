// Audio in and out through AudioWorklets: Microphone (PCM16 chunks at the session input
// rate) and Player (a queue that empties at once on barge-in and reports played ms).

/** Output rates the server can send (Hz); the player needs no resampling at these. */
export const SERVER_OUTPUT_RATES = [16000, 22050, 24000, 48000];

/** Why the microphone could not be opened, in words a user can act on. */
export function micErrorMessage(err) {
  if (!window.isSecureContext || !navigator.mediaDevices) {
    return "The microphone needs a secure page: open voxloop at http://localhost or over HTTPS.";
  }
  switch (err && err.name) {
    case "NotAllowedError":
    case "SecurityError":
      return "Microphone access was denied. Allow it in the browser's site settings, then press Start again.";
    case "NotFoundError":
    case "OverconstrainedError":
      return "No microphone was found. Plug one in, then press Start again.";
    case "NotReadableError":
      return "The microphone is busy or failed (is another program using it?).";
    default:
      return `Could not open the microphone: ${err && err.message ? err.message : err}`;
  }
}

export class Microphone {
  /** Capture with echo cancellation, noise suppression and auto gain; onChunk(ArrayBuffer PCM16, rms). */
  static async open(ctx, targetRate, onChunk, chunkMs = 20) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      throw Object.assign(new Error("getUserMedia is unavailable"), { name: "SecurityError" });
    }
    const stream = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true },
    });
    await ctx.audioWorklet.addModule("mic-worklet.js");
    const node = new AudioWorkletNode(ctx, "mic-processor", {
      numberOfInputs: 1, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: { targetRate, chunkMs },
    });
    node.port.onmessage = ({ data }) => onChunk(data.pcm, data.rms);
    node.onprocessorerror = (e) => console.error("microphone worklet failed", e);
    const source = ctx.createMediaStreamSource(stream);
    const mute = ctx.createGain();
    mute.gain.value = 0; // keeps the node pulled by the graph without playing the mic back
    source.connect(node).connect(mute).connect(ctx.destination);
    return new Microphone(stream, source, node);
  }

  constructor(stream, source, node) {
    this.stream = stream;
    this.source = source;
    this.node = node;
  }

  close() {
    this.stream.getTracks().forEach((t) => t.stop());
    this.source.disconnect();
    this.node.disconnect();
  }
}

export class Player {
  /** A playback queue for PCM16 at inputRate Hz; onMessage gets the worklet's reports. */
  static async create(ctx, inputRate, onMessage) {
    await ctx.audioWorklet.addModule("player-worklet.js");
    const node = new AudioWorkletNode(ctx, "player-processor", {
      numberOfInputs: 0, numberOfOutputs: 1, outputChannelCount: [1],
      processorOptions: { inputRate },
    });
    node.connect(ctx.destination);
    node.onprocessorerror = (e) => console.error("playback worklet failed", e);
    return new Player(node, inputRate, onMessage);
  }

  constructor(node, inputRate, onMessage) {
    this.node = node;
    this.inputRate = inputRate;
    this.onMessage = onMessage;
    this.waiting = [];
    node.port.onmessage = ({ data }) => {
      if (data.type === "cleared") this.waiting.splice(0).forEach((resolve) => resolve(data));
      this.onMessage(data);
    };
  }

  /** Queue PCM16 (Int16Array) of an assistant item. */
  push(item, pcm) {
    const copy = pcm.slice(); // own buffer, transferred to the worklet
    this.node.port.postMessage({ type: "push", item, pcm: copy.buffer }, [copy.buffer]);
  }

  /** All of the item's audio has been pushed ("finished" follows once it has played). */
  end(item) {
    this.node.port.postMessage({ type: "end", item });
  }

  /** Hold playback where it is (queued and arriving audio is kept) / play on. */
  pause() {
    this.node.port.postMessage({ type: "pause" });
  }

  resume() {
    this.node.port.postMessage({ type: "resume" });
  }

  /** Empty the queue now; resolves to {item, playedMs, droppedMs} of what was interrupted. */
  clear() {
    return new Promise((resolve) => {
      this.waiting.push(resolve);
      this.node.port.postMessage({ type: "clear" });
    });
  }

  close() {
    this.node.disconnect();
  }
}
