"""``collect_response`` after a barge-in: the interrupted turn's ``x.turn.metrics`` may still be
unread when the next reply is collected; it must not take the new reply's place."""

from __future__ import annotations

import pytest

from client_fakes import FakeLLM, real_tts_engines, start_hub, ws_url
from conftest import scaled
from voxloop.client import RealtimeClient

pytestmark = pytest.mark.timeout(scaled(120))


async def test_the_next_reply_is_collected_past_the_last_turns_metrics():
    llm = FakeLLM(" ".join(["This reply goes on and on, clause after clause."] * 6), delay_s=0.03)
    hub = await start_hub(real_tts_engines(), llm=llm)
    try:
        async with RealtimeClient.connect(ws_url(hub)) as c:
            await c.send_text("Talk for a while.")
            await c.wait_for("response.output_audio.delta", timeout_s=scaled(20))
            await c.cancel_response()
            # Collected without waiting for its metrics: they are still to be read.
            first = await c.collect_response(timeout_s=scaled(20), metrics_timeout_s=0)
            assert first.status == "cancelled"
            llm.tokens = ["And", " now", " a", " short", " one."]
            await c.send_text("And now?")
            second = await c.collect_response(timeout_s=scaled(30))
            assert second.status == "completed" and second.response_id != first.response_id
            assert second.transcript == "And now a short one."
    finally:
        await hub.stop()
