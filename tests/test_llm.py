"""BatchedChat (continuous batching on one llama.cpp context) on the bundled SmolLM2-135M-Instruct GGUF."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import time

import pytest
from conftest import scaled

from llm.batched import BatchedChat, ChatOptions, ReplyOptions
from base.errors import InvalidInput, ModelError

STORY = "Tell me a very long story about a dragon, a knight and a village by the sea."
QUESTIONS = [
    "What is the capital of France?", "Name three animals that live in the sea.", "Why is the sky blue?",
    "Tell me a joke.", "How do airplanes fly?", "What is two plus two?", "Who wrote Hamlet?",
    "What colour is grass?",
]
GREEDY = ReplyOptions(temperature=0.0, max_tokens=48)


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
def engine(cfg):
    e = BatchedChat.from_config(cfg)
    yield e
    e.close()


@pytest.fixture
def clean(cfg):
    """A new engine: nothing cached but the system prompt.

    Batched replies equal unbatched ones bit for bit while the KV cells of a conversation lie
    the same way in both runs: llama.cpp's CPU flash attention walks the cache in blocks of
    cells, so a conversation whose cells are spread differently (after other conversations
    were evicted or released) sums its attention in another order and a greedy reply can
    take another word after a few dozen tokens.
    """
    e = BatchedChat.from_config(cfg)
    yield e
    e.close()


_keys = iter(range(10**9))


def fresh(prefix: str = "s") -> str:
    """A conversation key never used before (no cached history)."""
    return f"{prefix}{next(_keys)}"


def alone(engine, cfg, questions) -> list[str]:
    """Each question answered with no other conversation running (the unbatched reference)."""
    return [engine.generate(fresh("ref"), chat(cfg.llm.system_prompt, q), GREEDY)[0] for q in questions]


@pytest.mark.slow
def test_capital_of_france_streams_in_several_deltas(engine, cfg):
    deltas = list(engine.stream(fresh(), chat(cfg.llm.system_prompt, "What is the capital of France?"),
                                ReplyOptions(temperature=0.0)))
    reply = "".join(deltas)
    assert len(deltas) >= 3 and all(deltas)
    assert "paris" in reply.lower(), reply  # needs the GGUF chat template applied right
    stats = engine.last_stats
    assert stats.finish_reason == "stop" and stats.completion_tokens >= len(deltas)
    assert 0 < stats.first_token_s <= stats.total_s


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 8])
def test_batched_replies_equal_unbatched_at_temperature_0(clean, cfg, n):
    engine = clean
    questions = QUESTIONS[:n]
    reference = alone(engine, cfg, questions)
    # Half start together; the rest join the running batch a few steps later.
    first = [engine.submit(fresh("b"), chat(cfg.llm.system_prompt, q), GREEDY) for q in questions[: n // 2]]
    texts = {r.id: [] for r in first}
    for _ in range(3):
        for e in engine.step():
            texts[e.reply.id].append(e.text)
    rest = [engine.submit(fresh("b"), chat(cfg.llm.system_prompt, q), GREEDY) for q in questions[n // 2:]]
    texts.update({r.id: [] for r in rest})
    sizes = []
    replies = first + rest
    while not all(r.done for r in replies):
        started = time.perf_counter()
        for e in engine.step():
            texts[e.reply.id].append(e.text)
        sizes.append(engine.last_batch[1])
        assert 0 < engine.last_decode_s <= time.perf_counter() - started  # llama_decode's share of the step
    assert ["".join(texts[r.id]) for r in replies] == reference
    assert max(sizes) == n  # every conversation advanced in the same llama_decode
    assert all(r.stats.finish_reason in ("stop", "length") for r in replies)


@pytest.mark.slow
def test_prompt_steps_on_spare_cores_take_prefill_threads_and_give_the_same_reply(cfg):
    """``step(spare_cores=True)`` runs prompt steps on ``llm.prefill_threads`` (not the one-token
    steps after them), and a greedy reply is the same as with the LLM's own threads."""
    q = chat(cfg.llm.system_prompt, "Name three animals that live in the sea.")
    texts, wide = [], []
    for spare in (False, True):
        e = BatchedChat.from_config(cfg.replace("llm", n_threads=1, prefill_threads=2))
        try:
            reply = e.submit("a", q, GREEDY)
            parts = []
            while not reply.done:
                parts += [ev.text for ev in e.step(spare_cores=spare)]
            texts.append("".join(parts))
            wide.append(e.report()["wide_steps"])
            assert reply.stats.completion_tokens > 2
        finally:
            e.close()
    assert texts[0] == texts[1]
    assert wide == [0, 1]  # the prompt fits one step (batch_tokens); the decode steps stay on one thread


