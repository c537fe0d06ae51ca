// Playback worklet: a queue of PCM16 chunks (session output rate) played at the
// AudioContext rate. Messages in: {type: "push", item, pcm}, {type: "clear"}, {type: "end", item},
// {type: "pause"} / {type: "resume"} (hold the queue where it is, x.output_audio_buffer.paused/resumed).
// Messages out: "played" every ~250 ms while playing, "cleared" (answer to clear, with
// droppedMs: the audio it emptied, exact, as every push posted before the clear is queued),
// "finished" when an ended item has played to its last sample. Positions are ms of the
// item's audio played (what x.playback / conversation.item.truncate report).

const REPORT_S = 0.25;

class PlayerProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    this.inputRate = options.processorOptions.inputRate;
    this.step = this.inputRate / sampleRate; // input samples per output sample
    this.queue = []; // {item, data: Float32Array}
    this.pos = 0; // fractional read position in queue[0].data
    this.item = null; // item whose audio is playing
    this.played = 0; // input samples of this.item played
    this.totalPlayed = 0; // input samples played since start (all items)
    this.ended = new Set(); // items whose audio is complete
    this.sinceReport = 0;
    this.paused = false;
    this.port.onmessage = ({ data }) => this.command(data);
  }

  ms(samples) {
    return (1000 * samples) / this.inputRate;
  }

  queuedMs() {
    let n = -this.pos;
    for (const c of this.queue) n += c.data.length;
    return Math.max(0, this.ms(n));
  }

  report(type, extra = {}) {
    this.port.postMessage({
      type, item: this.item, playedMs: this.ms(this.played),
      queuedMs: this.queuedMs(), totalPlayedMs: this.ms(this.totalPlayed), ...extra,
    });
  }

  command(msg) {
    if (msg.type === "push") {
      const pcm = new Int16Array(msg.pcm);
      const data = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i++) data[i] = pcm[i] / 32768;
      this.queue.push({ item: msg.item, data });
    } else if (msg.type === "pause" || msg.type === "resume") {
      this.paused = msg.type === "pause";
    } else if (msg.type === "clear") {
      const droppedMs = this.queuedMs();
      this.paused = false;
      this.queue = [];
      this.pos = 0;
      this.report("cleared", { droppedMs });
      this.item = null;
      this.played = 0;
    } else if (msg.type === "end") {
      this.ended.add(msg.item);
      this.maybeFinished();
    }
  }

  maybeFinished() {
    if (this.item !== null && this.ended.has(this.item) && !this.queue.some((c) => c.item === this.item)) {
      this.report("finished");
      this.ended.delete(this.item);
      this.item = null;
      this.played = 0;
    }
  }

  process(inputs, outputs) {
    const out = outputs[0][0];
    let wasPlaying = false;
    for (let i = 0; i < out.length; i++) {
      const head = this.paused ? null : this.queue[0];
      if (!head) {
        out[i] = 0;
        continue;
      }
      if (head.item !== this.item) {
        this.item = head.item;
        this.played = 0;
      }
      wasPlaying = true;
      const j = Math.floor(this.pos);
      const f = this.pos - j;
      const next = j + 1 < head.data.length ? head.data[j + 1] : head.data[j];
      out[i] = head.data[j] * (1 - f) + next * f;
      const before = Math.floor(this.pos);
      this.pos += this.step;
      const consumed = Math.min(Math.floor(this.pos), head.data.length) - before;
      this.played += consumed;
      this.totalPlayed += consumed;
      if (this.pos >= head.data.length) {
        this.pos -= head.data.length;
        this.queue.shift();
      }
    }
    for (let c = 1; c < outputs[0].length; c++) outputs[0][c].set(out);
    if (wasPlaying) {
      this.sinceReport += out.length;
      if (this.sinceReport >= REPORT_S * sampleRate) {
        this.sinceReport = 0;
        this.report("played");
      }
      if (this.queue.length === 0) this.report("played");
      this.maybeFinished();
    }
    return true;
  }
}

registerProcessor("player-processor", PlayerProcessor);
