// The WebSocket to /v1/realtime: JSON events, the binary audio fast path, session settings
// re-applied on every (re)connect, and automatic reconnect with exponential backoff.
// See docs/protocol.md for the events.

const BACKOFF_MS = { first: 500, max: 10000 };

function deepMerge(base, update) {
  const out = { ...base };
  for (const [key, value] of Object.entries(update)) {
    const both = value && typeof value === "object" && !Array.isArray(value) &&
      out[key] && typeof out[key] === "object";
    out[key] = both ? deepMerge(out[key], value) : value;
  }
  return out;
}

/** Decode a binary server frame: [u16 LE n][n bytes JSON header][PCM16 LE]. */
export function decodeAudioFrame(buf) {
  const n = new DataView(buf).getUint16(0, true);
  const header = JSON.parse(new TextDecoder().decode(new Uint8Array(buf, 2, n)));
  return { header, pcm: new Int16Array(buf, 2 + n, (buf.byteLength - 2 - n) / 2) };
}

export class RealtimeConnection {
  /**
   * handlers: onEvent(event), onAudio(header, Int16Array), onState(state, detail).
   * States: connecting, open (session configured), retrying (detail: {delayMs, why}), closed.
   */
  constructor(url, handlers) {
    this.url = url;
    this.handlers = handlers;
    // x_events: the paused/resumed/cleared playback events and the turn metrics this page shows.
    this.settings = { type: "realtime", x_binary_audio: true, x_events: true };
    this.ws = null;
    this.ready = false; // our settings were applied: binary audio may flow
    this.failures = 0;
    this.stopped = false;
    this.timer = null;
  }

  connect() {
    this.stopped = false;
    clearTimeout(this.timer);
    this.handlers.onState("connecting");
    const ws = new WebSocket(this.url);
    ws.binaryType = "arraybuffer";
    this.ws = ws;
    let opened = false;
    ws.onopen = () => {
      opened = true;
      this.sendJson({ type: "session.update", session: this.settings });
    };
    ws.onmessage = ({ data }) => {
      if (typeof data !== "string") {
        const { header, pcm } = decodeAudioFrame(data);
        this.handlers.onAudio(header, pcm);
        return;
      }
      const event = JSON.parse(data);
      if (event.type === "session.updated" && !this.ready) {
        this.ready = true;
        this.failures = 0;
        this.handlers.onState("open");
      }
      this.handlers.onEvent(event);
    };
    ws.onclose = (e) => {
      if (this.ws !== ws) return;
      this.ready = false;
      this.ws = null;
      if (this.stopped) {
        this.handlers.onState("closed");
        return;
      }
      this.retry(opened, e);
    };
  }

  async retry(opened, closeEvent) {
    const delayMs = Math.min(BACKOFF_MS.max, BACKOFF_MS.first * 2 ** this.failures) * (1 + 0.2 * Math.random());
    this.failures += 1;
    let why = opened ? `connection lost (${closeEvent.code}${closeEvent.reason ? ": " + closeEvent.reason : ""})` : "cannot connect";
    if (!opened) why = await explainFailedConnect();
    this.handlers.onState("retrying", { delayMs, why });
    this.timer = setTimeout(() => this.connect(), delayMs);
  }

  close() {
    this.stopped = true;
    clearTimeout(this.timer);
    if (this.ws) this.ws.close(1000);
  }

  sendJson(event) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(event));
    return true;
  }

  /** Send a client event once the session is configured (dropped while disconnected). */
  send(event) {
    return this.ready && this.sendJson(event);
  }

  /** Raw PCM16 at the session input rate (binary fast path). */
  sendAudio(buffer) {
    if (!this.ready) return false;
    this.ws.send(buffer);
    return true;
  }

  /** Merge a partial session into the settings (kept for reconnects) and send it. */
  updateSession(partial) {
    this.settings = deepMerge(this.settings, partial);
    return this.sendJson({ type: "session.update", session: partial });
  }
}

/** A browser cannot read the HTTP status of a refused WebSocket: ask /ready why. */
async function explainFailedConnect() {
  try {
    const res = await fetch("/ready", { cache: "no-store" });
    const text = (await res.text()).trim();
    if (res.status === 503) {
      if (text.startsWith("full")) return "the server is full (all session slots busy)";
      if (text.startsWith("models")) return "the server is still loading its models";
      if (text.startsWith("draining")) return "the server is shutting down";
      return `the server is not ready (${text})`;
    }
    if (res.ok) return "the server refused the connection (a token or origin rule?)";
    return `the server answered HTTP ${res.status}`;
  } catch {
    return "the server is unreachable";
  }
}
