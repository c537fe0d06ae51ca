// Microphone capture worklet: float samples at the AudioContext rate in, PCM16 chunks at
// the session input rate out (posted as transferable ArrayBuffers with their RMS level).
// Downsampling low-passes first (windowed-sinc FIR) so speech does not alias.

const TAPS = 63;

function lowpass(cutoff) {
  // cutoff: cycles per input sample (< 0.5). Blackman-windowed sinc, unity DC gain.
  const h = new Float32Array(TAPS);
  const mid = (TAPS - 1) / 2;
  let sum = 0;
  for (let i = 0; i < TAPS; i++) {
    const x = i - mid;
    const sinc = x === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * x) / (Math.PI * x);
    const w = 0.42 - 0.5 * Math.cos((2 * Math.PI * i) / (TAPS - 1)) + 0.08 * Math.cos((4 * Math.PI * i) / (TAPS - 1));
    h[i] = sinc * w;
    sum += h[i];
  }
  for (let i = 0; i < TAPS; i++) h[i] /= sum;
  return h;
}

class MicProcessor extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const { targetRate, chunkMs } = options.processorOptions;
    this.step = sampleRate / targetRate; // input samples per output sample
    this.taps = this.step > 1 ? lowpass(0.45 / this.step) : null;
    this.history = new Float32Array(TAPS - 1); // last inputs, for the FIR across blocks
    this.filtered = []; // filtered input not yet consumed
    this.pos = 0; // fractional read position in this.filtered
    this.chunkSize = Math.round((targetRate * chunkMs) / 1000); // samples
    this.chunk = new Int16Array(this.chunkSize);
    this.fill = 0;
    this.sumSquares = 0;
  }

  filter(block) {
    if (!this.taps) return block;
    const n = block.length;
    const x = new Float32Array(this.history.length + n);
    x.set(this.history);
    x.set(block, this.history.length);
    const y = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      let acc = 0;
      for (let k = 0; k < TAPS; k++) acc += this.taps[k] * x[i + k];
      y[i] = acc;
    }
    this.history = x.slice(n);
    return y;
  }

  emit(sample) {
    const s = Math.max(-1, Math.min(1, sample));
    this.chunk[this.fill++] = s < 0 ? s * 0x8000 : s * 0x7fff;
    this.sumSquares += s * s;
    if (this.fill === this.chunkSize) {
      const rms = Math.sqrt(this.sumSquares / this.fill);
      const pcm = this.chunk.buffer;
      this.port.postMessage({ pcm, rms }, [pcm]);
      this.chunk = new Int16Array(this.chunkSize); // the old buffer was transferred (detached)
      this.fill = 0;
      this.sumSquares = 0;
    }
  }

  process(inputs) {
    const channel = inputs[0] && inputs[0][0];
    if (!channel) return true;
    for (const v of this.filter(channel)) this.filtered.push(v);
    const buf = this.filtered;
    while (this.pos + 1 < buf.length) {
      const i = Math.floor(this.pos);
      const f = this.pos - i;
      this.emit(buf[i] * (1 - f) + buf[i + 1] * f);
      this.pos += this.step;
    }
    const used = Math.floor(this.pos);
    this.filtered = buf.slice(used);
    this.pos -= used;
    return true;
  }
}

registerProcessor("mic-processor", MicProcessor);
