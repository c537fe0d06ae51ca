"""Conversation history bounds (pipeline/history.py), and the LLM told when the history is cut."""

from __future__ import annotations

import asyncio

from client_fakes import FakeLLM, real_tts_engines, start_hub
from conftest import scaled
from rt import until, url, user_text

from pipeline.history import History


def test_over_the_budget_drops_to_half_then_keeps_the_prefix():
    h = History(max_chars=1000)
    firsts = []
    for i in range(40):
        h.add("user" if i % 2 == 0 else "assistant", f"{i:02d}" + "x" * 98, f"item{i}")
        firsts.append(h.snapshot()[0].item_id)
    chars = sum(len(m.content) for m in h.snapshot())
    assert chars <= 1000
    # The first kept message changes only when the budget is exceeded, not at every turn.
    changes = sum(a != b for a, b in zip(firsts, firsts[1:]))
    assert 0 < changes <= 40 // 5, firsts
    assert h.messages("sys")[1]["content"].startswith(h.snapshot()[0].content[:2])


def test_indices_stay_valid_after_drops():
    h = History(max_chars=1000)
    index = None
    for i in range(12):
        index = h.add("assistant", "y" * 200, f"item{i}")
    h.truncate(index, "item11", "heard")
    assert h.snapshot()[-1].content == "heard"


async def test_a_cut_history_is_prefilled_for_the_next_turn_after_the_reply():
    """Once a reply's end cuts the history, the LLM reads the cut history ahead of the next turn."""
    import websockets

    # 3 x 400 characters exceed the 1000-character floor of History (n_ctx is small here).
    hub = await start_hub(real_tts_engines(), "llm.n_ctx=300", "llm.max_tokens=20",
                          llm=FakeLLM("word " * 80, delay_s=0.0))
    prefills = []
    hub.engines.llm.prefill = lambda session, messages: prefills.append(messages)
    try:
        async with websockets.connect(url(hub)) as ws:
            await until(ws, "session.created")
            await ws.send('{"type": "session.update", "session": {"type": "realtime", "output_modalities": ["text"]}}')
            await until(ws, "session.updated")
            for i in range(3):
                for m in user_text(f"question {i}"):
                    await ws.send(m)
                await until(ws, "response.done", timeout=30)
                if prefills:
                    break
            await asyncio.sleep(scaled(0.05))
    finally:
        await hub.stop()
    assert len(prefills) == 1
    messages = prefills[0]
    assert messages[0]["role"] == "system" and messages[1]["role"] != "system"
    assert messages[-1]["role"] == "assistant"  # the reply that cut it is in, no generation yet
    assert sum(len(m["content"]) for m in messages[1:]) <= 1000
