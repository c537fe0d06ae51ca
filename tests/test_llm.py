"""ChatModel on the bundled SmolLM2-135M-Instruct GGUF."""

from __future__ import annotations

import threading
import time

import pytest
from conftest import scaled

from llm.chat import PREFILL_CHUNK, ChatModel
from voxloop.errors import InvalidInput, ModelError

STORY = "Tell me a very long story about a dragon, a knight and a village by the sea."


def chat(system: str, *turns: str) -> list[dict]:
    """Messages: a system prompt, then alternating user / assistant turns."""
    roles = ["user", "assistant"]
    return [{"role": "system", "content": system}] + [
        {"role": roles[i % 2], "content": t} for i, t in enumerate(turns)]


def long_history(system: str, pairs: int) -> list[dict]:
    turns = []
    for i in range(pairs):
        turns += [f"Tell me fact number {i} about the ocean and the animals that live in it.",
                  "The ocean covers about seventy one percent of the planet. It is home to "
                  f"whales, dolphins, sharks and octopuses; fact {i} is that plankton makes "
                  "much of the oxygen we breathe."]
    return chat(system, *turns)


@pytest.fixture(scope="module")
def model(cfg):
    m = ChatModel.from_config(cfg)
    m.warmup()
    return m


@pytest.fixture
def greedy(model):
    """The shared model sampling greedily (deterministic replies)."""
    old = model.temperature
    model.temperature = 0.0
    yield model
    model.temperature = old


def drain(it, cancel: threading.Event | None = None, after: int | None = None):
    """Consume a stream; set ``cancel`` after ``after`` deltas. Returns (deltas, s from set)."""
    deltas, set_at = [], None
    for piece in it:
        deltas.append(piece)
        if after is not None and len(deltas) == after:
            set_at = time.perf_counter()
            cancel.set()
    return deltas, (time.perf_counter() - set_at) if set_at else None


@pytest.mark.slow
def test_capital_of_france_streams_in_several_deltas(greedy, cfg):
    deltas, _ = drain(greedy.stream(chat(cfg.llm.system_prompt, "What is the capital of France?")))
    reply = "".join(deltas)
    assert len(deltas) >= 3 and all(deltas)
    assert "paris" in reply.lower(), reply  # needs the GGUF chat template applied right
    stats = greedy.last_stats
    assert stats.finish_reason == "stop" and stats.completion_tokens >= len(deltas)
    assert 0 < stats.first_token_s <= stats.total_s


@pytest.mark.slow
def test_same_seed_same_reply(model, cfg):
    messages = chat(cfg.llm.system_prompt, "Name three animals that live in the sea.")
    first = "".join(model.stream(messages, max_tokens=30))
    second = "".join(model.stream(messages, max_tokens=30))
    assert first and first == second


@pytest.mark.slow
def test_max_tokens_caps_the_reply(model, cfg):
    deltas, _ = drain(model.stream(chat(cfg.llm.system_prompt, STORY), max_tokens=5))
    assert model.last_stats.completion_tokens == 5
    assert model.last_stats.finish_reason == "length"
    assert "".join(deltas)


@pytest.mark.slow
def test_cancel_between_deltas_stops_at_once(model, cfg):
    cancel = threading.Event()
    deltas, stop_s = drain(model.stream(chat(cfg.llm.system_prompt, STORY), cancel, 300),
                           cancel, after=5)
    assert len(deltas) == 5  # stopped at once: no delta after the cancel
    assert model.last_stats.finish_reason == "cancelled"
    assert model.last_stats.completion_tokens <= 6


@pytest.mark.slow
def test_cancel_from_another_thread_while_decoding(model, cfg):
    cancel = threading.Event()
    it = model.stream(chat(cfg.llm.system_prompt, STORY), cancel, max_tokens=300)
    first = next(it)  # decoding has started
    rest: list[str] = []
    at_cancel = []  # deltas received when the cancel was set
    threading.Timer(0.2, lambda: (at_cancel.append(len(rest)), cancel.set())).start()
    for piece in it:
        rest.append(piece)
    assert model.last_stats.finish_reason == "cancelled"
    # Stopped within a token of the cancel (one may be in flight), not at max_tokens.
    assert len(rest) <= at_cancel[0] + 1, (len(rest), at_cancel)
    assert model.last_stats.completion_tokens < 300 and first and rest


