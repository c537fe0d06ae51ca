"""End-of-turn score at the VAD's early pause against the score at the judge pause: would scoring
sooner change what ``semantic_vad`` decides?

With ``turn.asr_pause_ms`` (60) shorter than ``turn.pause_ms`` (120 on configs/gpu.toml, 150 by
default) the speculative turn starts at the early pause and the end-of-turn model scores the audio
once the silence reaches ``pause_ms``. Scored sooner, the model hears less silence after the last
word: ``VoiceActivityDetector.pause_audio()`` ends 60 ms after the last voiced frame at the early
pause, 120 / 150 ms after it at the judge pause.

For each clip of ``bench/turn_set.py`` (the bundled voice: complete, incomplete, paused, filler), fed
in 20 ms chunks (as a client streams) to the VAD configured as the server configures it for
``semantic_vad``, every pause the VAD reports is scored with the real model (smart-turn v3.2) on what
``pause_audio()`` returns at the early pause and when the stream time reaches each judge pause
(``TurnTaking.tick``'s test). Per ``EAGERNESS`` and judge pause: pauses compared (the silence reached
the judge pause), decisions that change (score >= ``complete`` or not), the score difference
(|early - judge|: p50, max); where both are under ``complete``, the silence the early score would wait
(``Policy.wait_ms``) minus the judged one's; pauses where speech resumed in between (an early score
would be wasted).

``rule_*``: the rule ``turn.score_early`` follows (pipeline/turn_taking.py): the early score is used
only if it is ``>= complete`` (a commit at the judge pause), any other is dropped and the score asked
again at the judge pause (its result decides, as without ``score_early``). Against scoring at the
judge pause only, the decision changes just where the early score alone is complete
(``rule_decisions_changed``, listed in ``rule_changed`` with ``true_end``: the pause is the end of a
complete, paused or filler clip, where a commit is right); ``rule_commit_early``: pauses whose
commit does not wait for the score's run; ``rule_score_again``: pauses that cost a second score. The
words' check (``words_cap``) is not applied here (no transcripts).

Writes ``OUT/turn_score_early-<hardware>-<date>.json``.

    python -m bench.turn_score_early --early-ms 60 --judge-ms 120 150
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import numpy as np

from bench.harness import add_output_arguments, hardware_tag, pct, result_path, write_json

RATE = 16000
CHUNK_MS = 20  # what a client sends per input_audio_buffer.append (bench/turn_taking.py's microphone)
LEAD_MS = 500  # silence before each clip (past the VAD's warm-up)
TAIL_MS = 1000  # silence after each clip (past every judge pause)


def frames_ms(ms: int, frame_ms: int) -> int:
    """``ms`` rounded up to whole VAD frames (pipeline/voice_input.py's ``configure``)."""
    return -(-ms // frame_ms) * frame_ms


def vad_config(cfg, early_ms: int, eagerness: str = "auto"):
    """The VAD as ``VoiceInput.configure`` sets it for ``semantic_vad`` (session defaults: prefix
    300 ms, aggressiveness 2; its silence stop is the policy's longest wait)."""
    from pipeline.turn_taking import Policy
    from realtime.session_schema import TurnDetection

    td = TurnDetection(type="semantic_vad")
    policy = Policy.semantic_vad(eagerness, td.silence_duration_ms, cfg.vad.barge_in_min_ms, cfg.turn.max_silence_ms,
                                 cfg.turn.pause_on_speech, cfg.turn.pause_max_speech_ms)
    return dataclasses.replace(cfg.vad, silence_duration_ms=policy.vad_silence_ms,
                               speculative_pause_ms=frames_ms(early_ms, cfg.vad.frame_ms),
                               prefix_padding_ms=td.prefix_padding_ms, aggressiveness=td.x_aggressiveness)


def pauses(vad_cfg, pcm: np.ndarray, judge_ms: list[int]) -> list[dict]:
    """Every pause of ``pcm`` (with silence around it): its audio at the early pause and at each judge
    pause that the silence reached (``{t_ms, early, judged: {ms: audio}, resumed_ms}``)."""
    from asr.vad import Pause, Resume, VoiceActivityDetector

    vad = VoiceActivityDetector(vad_cfg, RATE)
    stream = np.concatenate((np.zeros(RATE * LEAD_MS // 1000, np.int16), pcm, np.zeros(RATE * TAIL_MS // 1000, np.int16)))
    chunk = RATE * CHUNK_MS // 1000
    found: list[dict] = []
    current: dict | None = None
    for start in range(0, len(stream), chunk):
        for event in vad.feed(stream[start:start + chunk]):
            if isinstance(event, Pause):
                # What VoiceInput._judged_audio() scores when Score comes with the StartTurn.
                current = {"t_ms": event.t_ms - LEAD_MS, "early": vad.pause_audio(), "judged": {}, "resumed_ms": None}
                found.append(current)
                current["_at"] = event.t_ms
            elif isinstance(event, Resume) and current is not None:
                current["resumed_ms"] = event.t_ms - current["_at"]
                current = None
        if current is not None:
            for ms in judge_ms:  # TurnTaking.tick: stream time >= speech end + score_pause_ms
                if ms not in current["judged"] and vad.stream_ms >= current["_at"] + ms:
                    current["judged"][ms] = vad.pause_audio()
    for p in found:
        p.pop("_at")
    return found


def summarize(rows: list[dict], judge_ms: list[int], max_silence_ms: int = 2000) -> list[dict]:
    """Per eagerness and judge pause: decisions changed, score differences, and (both scores under
    ``complete``) how much longer the early score would wait for silence (``Policy.wait_ms``)."""
    from pipeline.turn_taking import EAGERNESS, Policy
    from realtime.session_schema import TurnDetection

    out = []
    for eagerness in ("auto", "high", "low"):  # medium has auto's thresholds
        t = EAGERNESS[eagerness]
        policy = Policy.semantic_vad(eagerness, TurnDetection().silence_duration_ms, 250, max_silence_ms, True, 1000)
        for ms in judge_ms:
            both = [r for r in rows if r.get(f"score_{ms}") is not None]
            changed = [r for r in both if (r["score_early"] >= t.complete) != (r[f"score_{ms}"] >= t.complete)]
            rule_changed = [r for r in both if r["score_early"] >= t.complete > r[f"score_{ms}"]]
            diffs = [abs(r["score_early"] - r[f"score_{ms}"]) for r in both]
            signed = [r["score_early"] - r[f"score_{ms}"] for r in both]
            # Both under complete: the silence waited (Policy.wait_ms; the words' cap aside) early - judged.
            waits = [policy.wait_ms(r["score_early"]) - policy.wait_ms(r[f"score_{ms}"]) for r in both
                     if max(r["score_early"], r[f"score_{ms}"]) < t.complete]
            out.append({
                "eagerness": eagerness, "complete": t.complete, "judge_ms": ms, "pauses": len(both),
                "decisions_changed": len(changed),
                "complete_early_only": sum(r["score_early"] >= t.complete for r in changed),
                "complete_judged_only": sum(r[f"score_{ms}"] >= t.complete for r in changed),
                "complete_early": sum(r["score_early"] >= t.complete for r in both),
                "complete_judged": sum(r[f"score_{ms}"] >= t.complete for r in both),
                "waits_compared": len(waits),
                "wait_early_minus_judged_p50_ms": pct(waits, 50), "wait_early_minus_judged_max_ms": pct(waits, 100),
                "wait_early_minus_judged_min_ms": pct(waits, 0),
                "score_diff_p50": _round(np.percentile(diffs, 50)) if diffs else None,
                "score_diff_p90": _round(np.percentile(diffs, 90)) if diffs else None,
                "score_diff_max": _round(max(diffs)) if diffs else None,
                "score_early_minus_judged_mean": _round(np.mean(signed)) if signed else None,
                "changed": [{"clip": r["clip"], "pause": r["pause"], "early": r["score_early"], "judged": r[f"score_{ms}"]}
                            for r in changed],
                "resumed_before_judge": sum(r["resumed_ms"] is not None and r[f"score_{ms}"] is None for r in rows),
                # turn.score_early's rule: an early score >= complete commits, any other is asked again.
                "rule_decisions_changed": len(rule_changed),
                "rule_commit_early": sum(r["score_early"] >= t.complete for r in both),
                "rule_score_again": sum(r["score_early"] < t.complete for r in both),
                "rule_changed": [{"clip": r["clip"], "pause": r["pause"], "early": r["score_early"],
                                  "judged": r[f"score_{ms}"], "true_end": true_end(r)} for r in rule_changed],
            })
    return out


def true_end(row: dict) -> bool:
    """The pause is where the speaker is done: the last words of a complete, paused or filler clip."""
    return (row["kind"] in ("complete", "paused", "filler") and row["resumed_ms"] is None
            and row["t_ms"] >= row["speech_end_ms"])


def _round(x: float) -> float:
    return round(float(x), 4)


def main(argv: list[str] | None = None) -> int:
    from asr.end_of_turn import EndOfTurnModel
    from bench.turn_set import TurnSet
    from base.config import load_config

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--early-ms", type=int, default=60, help="turn.asr_pause_ms (default: %(default)s)")
    p.add_argument("--judge-ms", type=int, nargs="+", default=[120, 150], help="turn.pause_ms values (default: 120 150)")
    p.add_argument("--coughs", type=int, default=0, help="cough-like bursts added to the set")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--hardware", default=hardware_tag(), help="hardware name in the file name (default: %(default)s)")
    p.add_argument("--date", help="date in the file name (default: today)")
    add_output_arguments(p)
    args = p.parse_args(argv)
    cfg = load_config(overrides=args.overrides)
    judge_ms = [frames_ms(ms, cfg.vad.frame_ms) for ms in args.judge_ms]
    vad_cfg = vad_config(cfg, args.early_ms)
    clips = TurnSet.from_config(cfg).build(coughs=args.coughs)
    model = EndOfTurnModel.from_config(cfg)
    model.warmup()
    rows, cost = [], []
    for clip in clips:
        for i, found in enumerate(pauses(vad_cfg, clip.pcm, judge_ms)):
            t0 = time.perf_counter()
            early = model.score(found["early"])
            cost.append(1000 * (time.perf_counter() - t0))
            row = {"clip": clip.name, "kind": clip.kind, "pause": i, "t_ms": found["t_ms"],
                   # the last pause of a clip is at its true end (silence follows): a complete turn there
                   "speech_end_ms": round(clip.speech_end_ms), "resumed_ms": found["resumed_ms"],
                   "early_audio_ms": round(1000 * len(found["early"]) / RATE), "score_early": _round(early)}
            for ms in judge_ms:
                audio = found["judged"].get(ms)
                row[f"score_{ms}"] = None if audio is None else _round(model.score(audio))
                row[f"audio_{ms}_ms"] = None if audio is None else round(1000 * len(audio) / RATE)
            rows.append(row)
            print(row, flush=True)
    summary = summarize(rows, judge_ms, cfg.turn.max_silence_ms)
    for s in summary:
        print({k: v for k, v in s.items() if k not in ("changed", "rule_changed")}, flush=True)
    path = write_json("turn_score_early", summary, {
        "early_ms": frames_ms(args.early_ms, cfg.vad.frame_ms), "judge_ms": judge_ms,
        "vad": dataclasses.asdict(vad_cfg), "chunk_ms": CHUNK_MS, "clips": len(clips),
        "score_call_p50_ms": pct(cost, 50), "turn_threads": cfg.turn.threads, "pauses": rows,
    }, path=result_path("turn_score_early", "json", args.out, args.hardware, args.date))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
