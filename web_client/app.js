// voxloop browser client: hands-free (server VAD) or hold-to-talk voice chat over
// /v1/realtime. Plain ES module, no build step. Counters for tests live on window.voxloop.

import { Microphone, Player, SERVER_OUTPUT_RATES, micErrorMessage } from "./audio.js";
import { RealtimeConnection } from "./realtime.js";
import { Transcript } from "./transcript.js";
import { DEMO_TOOLS, answerCalls } from "./tools.js";

const INPUT_RATE = 16000; // Hz sent to the server (what its ASR uses)
const MIN_TALK_MS = 120; // shorter push-to-talk is not committed (the server needs 100 ms)

const $ = (id) => document.getElementById(id);
const ui = {
  status: $("status"), notice: $("notice"), start: $("start"), talk: $("talk"),
  level: $("level"), settings: $("settings"), conversation: $("conversation"),
};

/** Test hooks and live figures (read by tests/test_browser.py). */
const counters = (window.voxloop = {
  state: "connecting", connected: false, started: false, mode: "vad", sessionId: null, session: null,
  userTranscripts: [], assistantTranscripts: [], turnMetrics: [], errors: [], toolCalls: [],
  audioChunksReceived: 0, audioChunksDropped: 0, audioMsReceived: 0, audioMsPlayed: 0,
  queueMs: 0, bargeIns: 0, lastBargeIn: null, pauses: 0, resumes: 0, micLevel: 0, micChunks: 0, micChunksSent: 0,
});

const transcript = new Transcript(ui.conversation);
const state = {
  ctx: null, mic: null, player: null, outputRate: 24000,
  talking: false, talkMs: 0,
  activeResponse: null, // response in progress
  pausedItem: null, // assistant item the server paused (speech over it), until resumed or cancelled
  responseItems: new Map(), // response id -> assistant item id
  itemResponses: new Map(), // assistant item id -> response id
  dropped: new Set(), // responses talked over: later audio is not played
  calls: new Map(), // response id -> its complete function calls
};

const connection = new RealtimeConnection(
  `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/realtime`,
  { onEvent, onAudio, onState },
);
connection.updateSession({
  audio: { input: { format: { type: "audio/pcm", rate: INPUT_RATE } } },
});
connection.connect();

// ------------------------------------------------------------------ connection state
function onState(s, detail) {
  counters.state = s;
  counters.connected = s === "open";
  ui.status.dataset.state = s;
  ui.status.textContent = {
    connecting: "connecting…", open: "connected", closed: "disconnected",
    retrying: detail ? `reconnecting in ${Math.round(detail.delayMs / 1000)} s: ${detail.why}` : "reconnecting",
  }[s];
  ui.talk.disabled = !(s === "open" && state.mic && counters.mode === "ptt");
  if (s === "retrying" && state.talking) stopTalking(false);
}

function notify(text, kind = "error") {
  ui.notice.textContent = text;
  ui.notice.dataset.kind = kind;
  ui.notice.hidden = !text;
}

// ------------------------------------------------------------------ start: audio on a user gesture
ui.start.addEventListener("click", async () => {
  if (state.mic) return stopAudio();
  ui.start.disabled = true;
  try {
    await startAudio();
    notify("");
  } catch (err) {
    console.error(err);
    notify(micErrorMessage(err));
    stopAudio();
  } finally {
    ui.start.disabled = false;
  }
});

async function startAudio() {
  state.ctx = new AudioContext({ latencyHint: "interactive" });
  await state.ctx.resume();
  const rate = state.ctx.sampleRate;
  state.outputRate = SERVER_OUTPUT_RATES.includes(rate) ? rate : 24000; // else the worklet resamples
  connection.updateSession({ audio: { output: { format: { type: "audio/pcm", rate: state.outputRate } } } });
  state.player = await Player.create(state.ctx, state.outputRate, onPlayer);
  state.mic = await Microphone.open(state.ctx, INPUT_RATE, onMicChunk);
  counters.started = true;
  ui.start.textContent = "Stop";
  ui.talk.disabled = !(counters.connected && counters.mode === "ptt");
}

function stopAudio() {
  if (state.talking) stopTalking(false);
  state.mic?.close();
  state.player?.close();
  state.ctx?.close();
  Object.assign(state, { mic: null, player: null, ctx: null });
  counters.started = false;
  ui.start.textContent = "Start";
  ui.talk.disabled = true;
}

function onMicChunk(pcm, rms) {
  counters.micLevel = rms;
  counters.micChunks += 1;
  const db = 20 * Math.log10(Math.max(rms, 1e-5));
  ui.level.style.width = `${Math.max(0, Math.min(1, (db + 60) / 60)) * 100}%`;
  if (counters.mode === "ptt" && !state.talking) return;
  if (connection.sendAudio(pcm)) {
    counters.micChunksSent += 1;
    state.talkMs += (1000 * pcm.byteLength) / 2 / INPUT_RATE;
  }
}