@pytest.mark.slow
def test_cancel_during_prompt_evaluation(model, cfg):
    messages = long_history("You are a marine biologist.", 8)  # not cached: ~600 tokens
    cancel = threading.Event()
    set_at = []
    threading.Timer(0.1, lambda: (set_at.append(time.perf_counter()), cancel.set())).start()
    deltas = list(model.stream(messages, cancel))
    stop_s = time.perf_counter() - set_at[0]
    assert deltas == [] and model.last_stats.finish_reason == "cancelled"
    # What was evaluated before the cancel is reused by the next call.
    assert "".join(model.stream(messages, max_tokens=3))
    rest = model.last_stats
    assert rest.cached_tokens > 0
    # Stopping took about one prompt chunk, not the rest of the prompt (timed under the
    # same CPU load by the second call).
    chunk_s = rest.first_token_s / (rest.prompt_tokens - rest.cached_tokens) * PREFILL_CHUNK
    assert stop_s < scaled(0.05) + 2 * chunk_s, (stop_s, chunk_s)
    assert stop_s < rest.first_token_s / 3, (stop_s, rest)


@pytest.mark.slow
def test_second_turn_reuses_the_cached_history(greedy):
    turn1 = long_history("You are a helpful assistant who knows the sea.", 8)
    turn1.append({"role": "user", "content": "What is the largest animal in the ocean?"})
    reply = "".join(greedy.stream(turn1, max_tokens=40))
    first = greedy.last_stats
    turn2 = turn1 + [{"role": "assistant", "content": reply},
                     {"role": "user", "content": "And the fastest?"}]
    assert "".join(greedy.stream(turn2, max_tokens=40))
    second = greedy.last_stats
    assert first.prompt_tokens > 500 and first.cached_tokens < 50
    assert second.cached_tokens >= first.prompt_tokens
    assert second.first_token_s < first.first_token_s / 3, (first, second)


@pytest.mark.slow
def test_history_over_the_context_drops_the_oldest_messages(cfg):
    from voxloop.models import resolve_llm

    small = ChatModel(resolve_llm(cfg).path, n_ctx=512, seed=1, max_tokens=32)
    messages = long_history("You are brief.", 12)
    messages.append({"role": "user", "content": "Which fact was the most surprising?"})
    assert small.count_tokens(messages) > 512
    assert "".join(small.stream(messages))
    cut = small.last_stats.dropped_messages
    assert cut > 0 and small.last_stats.prompt_tokens <= 512 - 32
    assert messages[0]["role"] == "system" and len(messages) == 26  # input untouched
    # The next turn keeps the same cut, so the prompt prefix stays in the cache.
    messages += [{"role": "assistant", "content": "The plankton one."},
                 {"role": "user", "content": "Why?"}]
    assert "".join(small.stream(messages))
    assert small.last_stats.dropped_messages == cut
    assert small.last_stats.cached_tokens > small.last_stats.prompt_tokens // 2


@pytest.mark.slow
def test_one_stream_at_a_time(model, cfg):
    first = model.stream(chat(cfg.llm.system_prompt, STORY), max_tokens=20)
    next(first)
    with pytest.raises(RuntimeError):
        next(model.stream(chat(cfg.llm.system_prompt, "Hi")))
    first.close()
    assert "".join(model.stream(chat(cfg.llm.system_prompt, "Hi"), max_tokens=5))


@pytest.mark.slow
@pytest.mark.parametrize("messages", [
    [], [{"role": "robot", "content": "hi"}], [{"role": "user"}], ["hello"]])
def test_bad_messages(model, messages):
    with pytest.raises(InvalidInput):
        next(model.stream(messages))


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelError):
        ChatModel(tmp_path / "nope.gguf")
