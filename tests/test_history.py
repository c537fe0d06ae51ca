"""Conversation history bounds (pipeline/history.py)."""

from __future__ import annotations

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