// ------------------------------------------------------------------ playback
function onPlayer(msg) {
  counters.queueMs = msg.queuedMs;
  counters.audioMsPlayed = msg.totalPlayedMs;
  const responseId = state.itemResponses.get(msg.item);
  if (!msg.item || state.dropped.has(responseId)) return;
  if (msg.type === "played" || msg.type === "finished") {
    connection.send({
      type: "x.playback", item_id: msg.item, response_id: responseId,
      audio_end_ms: Math.round(msg.playedMs), finished: msg.type === "finished",
    });
  }
}

/** Stop the assistant now (the user talks over it): empty the queue, say what was heard.
 * Harmless when nothing plays. The worklet says what it emptied: counters.queueMs is its
 * last report, stale by up to 250 ms and 0 while audio just pushed has not started. */
async function bargeIn() {
  if (!state.player) return;
  if (state.activeResponse) state.dropped.add(state.activeResponse);
  const { item, playedMs, droppedMs } = await state.player.clear();
  if (!item && !droppedMs) return;
  if (item) {
    state.dropped.add(state.itemResponses.get(item));
    connection.send({ type: "conversation.item.truncate", item_id: item, content_index: 0, audio_end_ms: Math.round(playedMs) });
  }
  counters.bargeIns += 1;
  counters.lastBargeIn = { queueMsBefore: droppedMs, playedMs, queueMsAfter: counters.queueMs, item };
  transcript.markInterrupted(state.itemResponses.get(item));
}

function onAudio(header, pcm) {
  counters.audioChunksReceived += 1;
  if (header.type !== "response.output_audio.delta") return; // x.tts.* is not used here
  if (state.dropped.has(header.response_id) || !state.player) {
    counters.audioChunksDropped += 1;
    return;
  }
  counters.audioMsReceived += (1000 * pcm.length) / state.outputRate;
  state.player.push(header.item_id, pcm);
}

// ------------------------------------------------------------------ server events
function onEvent(e) {
  switch (e.type) {
    case "session.created":
    case "session.updated":
      counters.sessionId = e.session.id;
      counters.session = e.session;
      fillSettings(e.session);
      break;
    case "input_audio_buffer.speech_started":
      transcript.user(e.item_id, "");
      // semantic_vad pauses the reply first (x.output_audio_buffer.paused): keep its audio
      if (!state.pausedItem) bargeIn();
      break;
    case "x.output_audio_buffer.paused":
      state.pausedItem = e.item_id;
      counters.pauses += 1;
      if (state.player) state.player.pause();
      break;
    case "x.output_audio_buffer.resumed":
      if (state.pausedItem === e.item_id) state.pausedItem = null;
      counters.resumes += 1;
      if (state.player) state.player.resume();
      break;
    case "x.output_audio_buffer.cleared": // a real interruption: the paused audio goes
      if (state.pausedItem === e.item_id) state.pausedItem = null;
      bargeIn();
      break;
    case "input_audio_buffer.committed":
      transcript.user(e.item_id, "");
      break;
    case "conversation.item.input_audio_transcription.delta":
      transcript.userDelta(e.item_id, e.delta);
      break;
    case "conversation.item.input_audio_transcription.completed":
      transcript.user(e.item_id, e.transcript, true);
      if (e.transcript.trim()) counters.userTranscripts.push(e.transcript);
      break;
    case "response.created":
      state.activeResponse = e.response.id;
      transcript.assistant(e.response.id, "");
      break;
    case "response.output_item.added":
      if (e.item.type !== "message") break;
      state.responseItems.set(e.response_id, e.item.id);
      state.itemResponses.set(e.item.id, e.response_id);
      break;
    case "response.output_item.done": // a function call: shown, run when its response is done
      if (e.item.type !== "function_call" || e.item.status !== "completed") break;
      if (!state.calls.has(e.response_id)) state.calls.set(e.response_id, []);
      state.calls.get(e.response_id).push(e.item);
      transcript.call(e.item.id, e.item.name, e.item.arguments);
      break;
    case "response.output_audio_transcript.delta":
    case "response.output_text.delta":
      transcript.assistantDelta(e.response_id, e.delta);
      break;
    case "response.done":
      onResponseDone(e.response);
      break;
    case "x.turn.metrics":
      counters.turnMetrics.push(e.metrics);
      transcript.metrics(e.response_id, e.metrics);
      break;
    case "conversation.item.input_audio_transcription.failed": // a model failed: no response follows
    case "error":
      onError(e.error);
      break;
  }
}

