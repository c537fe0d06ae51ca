// The conversation view: one bubble per user item / assistant response, with partial
// text while it arrives and the turn's latency figures under the assistant's bubble.

export class Transcript {
  constructor(root) {
    this.root = root;
    this.bubbles = new Map(); // key -> {el, text, final}
  }

  bubble(key, who) {
    let b = this.bubbles.get(key);
    if (!b) {
      const el = document.createElement("div");
      el.className = `bubble ${who}`;
      el.innerHTML = '<p class="text"></p><p class="meta"></p>';
      this.root.append(el);
      b = { el, text: "", final: false };
      this.bubbles.set(key, b);
    }
    return b;
  }

  render(b, note) {
    const p = b.el.querySelector(".text");
    p.textContent = b.text || (b.final ? "(nothing heard)" : "…");
    b.el.classList.toggle("partial", !b.final);
    if (note) b.el.querySelector(".meta").textContent = note;
    this.root.scrollTop = this.root.scrollHeight;
  }

  /** The user's words for item ``key``; ``final`` once the transcript is complete. */
  user(key, text, final = false) {
    const b = this.bubble(key, "user");
    if (final || text) b.text = text;
    b.final = b.final || final;
    if (final && !text.trim()) {
      b.el.remove(); // noise, or nothing said: the server does not answer it
      this.bubbles.delete(key);
      return;
    }
    this.render(b);
  }

  userDelta(key, delta) {
    const b = this.bubble(key, "user");
    if (b.final) return;
    b.text += delta;
    this.render(b);
  }

  assistant(key, text, final = false, status = null) {
    const b = this.bubble(key, "assistant");
    if (text || final) b.text = text || b.text;
    b.final = final;
    this.render(b, status ? `(${status})` : "");
  }

  assistantDelta(key, delta) {
    const b = this.bubble(key, "assistant");
    b.text += delta;
    this.render(b);
  }

  /** A function call of a response (item ``key``): its name and arguments; its result follows. */
  call(key, name, args) {
    const b = this.bubble(key, "call");
    b.text = `${name}(${args})`;
    b.final = true;
    this.render(b);
  }

  callResult(key, output) {
    const b = this.bubbles.get(key);
    if (b) b.el.querySelector(".meta").textContent = `→ ${output}`;
  }

  /** Remove a bubble (a response that only called functions has no words). */
  drop(key) {
    const b = this.bubbles.get(key);
    if (b) b.el.remove();
    this.bubbles.delete(key);
  }

  text(key) {
    const b = this.bubbles.get(key);
    return b ? b.text : "";
  }

  markInterrupted(key) {
    const b = key && this.bubbles.get(key);
    if (b) b.el.classList.add("interrupted");
  }

  /** Latency figures (ms) of a turn, from x.turn.metrics. */
  metrics(key, m) {
    const b = this.bubbles.get(key);
    if (!b) return;
    const s = m.stages_ms || {};
    const parts = [];
    if (m.voice_to_voice_ms != null) parts.push(`voice→voice ${Math.round(m.voice_to_voice_ms)} ms`);
    if (s.asr_start != null && s.asr_final != null) parts.push(`asr ${Math.round(s.asr_final - s.asr_start)}`);
    if (s.llm_first_token != null) parts.push(`llm ${Math.round(s.llm_first_token)}`);
    if (s.first_audio_sent != null) parts.push(`first audio ${Math.round(s.first_audio_sent)}`);
    const meta = b.el.querySelector(".meta");
    meta.textContent = [meta.textContent, parts.join(" · ")].filter(Boolean).join(" ");
  }
}