@pytest.mark.slow
def test_a_prefilled_history_leaves_the_next_turn_only_its_new_message(engine, cfg):
    history = long_history(cfg.llm.system_prompt, 4)
    session = fresh("p")
    reply = engine.prefill(session, history)
    while not reply.done:
        engine.step()
    assert reply.stats.finish_reason == "prefilled" and reply.stats.completion_tokens == 0
    assert reply.stats.first_token_s is None
    read_before = engine.prompt_evaluated
    text, stats = engine.generate(session, history + [{"role": "user", "content": "And the moon?"}], GREEDY)
    assert text
    # The new user message and the chat template around it: what the turn after a cut reads.
    assert 0 < engine.prompt_evaluated - read_before == stats.prompt_tokens - stats.cached_tokens <= 20
    assert stats.cached_tokens >= reply.stats.prompt_tokens - 5  # all but the assistant's generation prompt


@pytest.mark.slow
def test_a_prefill_waits_while_another_conversation_generates(clean, cfg):
    other = clean.submit("g", chat(cfg.llm.system_prompt, QUESTIONS[0]), GREEDY)
    prefill = clean.prefill("p", long_history(cfg.llm.system_prompt, 2))
    while not other.done:
        clean.step()
        assert clean.cached_tokens("p") == len(clean._prefix)  # the system prompt is shared, not read
    while not prefill.done:
        clean.step()
    assert prefill.stats.finish_reason == "prefilled" and clean.cached_tokens("p") == prefill.stats.prompt_tokens


@pytest.mark.slow
def test_the_next_turn_cancels_a_prefill_and_keeps_what_it_read(clean, cfg):
    history = long_history(cfg.llm.system_prompt, 6)
    reply = clean.prefill("c", history)
    clean.step()
    clean.step()  # two prompt chunks read
    text, stats = clean.generate("c", history + [{"role": "user", "content": "And the moon?"}], GREEDY)
    assert reply.stats.finish_reason == "cancelled" and text
    assert stats.cached_tokens >= len(clean._prefix) + 2 * cfg.llm.batch_tokens


@pytest.mark.slow
def test_cancelling_one_reply_leaves_the_others_intact(clean, cfg):
    engine = clean
    questions = QUESTIONS[:4]
    reference = alone(engine, cfg, questions)
    story = engine.submit(fresh(), chat(cfg.llm.system_prompt, STORY), ReplyOptions(temperature=0.0, max_tokens=300))
    replies = [engine.submit(fresh("c"), chat(cfg.llm.system_prompt, q), GREEDY) for q in questions]
    texts = {r.id: [] for r in replies + [story]}
    for _ in range(8):
        for e in engine.step():
            texts[e.reply.id].append(e.text)
    assert not story.done
    engine.cancel(story)
    running = sum(not r.done for r in replies)
    events = engine.step()
    for e in events:
        texts[e.reply.id].append(e.text)
    assert story.done and story.stats.finish_reason == "cancelled"
    assert engine.last_batch[1] == running  # its sequence left the batch at once
    while not all(r.done for r in replies):
        for e in engine.step():
            texts[e.reply.id].append(e.text)
    assert ["".join(texts[r.id]) for r in replies] == reference
    assert 0 < story.stats.completion_tokens < 300 and "".join(texts[story.id])


@pytest.mark.slow
def test_a_new_conversation_starts_from_the_cached_system_prompt(engine, cfg):
    before = engine.prompt_evaluated
    engine.generate(fresh(), chat(cfg.llm.system_prompt, "Hello there!"), ReplyOptions(max_tokens=2))
    stats = engine.last_stats
    prefix = len(engine.prompt.system_prefix(cfg.llm.system_prompt))
    assert prefix > 10 and stats.cached_tokens == prefix
    assert engine.prompt_evaluated - before == stats.prompt_tokens - prefix