function onResponseDone(response) {
  if (state.activeResponse === response.id) state.activeResponse = null;
  if (response.status === "cancelled" && state.pausedItem === state.responseItems.get(response.id)) {
    state.pausedItem = null; // a real interruption: the paused audio is dropped below
  }
  const item = state.responseItems.get(response.id);
  const message = (response.output || []).find((o) => o.type === "message");
  const text = (message && (message.content || []).map((p) => p.transcript || p.text || "").join(""))
    || transcript.text(response.id);
  const calls = state.calls.get(response.id) || [];
  state.calls.delete(response.id);
  if (calls.length && response.status === "completed") {
    if (!text) transcript.drop(response.id); // a reply that only calls: its call bubbles say it
    answerCalls(connection, calls, (call, output) => {
      transcript.callResult(call.id, output);
      counters.toolCalls.push({ name: call.name, arguments: call.arguments, output });
    });
    if (!text) return;
  }
  transcript.assistant(response.id, text, true, response.status === "completed" ? null : response.status);
  if (text.trim()) counters.assistantTranscripts.push(text);
  const details = response.status_details;
  if (response.status === "failed" && details && details.error) onError(details.error);
  if (response.status === "cancelled" && !state.dropped.has(response.id)) bargeIn();
  else if (item && state.player) state.player.end(item);
}

function onError(error) {
  counters.errors.push(error.code);
  if (error.code === "response_cancel_not_active") return; // raced with the end of a response
  if (error.code === "input_audio_buffer_commit_empty") return notify("Too short: hold the button while you talk.", "info");
  const retry = error.retry_after_ms ? ` Try again in ${Math.ceil(error.retry_after_ms / 1000)} s.` : "";
  notify(`Server: ${error.message}${retry}`);
}

// ------------------------------------------------------------------ hands-free / hold to talk
document.querySelectorAll("input[name=mode]").forEach((radio) =>
  radio.addEventListener("change", () => setMode(radio.value)));

function setMode(mode) {
  counters.mode = mode;
  const detection = { vad: { type: "server_vad" }, semantic: { type: "semantic_vad", eagerness: "auto" }, ptt: null };
  connection.updateSession({ audio: { input: { turn_detection: detection[mode] } } });
  ui.talk.disabled = !(counters.connected && state.mic && mode === "ptt");
  document.body.dataset.mode = mode;
}

function startTalking() {
  if (state.talking || counters.mode !== "ptt" || !state.mic) return;
  bargeIn();
  if (state.activeResponse) connection.send({ type: "response.cancel" });
  connection.send({ type: "input_audio_buffer.clear" });
  Object.assign(state, { talking: true, talkMs: 0 });
  ui.talk.classList.add("active");
}

function stopTalking(commit = true) {
  if (!state.talking) return;
  state.talking = false;
  ui.talk.classList.remove("active");
  if (commit && state.talkMs >= MIN_TALK_MS) connection.send({ type: "input_audio_buffer.commit" });
  else {
    connection.send({ type: "input_audio_buffer.clear" });
    if (commit) notify("Too short: hold the button while you talk.", "info");
  }
}

ui.talk.addEventListener("pointerdown", (e) => { ui.talk.setPointerCapture(e.pointerId); startTalking(); });
for (const type of ["pointerup", "pointercancel"]) ui.talk.addEventListener(type, () => stopTalking());
const typing = (el) => el && (el.tagName === "INPUT" || el.tagName === "TEXTAREA") && el.type !== "radio";
window.addEventListener("keydown", (e) => {
  if (e.code !== "Space" || typing(document.activeElement) || counters.mode !== "ptt") return;
  e.preventDefault();
  if (!e.repeat) startTalking();
});
window.addEventListener("keyup", (e) => {
  if (e.code !== "Space" || counters.mode !== "ptt" || typing(document.activeElement)) return;
  e.preventDefault(); // a focused button would otherwise be clicked by the space bar
  stopTalking();
});

// ------------------------------------------------------------------ settings
let settingsEdited = false;
ui.settings.addEventListener("input", () => { settingsEdited = true; });

function fillSettings(session) {
  if (settingsEdited) return; // keep what the user typed across reconnects
  ui.settings.instructions.value = session.instructions || "";
  ui.settings.voice.value = (session.audio && session.audio.output && session.audio.output.voice) || "default";
  ui.settings.demoTool.checked = (session.tools || []).some((t) => t.name === DEMO_TOOLS[0].name);
}

ui.settings.addEventListener("submit", (e) => {
  e.preventDefault();
  connection.updateSession({
    instructions: ui.settings.instructions.value,
    audio: { output: { voice: ui.settings.voice.value || "default" } },
    tools: ui.settings.demoTool.checked ? DEMO_TOOLS : [],
  });
  notify("Settings applied.", "info");
});
