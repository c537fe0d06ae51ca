import dataclasses

import pytest

from base.config import Config, load_config
from base.errors import ConfigError


def test_default_toml_loads_and_differs_from_nothing():
    cfg = load_config()
    assert cfg.server.port == 8765
    assert cfg.tts.backend == "onnx"


def test_gpu_toml_selects_cuda():
    assert load_config("configs/gpu.toml").tts.backend == "cuda"


def test_unknown_key_names_the_key(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[vad]\nsilence_ms = 3\n")
    with pytest.raises(ConfigError, match=r"vad\.silence_ms"):
        load_config(p, environ={})


def test_removed_keys_name_the_key_and_say_why(tmp_path):
    """A key the engine no longer reads (a form measured slower and removed, or a setting that became a
    constant) is refused with its name and what to do, from a file, the environment and --set alike."""
    from base.config import REMOVED_KEYS

    assert REMOVED_KEYS
    for key, why in REMOVED_KEYS.items():
        section, name = key.split(".")
        p = tmp_path / "c.toml"
        p.write_text(f"[{section}]\n{name} = true\n")
        with pytest.raises(ConfigError, match=rf"{section}\.{name} was removed: .*delete the key") as exc:
            load_config(p, environ={})
        assert why in str(exc.value)
        with pytest.raises(ConfigError, match=rf"{section}\.{name} was removed"):
            load_config(None, environ={f"VOXLOOP_{section.upper()}__{name.upper()}": "1"})
        with pytest.raises(ConfigError, match=rf"{section}\.{name} was removed"):
            load_config(None, [f"{key}=1"], environ={})
        assert name not in {f.name for f in dataclasses.fields(getattr(Config(), section))}


def test_unknown_section(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[vda]\n")
    with pytest.raises(ConfigError, match=r"\[vda\]"):
        load_config(p, environ={})


def test_env_then_cli_precedence(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[llm]\nmax_tokens = 10\n")
    env = {"VOXLOOP_LLM__MAX_TOKENS": "20", "VOXLOOP_SERVER__AUTH_TOKEN": "none"}
    assert load_config(p, environ=env).llm.max_tokens == 20
    assert load_config(p, ["llm.max_tokens=30"], environ=env).llm.max_tokens == 30
    assert load_config(p, environ=env).server.auth_token is None


def test_types_are_checked():
    with pytest.raises(ConfigError, match="expected an integer"):
        load_config(None, ["vad.frame_ms=abc"], environ={})
    with pytest.raises(ConfigError, match="expected true/false"):
        load_config(None, ["models.allow_network=maybe"], environ={})
    cfg = load_config(None, ["server.allowed_origins=http://a,http://b"], environ={})
    assert cfg.server.allowed_origins == ("http://a", "http://b")


def test_bad_cli_override_syntax():
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(None, ["port=1"], environ={})


def test_invalid_toml(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text("[server\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(p, environ={})


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(Exception):
        cfg.server.port = 1  # type: ignore[misc]
    assert cfg.replace("server", port="9000").server.port == 9000


def test_llm_sequences_and_batch_are_checked():
    with pytest.raises(ConfigError, match="max_sequences"):
        load_config(None, ["llm.max_sequences=256"], environ={})
    with pytest.raises(ConfigError, match="batch_tokens"):
        load_config(None, ["llm.max_sequences=64", "llm.batch_tokens=32"], environ={})
    assert load_config(None, ["llm.max_sequences=200", "llm.batch_tokens=512"], environ={}).llm.max_sequences == 200


def test_gpu_and_memory_budgets_must_not_be_negative():
    for key in ("llm.memory_budget_mb", "asr.gpu_budget_mb", "llm.prefill_threads"):
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(None, [f"{key}=-1"], environ={})


@pytest.mark.parametrize("key", ["turn.pause_ms", "turn.max_silence_ms", "turn.pause_max_speech_ms"])
def test_turn_durations_must_be_positive(key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(None, [f"{key}=0"], environ={})
    assert load_config(None, [f"{key}=120"], environ={}).turn  # a positive value loads


def test_asr_pause_is_positive_or_none():
    assert load_config(None, [], environ={}).turn.asr_pause_ms == 60
    assert load_config(None, ["turn.asr_pause_ms=none"], environ={}).turn.asr_pause_ms is None  # at turn.pause_ms
    assert load_config(None, ["turn.asr_pause_ms=400"], environ={}).turn.asr_pause_ms == 400  # pause_ms is used
    with pytest.raises(ConfigError, match=r"turn\.asr_pause_ms must be > 0"):
        load_config(None, ["turn.asr_pause_ms=0"], environ={})


def test_score_early_is_on_unless_turned_off():
    assert load_config(None, [], environ={}).turn.score_early is True
    assert load_config("configs/gpu.toml", [], environ={}).turn.score_early is True
    assert load_config(None, [], environ={"VOXLOOP_TURN__SCORE_EARLY": "false"}).turn.score_early is False
    assert load_config(None, ["turn.score_early=false"], environ={}).turn.score_early is False


def test_gpu_tts_start_up_settings_are_checked():
    with pytest.raises(ConfigError, match=r"tts\.batch_buckets"):
        load_config(None, ["tts.batch_buckets=some"], environ={})
    assert load_config(None, ["tts.batch_buckets=coarse"], environ={}).tts.batch_buckets == "coarse"
    with pytest.raises(ConfigError, match=r"tts\.encode_batch_buckets must be 'coarse', 'fine' or 'finer'"):
        load_config(None, ["tts.encode_batch_buckets=all"], environ={})
    assert load_config(None, ["tts.batch_buckets=finer"], environ={}).tts.batch_buckets == "finer"
    assert load_config(None, [], environ={}).tts.encode_batch_buckets == "coarse"
    assert load_config(None, ["tts.encode_batch_buckets=fine"], environ={}).tts.encode_batch_buckets == "fine"
    with pytest.raises(ConfigError, match=r"tts\.text_encoder_products must be one of"):
        load_config(None, ["tts.text_encoder_products=fp16"], environ={})
    cfg = load_config(None, ["tts.triton_kernels=true", "tts.text_encoder_products=tf32x3"], environ={})
    assert (cfg.tts.triton_kernels, cfg.tts.text_encoder_products) == (True, "tf32x3")
    assert not load_config(None, [], environ={}).tts.triton_kernels
    with pytest.raises(ConfigError, match=r"tts\.compile_encoder .*tts\.triton_kernels"):
        load_config(None, ["tts.triton_kernels=true", "tts.compile_encoder=true"], environ={})
    for bad in ("fp8", "int4"):
        with pytest.raises(ConfigError, match=r"tts\.precision must be one of fp32, bf16, fp16, int8"):
            load_config(None, [f"tts.precision={bad}"], environ={})
    for bad in ("0", "5"):
        with pytest.raises(ConfigError, match=r"tts\.fast_lanes must be 1\.\.4"):
            load_config(None, [f"tts.fast_lanes={bad}"], environ={})
    for bad in ("", "64,32", "0,32", "32,32", "1024,8192"):
        with pytest.raises(ConfigError, match=r"tts\.phoneme_buckets"):
            load_config(None, [f"tts.phoneme_buckets={bad}"], environ={})
    assert load_config(None, ["tts.phoneme_buckets=32,48,64"], environ={}).tts.phoneme_buckets == (32, 48, 64)


def test_gpu_toml_lists_what_an_operator_may_change():
    """``[tts]`` of configs/gpu.toml: at most 20 keys; the engine's forms with one measured best value are
    constants (``runner.SHIPPED``), the Triton kernels one switch."""
    import tomllib

    keys = tomllib.loads(open("configs/gpu.toml", encoding="utf-8").read())["tts"]
    assert len(keys) <= 20, sorted(keys)
    assert keys["triton_kernels"] is True


def test_decoding_ahead_settings_are_checked():
    for bad in (["tts.speculate_frames=-1"], ["tts.speculate_below=0"]):
        with pytest.raises(ConfigError, match=r"tts\.speculate_frames must be >= 0"):
            load_config(None, bad, environ={})
    cfg = load_config(None, ["tts.speculate_frames=512", "tts.speculate_below=3"], environ={})
    assert (cfg.tts.speculate_frames, cfg.tts.speculate_below) == (512, 3)


def test_output_rate_is_the_gpu_engines_and_the_default_rate_of_its_front_ends():
    """``tts.output_rate``: refused without the cuda backend or out of range; with it, a front end
    takes the engine's chunks at that rate and uses it for requests that name no rate."""
    from pipeline.engine_link import SpeechText
    from tts_engine.engine import SynthesisOptions

    with pytest.raises(ConfigError, match="tts.output_rate"):
        load_config(None, ["tts.output_rate=24000"], environ={})  # default backend: onnx
    with pytest.raises(ConfigError, match="tts.output_rate"):
        load_config(None, ["tts.backend=cuda", "tts.output_rate=4000"], environ={})
    assert load_config("configs/gpu.toml", [], environ={}).tts.output_rate == 24000
    text = SpeechText(load_config(None, ["tts.backend=cuda", "tts.output_rate=24000"], environ={}))
    assert text.voice.sample_rate == 22050 and text.sample_rate == 24000
    assert text.output_rate(SynthesisOptions()) == 24000 and text.output_rate(SynthesisOptions(sample_rate=16000)) == 16000
    native = SpeechText(load_config(None, ["tts.backend=cuda"], environ={}))
    assert native.sample_rate == 22050 and native.output_rate(SynthesisOptions()) == 22050


def test_outbox_limits_are_checked():
    """The outbox keeps up to 8 closing events of a reply beside waiting audio, and a stall needs a time."""
    assert load_config(None, [], environ={}).limits.send_stall_s == 30.0
    with pytest.raises(ConfigError, match="send_queue_messages must be at least 32, got 8"):
        load_config(None, ["limits.send_queue_messages=8"], environ={})
    with pytest.raises(ConfigError, match="send_stall_s must be positive"):
        load_config(None, ["limits.send_stall_s=0"], environ={})