@pytest.mark.slow
def test_second_turn_evaluates_only_the_new_tokens_and_sessions_do_not_evict_each_other(engine):
    turn1 = long_history("You are a helpful assistant who knows the sea.", 8)
    turn1.append({"role": "user", "content": "What is the largest animal in the ocean?"})
    other = long_history("You are a poet.", 6) + [{"role": "user", "content": "Write about rain."}]
    a, b = fresh("a"), fresh("b")
    reply, first = engine.generate(a, turn1, GREEDY)
    engine.generate(b, other, GREEDY)  # another conversation in between
    turn2 = turn1 + [{"role": "assistant", "content": reply}, {"role": "user", "content": "And the fastest?"}]
    before = engine.prompt_evaluated
    assert engine.generate(a, turn2, GREEDY)[0]
    second = engine.last_stats
    assert first.prompt_tokens > 500 and first.cached_tokens < 50
    assert second.cached_tokens >= first.prompt_tokens  # the history and the reply stayed cached
    new = second.prompt_tokens - second.cached_tokens
    assert engine.prompt_evaluated - before == new and new < 40


@pytest.mark.slow
def test_max_tokens_caps_the_reply(engine, cfg):
    text, stats = engine.generate(fresh(), chat(cfg.llm.system_prompt, STORY), ReplyOptions(max_tokens=5))
    assert stats.completion_tokens == 5 and stats.finish_reason == "length" and text


@pytest.mark.slow
def test_cancel_from_another_thread_while_decoding(engine, cfg):
    cancel = threading.Event()
    it = engine.stream(fresh(), chat(cfg.llm.system_prompt, STORY), ReplyOptions(max_tokens=300, cancel=cancel))
    first = next(it)  # decoding has started
    rest: list[str] = []
    at_cancel = []  # deltas received when the cancel was set
    threading.Timer(0.2, lambda: (at_cancel.append(len(rest)), cancel.set())).start()
    for piece in it:
        rest.append(piece)
    assert engine.last_stats.finish_reason == "cancelled"
    # Stopped within a token of the cancel (one may be in flight), not at max_tokens.
    assert len(rest) <= at_cancel[0] + 1, (len(rest), at_cancel)
    assert engine.last_stats.completion_tokens < 300 and first and rest


@pytest.mark.slow
def test_more_conversations_than_sequences(cfg):
    """3 conversations on 2 sequences: the third waits for a free one, then takes the idlest."""
    from base.models import resolve_llm

    small = BatchedChat(resolve_llm(cfg).path, ChatOptions(max_sequences=2, batch_tokens=16, n_ctx=512,
                                                           system_prompt=cfg.llm.system_prompt))
    try:
        for i, q in enumerate(QUESTIONS[:2]):  # two idle conversations hold the sequences
            small.generate(f"r{i}", chat(cfg.llm.system_prompt, q), GREEDY)
        replies = [small.submit(f"x{i}", chat(cfg.llm.system_prompt, q), GREEDY) for i, q in enumerate(QUESTIONS[:3])]
        small.step()
        assert small.last_batch[1] == 2 and replies[2]._slot is None  # the third waits
        assert small.cached_tokens("r0") == small.cached_tokens("r1") == 0  # the idle ones were given away
        texts = small.collect(replies)
        assert all(t and s.finish_reason in ("stop", "length") for t, s in texts)
        assert replies[2].stats.first_token_s > min(r.stats.total_s for r in replies[:2]) - 1e-3
        assert small.cached_tokens("x0") == 0 or small.cached_tokens("x2") == 0  # one was given away
        small.release("x1")
        small.step()
        assert small.cached_tokens("x1") == 0
    finally:
        small.close()


@pytest.mark.slow
def test_history_over_the_context_drops_the_oldest_messages(cfg):
    from base.models import resolve_llm

    small = BatchedChat(resolve_llm(cfg).path, ChatOptions(n_ctx=512, max_sequences=1, batch_tokens=32,
                                                           seed=1, max_tokens=32))
    try:
        messages = long_history("You are brief.", 12)
        messages.append({"role": "user", "content": "Which fact was the most surprising?"})
        assert len(small.prompt.tokens(messages)) > 512
        assert small.generate("a", messages)[0]
        cut = small.last_stats.dropped_messages
        assert cut > 0 and small.last_stats.prompt_tokens <= 512 - 32
        assert messages[0]["role"] == "system" and len(messages) == 26  # input untouched
        # The next turn keeps the same cut, so the prompt prefix stays in the cache.
        messages += [{"role": "assistant", "content": "The plankton one."}, {"role": "user", "content": "Why?"}]
        assert small.generate("a", messages)[0]
        assert small.last_stats.dropped_messages == cut
        assert small.last_stats.cached_tokens > small.last_stats.prompt_tokens // 2
    finally:
        small.close()


