import numpy as np

from pipeline.audio_in import ASR_RATE, InputAudio


def test_push_to_talk_buffer_keeps_every_sample_after_resampling():
    buf = InputAudio(max_s=5)
    t = np.arange(24000) / 24000
    tone = (np.sin(2 * np.pi * 440 * t) * 8000).astype(np.int16)
    for i in range(0, len(tone), 480):  # 20 ms pieces at 24 kHz
        assert buf.buffer(buf.to_asr_rate(tone[i:i + 480], 24000)) is None
    audio = buf.take()  # flushes the resampler's held-back tail
    assert abs(len(audio) - ASR_RATE) <= 2
    assert len(buf.take()) == 0


def test_overflow_is_reported_once_and_capped():
    buf = InputAudio(max_s=1)
    errors = [buf.buffer(np.ones(6000, np.int16)) for _ in range(5)]
    assert [e is not None for e in errors] == [False, False, True, False, False]
    assert errors[2].code == "input_audio_buffer_full"
    assert len(buf.take()) == ASR_RATE
    assert buf.buffer(np.ones(10, np.int16)) is None  # cleared: reported again next time
