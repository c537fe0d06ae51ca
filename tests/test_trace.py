import json

import pytest

from pipeline.trace import Metrics, TraceSink, TurnTrace
from voxloop.cli import main
from base.errors import InvalidInput


def test_trace_relative_times_and_summary(tmp_path):
    path = tmp_path / "t.jsonl"
    sink = TraceSink(Metrics(), str(path))
    for i in range(10):
        t = TurnTrace(i, "s", "server_vad")
        base = 100.0
        t.mark("speech_end", base - 0.5)
        t.mark("asr_start", base - 0.3)
        t.mark("vad_end", base)
        t.mark("vad_end", base + 5)  # the first mark wins
        t.mark("first_audio_sent", base + 0.2 + i / 100)
        sink.record(t, "completed")
    sink.record(TurnTrace(99, "s", "text"), "cancelled")
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["stages_ms"] == {"speech_end": -500.0, "vad_end": 0.0, "asr_start": -300.0, "first_audio_sent": 200.0}
    assert lines[0]["voice_to_voice_ms"] == 700.0 and lines[0]["processing_ms"] == 200.0
    with pytest.raises(ValueError):
        TurnTrace(1, "s", "x").mark("nonsense")


def test_trace_summarize_command(tmp_path, capsys):
    path = tmp_path / "t.jsonl"
    rows = [{"status": "completed", "stages_ms": {"vad_end": 0, "first_audio_sent": float(v)},
             "processing_ms": float(v), "voice_to_voice_ms": float(v) + 500} for v in range(100, 200)]
    rows.append({"status": "cancelled", "stages_ms": {"vad_end": 0, "first_audio_sent": 9999.0}})
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert main(["trace", "summarize", str(path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("first_audio_sent"))
    p50, p90, p99, n = line.split()[1:]
    assert float(p50) == 149.5 and float(p99) == pytest.approx(198.0, abs=0.1) and n == "100"
    assert (tmp_path / "t.png").stat().st_size > 1000


def test_trace_summarize_bad_file(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{nope\n")
    assert main(["trace", "summarize", str(bad)]) == 2
    with pytest.raises(InvalidInput):
        from voxloop.commands.trace import load_turns

        load_turns(tmp_path / "missing.jsonl")