@pytest.mark.slow
def test_a_history_cut_shifts_the_cached_rest_instead_of_reading_it_again(cfg):
    """The turn whose history first overflows drops the oldest messages; the rest is still in the
    sequence's cache, at later positions: shifted back, it is not read again (llama.cpp's context shift)."""
    from base.models import resolve_llm

    question = {"role": "user", "content": "Which fact was the most surprising?"}
    runs = {}
    for shift in (True, False):
        small = BatchedChat(resolve_llm(cfg).path, ChatOptions(n_ctx=512, max_sequences=1, batch_tokens=32,
                                                               seed=1, max_tokens=32))
        try:
            small._can_shift = small._can_shift and shift
            pairs = 1
            while len(small.prompt.tokens(long_history("You are brief.", pairs + 1) + [question])) < 470:
                pairs += 1
            messages = long_history("You are brief.", pairs) + [question]  # fits: no cut yet
            text, stats = small.generate("a", messages, GREEDY)
            assert stats.dropped_messages == 0
            for follow_up in ("Why was it surprising? Tell me more about it please.", "And what about the sea?"):
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
                read = small.prompt_evaluated
                text, stats = small.generate("a", messages, GREEDY)
                if stats.dropped_messages:  # the first turn that cut the history
                    break
            assert stats.dropped_messages > 0
            runs[shift] = (text, stats, small.prompt_evaluated - read, small.shifted_tokens)
        finally:
            small.close()
    text, stats, read, shifted = runs[True]
    assert shifted > stats.prompt_tokens // 2 and read == stats.prompt_tokens - stats.cached_tokens <= 30
    plain_text, plain, plain_read, plain_shifted = runs[False]
    assert plain_shifted == 0 and plain_read > stats.prompt_tokens // 2  # read the kept history again
    # The replies may differ (the kept tokens were computed beside the dropped ones); both are answers.
    assert len(text.split()) >= 5 and len(plain_text.split()) >= 5


@pytest.mark.slow
async def test_event_loop_streams_of_two_sessions(engine, cfg):
    from pipeline.llm_worker import BatchedLlm

    reference = alone(engine, cfg, QUESTIONS[:2])
    options = engine.options
    worker = BatchedLlm(engine)
    try:
        async def reply(q: str) -> str:
            parts = [t async for t in worker.stream(fresh("w"), chat(cfg.llm.system_prompt, q), 48,
                                                    threading.Event())]
            return "".join(parts)

        # The server samples at the engine's temperature: compare at 0.
        engine.options = dataclasses.replace(engine.options, temperature=0.0)
        texts = await asyncio.wait_for(asyncio.gather(*(reply(q) for q in QUESTIONS[:2])), scaled(60))
        assert list(texts) == reference
    finally:
        engine.options = options
        worker.stop()  # the module's engine stays open for the other tests


@pytest.mark.slow
@pytest.mark.parametrize("messages", [
    [], [{"role": "robot", "content": "hi"}], [{"role": "user"}], ["hello"]])
def test_bad_messages(engine, messages):
    with pytest.raises(InvalidInput):
        engine.submit("bad", messages)


def test_missing_model_file(tmp_path):
    with pytest.raises(ModelError):
        BatchedChat(tmp_path / "nope.gguf")


@pytest.mark.slow
def test_metrics_report_the_fixed_memory_and_batches(engine, cfg):
    from prometheus_client.parser import text_string_to_metric_families

    from pipeline.trace import Metrics

    engine.generate(fresh(), chat(cfg.llm.system_prompt, "Hi!"), ReplyOptions(max_tokens=3))
    metrics = Metrics()
    metrics.watch_llm(engine.report)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(metrics.exposition().decode())
               for s in f.samples}
    from llm.batched import PROBE_CTX

    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K + V) x 2 bytes per token.
    kv = ((cfg.llm.max_sequences + 1) * cfg.llm.n_ctx + PROBE_CTX) * 30 * 3 * 64 * 2 * 2
    assert samples[("voxloop_llm_memory_bytes", (("kind", "kv_cache"),))] == kv
    assert samples[("voxloop_llm_memory_bytes", (("kind", "weights"),))] > 50e6
    assert samples[("voxloop_llm_sequences", (("state", "configured"),))] == cfg.llm.max_sequences
    assert samples[("voxloop_llm_last_batch", (("unit", "sequences"),))] == 1
    assert samples[("voxloop_llm_steps_total", ())] >= 3
    for read in ("shared", "alone"):
        assert samples[("voxloop_llm_end_of_turn_probes_total", (("read", read),))] == engine.report()[f"probes_{read}"]


@pytest.mark.slow
def test_a_prompt_over_the_context_fails_alone(engine, cfg):
    ok = engine.submit(fresh(), chat(cfg.llm.system_prompt, "Hello!"), GREEDY)
    huge = engine.submit(fresh(), chat(cfg.llm.system_prompt, "word " * 3000), GREEDY)
    while not (ok.done and huge.done):
        engine.step()
    assert isinstance(huge.error, InvalidInput) and huge.stats.finish_reason == "error"
    assert ok.error is None and ok.stats.finish_reason in ("stop", "length")


def test_the_memory_budget_refuses_start_up_before_the_kv_cache(cfg):
    """llm.memory_budget_mb: weights + KV cache over it is an exact error naming what to lower."""
    from base.models import resolve_llm

    path = resolve_llm(cfg).path
    # SmolLM2-135M: ~100 MB of weights; (254 + 1) sequences x 2048 tokens + 512 probe tokens of 23 KB: 11 486 MiB.
    big = ChatOptions(n_ctx=2048, max_sequences=254, batch_tokens=256, memory_budget_mb=1000)
    with pytest.raises(ModelError, match=r"needs \d+ MiB of RAM .*KV cache 11486 MiB for 255 sequences x 2048 "
                                         r"tokens\), over llm\.memory_budget_mb = 1000: lower llm\.max_sequences"):
        BatchedChat(path, big)
    fits = BatchedChat(path, dataclasses.replace(big, n_ctx=256, max_sequences=2, batch_tokens=32))
    try:
        report = fits.report()
        assert report["weights_bytes"] + report["kv_bytes"] < 1000 * 2**20
    finally:
        fits.close()


#: A strict chat template of the Mistral / Llama 2 kind: it refuses two user messages in a row.
STRICT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}{% endfor %}"
)


def test_consecutive_user_messages_are_one_turn_for_a_strict_template():
    """A reply cancelled before it was heard leaves the history, so two user messages follow each
    other; the prompt joins them, which a template requiring alternation accepts."""
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from llm.prompt import alternating

    strict = Jinja2ChatFormatter(template=STRICT_TEMPLATE, eos_token="</s>", bos_token="<s>")
    split = [{"role": "user", "content": "How long does it take?"}, {"role": "user", "content": "to boil an egg"}]
    with pytest.raises(Exception, match="must alternate"):
        strict(messages=split)
    history = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "Hello!"}, *split]
    prompt = strict(messages=alternating(history)).prompt
    assert prompt == "<s>[INST] Hi. [/INST]Hello!</s>[INST] How long does it take?\nto boil an egg [/INST]"
    assert history[2]["content"] == "How long does it take?"  # the caller's messages are left as they were
    assert alternating([{"role": "system", "content": "a"}, {"role": "system", "content": "b"}]) == [
        {"role": "system", "content": "a"}, {"role": "system", "content": "b"}]


#: A chat template of the Gemma 2 kind: no system role.
NO_SYSTEM_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n'"
    " + message['content'] + '<end_of_turn>\n' }}{% endfor %}<start_of_turn>model\n"
)


def test_a_template_without_a_system_role_gets_the_system_prompt_in_the_first_user_turn():
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    from llm.prompt import _takes_system_role, alternating

    gemma = Jinja2ChatFormatter(template=NO_SYSTEM_TEMPLATE, eos_token="<eos>", bos_token="<bos>")
    strict = Jinja2ChatFormatter(template=STRICT_TEMPLATE, eos_token="</s>", bos_token="<s>")
    assert not _takes_system_role(gemma)
    assert not _takes_system_role(strict)  # its roles must alternate from a user message on
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi."},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye."}]
    prompt = gemma(messages=alternating(messages, fold_system=True)).prompt
    assert prompt == ("<bos><start_of_turn>user\nBe brief.\n\nHi.<end_of_turn>\n<start_of_turn>model\nHello!"
                      "<end_of_turn>\n<start_of_turn>user\nBye.<end_of_turn>\n<start_of_turn>model")
    assert strict(messages=alternating(messages, fold_system=True)).prompt.startswith("<s>[INST] Be brief.\n\nHi. [/INST]")
