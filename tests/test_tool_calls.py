"""Function calling through the WebSocket: what docs/protocol.md ("Function calling") promises.

The LLM is a scripted fake that streams text and ``ToolCallDelta`` s, as every backend does (this
is orchestration; the real models' calls are tested in tests/test_tool_format.py and
tests/test_openai_sdk.py); it records the messages and tools each reply was given. The TTS is real.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import websockets

from client_fakes import real_tts_engines, start_hub
from conftest import scaled
from llm.replies import ToolCallDelta
from pipeline.tool_calls import NO_RESULT
from rt import recv, until, url

pytestmark = pytest.mark.timeout(scaled(120))
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather of a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
TEXT = {"type": "realtime", "output_modalities": ["text"], "tools": [WEATHER, TIME],
        "audio": {"input": {"turn_detection": None}}}


class ScriptedLLM:
    """Streams ``script`` (text pieces and ``ToolCallDelta`` s), ``delay_s`` apart, for a reply with
    tools, and ``answer`` for one without a call to make (the turn after the results)."""

    def __init__(self, script: list, answer: str = "It is sunny in Paris.", delay_s: float = 0.005) -> None:
        self.script, self.answer, self.delay_s = script, answer, delay_s
        self.seen: list[dict] = []  # {"messages", "tools", "tool_choice"} of each reply
        self.gate: threading.Event | None = None  # set: the script waits before its last piece

    def stream(self, messages, cancel=None, max_tokens=None, tools=(), tool_choice=None):
        self.seen.append({"messages": messages, "tools": tools, "tool_choice": tool_choice})
        words = self.answer.split(" ")
        pieces = self.script if tools and messages[-1]["role"] != "tool" else [
            w if i == 0 else " " + w for i, w in enumerate(words)]
        for i, piece in enumerate(pieces):
            if self.gate is not None and pieces is self.script and i == len(pieces) - 1:
                self.gate.wait(scaled(10))
            if cancel is not None and cancel.is_set():
                return
            time.sleep(self.delay_s)
            yield piece


def call(index: int, name: str, args: str, call_id: str | None = None) -> ToolCallDelta:
    return ToolCallDelta(index, args, call_id or f"call_{index}", name)


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


async def connect(hub, session: dict | None = None):
    ws = await websockets.connect(url(hub))
    await recv(ws)  # session.created
    await ws.send(json.dumps({"type": "session.update", "session": session or TEXT}))
    await until(ws, "session.updated")
    return ws


async def ask(ws, text: str, response: dict | None = None) -> None:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
    await ws.send(json.dumps({"type": "response.create", **({"response": response} if response else {})}))


async def output(ws, call_id: str, result: str, event_id: str = "out") -> None:
    item = {"type": "function_call_output", "call_id": call_id, "output": result}
    await ws.send(json.dumps({"type": "conversation.item.create", "event_id": event_id, "item": item}))


def types(events: list[dict]) -> list[str]:
    return [e["type"] for e in events]


CALL_EVENTS = ["response.output_item.added", "conversation.item.added", "response.function_call_arguments.delta",
               "response.function_call_arguments.done", "response.output_item.done", "conversation.item.done"]


async def test_a_call_round_trip_reaches_the_answer_with_the_result_in_history(tts_engines):
    llm = ScriptedLLM([call(0, "get_weather", '{"city": "Paris"}')])
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await ask(ws, "Weather in Paris?", {"tool_choice": "required"})
        done, seen = await until(ws, "response.done")
        assert types(seen) == ["conversation.item.added", "conversation.item.done", "response.created",
                               *CALL_EVENTS, "response.done"]
        added, delta, args_done, item_done = seen[3], seen[5], seen[6], seen[7]
        assert added["item"] == {"id": added["item"]["id"], "type": "function_call", "object": "realtime.item",
                                 "status": "in_progress", "call_id": "call_0", "name": "get_weather", "arguments": ""}
        assert delta["delta"] == '{"city": "Paris"}' and delta["output_index"] == 0
        assert (args_done["name"], args_done["arguments"]) == ("get_weather", '{"city": "Paris"}')
        assert item_done["item"]["status"] == "completed"
        assert done["response"]["status"] == "completed" and done["response"]["output"] == [item_done["item"]]
        assert llm.seen[0]["tool_choice"] == "required"
        assert [t["function"]["name"] for t in llm.seen[0]["tools"]] == ["get_weather", "get_time"]

        await output(ws, "call_0", '{"sky": "sunny"}')
        added, _ = await until(ws, "conversation.item.done")
        assert added["item"]["type"] == "function_call_output" and added["item"]["call_id"] == "call_0"
        await ws.send(json.dumps({"type": "response.create"}))
        done, seen = await until(ws, "response.done")
        assert "".join(e["delta"] for e in seen if e["type"] == "response.output_text.delta") == "It is sunny in Paris."
        messages = llm.seen[1]["messages"]
        assert messages[-2] == {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
        assert messages[-1] == {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "sunny"}'}
        assert llm.seen[1]["tool_choice"] == "auto"  # the session's, not the first response's

        await ask(ws, "Thanks!")  # history keeps the call and its output across turns
        await until(ws, "response.done")
        assert {"role": "tool", "tool_call_id": "call_0", "content": '{"sky": "sunny"}'} in llm.seen[2]["messages"]
        await ws.close()
    finally:
        await hub.stop()


async def test_text_before_a_call_is_spoken_and_the_call_is_not(tts_engines):
    llm = ScriptedLLM(["Let", " me", " check.", call(0, "get_weather", '{"city": '), call(0, "", '"Oslo"}')])
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub, {**TEXT, "output_modalities": ["audio"]})
        await ask(ws, "Weather in Oslo?")
        done, seen = await until(ws, "response.done")
        kinds = types(seen)
        spoken = [e for e in seen if e["type"] == "response.output_audio_transcript.done"]
        assert spoken[0]["transcript"] == "Let me check." and "response.output_audio.delta" in kinds
        message_done = kinds.index("response.output_item.done")
        assert kinds.index("response.output_audio.delta") < message_done < kinds.index(
            "response.function_call_arguments.delta")  # the message item ends before the call begins
        deltas = [e["delta"] for e in seen if e["type"] == "response.function_call_arguments.delta"]
        assert deltas == ['{"city": ', '"Oslo"}']
        calls = [e for e in seen if e["type"] == "response.output_item.added" and e["item"]["type"] == "function_call"]
        assert calls[0]["output_index"] == 1
        output_items = done["response"]["output"]
        assert [i["type"] for i in output_items] == ["message", "function_call"]
        assert output_items[1]["arguments"] == '{"city": "Oslo"}' and "Oslo" not in output_items[0]["content"][0][
            "transcript"]
        await ws.close()
    finally:
        await hub.stop()


async def test_several_calls_are_items_in_order_and_an_unanswered_one_reads_no_result(tts_engines):
    llm = ScriptedLLM([call(0, "get_weather", '{"city": "Paris"}'), call(1, "get_time", "{}")])
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await ask(ws, "Weather and time?", {"tool_choice": "required"})
        done, seen = await until(ws, "response.done")
        assert [(i["name"], i["status"]) for i in done["response"]["output"]] == [
            ("get_weather", "completed"), ("get_time", "completed")]
        dones = [e for e in seen if e["type"] == "response.function_call_arguments.done"]
        assert [(e["call_id"], e["output_index"]) for e in dones] == [("call_0", 0), ("call_1", 1)]
        await output(ws, "call_1", "12:00")  # only the second is answered
        await until(ws, "conversation.item.done")
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        tool_messages = [m for m in llm.seen[1]["messages"] if m["role"] == "tool"]
        assert tool_messages == [{"role": "tool", "tool_call_id": "call_0", "content": NO_RESULT},
                                 {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
        await ws.close()
    finally:
        await hub.stop()


async def test_outputs_for_unknown_or_answered_calls_are_refused_and_change_nothing(tts_engines):
    llm = ScriptedLLM([call(0, "get_time", "{}")])
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await output(ws, "call_nope", "x", event_id="e1")
        err, _ = await until(ws, "error")
        assert (err["type"], err["error"]["code"], err["error"]["param"], err["error"]["event_id"]) == (
            "error", "unknown_call_id", "item.call_id", "e1")
        await ask(ws, "Time?", {"tool_choice": "required"})
        await until(ws, "response.done")
        await output(ws, "call_0", "12:00")
        await until(ws, "conversation.item.done")
        await output(ws, "call_0", "13:00", event_id="e2")
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["event_id"]) == ("call_already_answered", "e2")
        big = "x" * 20_001
        await output(ws, "call_0", big, event_id="e3")
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["param"]) == ("text_too_long", "item.output")
        await ws.send(json.dumps({"type": "response.create", "event_id": "e4",
                                  "response": {"tool_choice": {"type": "function", "name": "nope"}}}))
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["param"]) == ("invalid_value", "response.tool_choice.name")
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        assert [m["content"] for m in llm.seen[-1]["messages"] if m["role"] == "tool"] == ["12:00"]
        await ws.close()
    finally:
        await hub.stop()


async def test_a_bad_tool_schema_is_refused_and_the_session_keeps_its_tools(tts_engines):
    hub = await start_hub(tts_engines, llm=ScriptedLLM([]))
    try:
        ws = await connect(hub)
        bad = {**WEATHER, "parameters": {"type": "object", "properties": {"city": {"type": "strng"}}}}
        await ws.send(json.dumps({"type": "session.update", "event_id": "u1", "session": {"tools": [bad]}}))
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["param"], err["error"]["event_id"]) == (
            "invalid_value", "session.tools[0].parameters.properties.city.type", "u1")
        await ws.send(json.dumps({"type": "session.update", "session": {"instructions": "Be brief."}}))
        updated = await recv(ws)
        assert [t["name"] for t in updated["session"]["tools"]] == ["get_weather", "get_time"]
        await ws.close()
    finally:
        await hub.stop()


async def test_a_call_cut_by_cancel_ends_incomplete_and_its_output_is_refused(tts_engines):
    llm = ScriptedLLM([call(0, "get_weather", '{"city": '), call(0, "", '"Rome"}')], delay_s=0.05)
    llm.gate = threading.Event()  # the call's last piece waits: the cancel comes mid-arguments
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await ask(ws, "Weather in Rome?", {"tool_choice": "required"})
        delta, _ = await until(ws, "response.function_call_arguments.delta")
        await ws.send(json.dumps({"type": "response.cancel"}))
        done, seen = await until(ws, "response.done")
        llm.gate.set()
        assert types(seen)[-4:] == ["response.function_call_arguments.done", "response.output_item.done",
                                    "conversation.item.done", "response.done"]
        assert seen[-4]["arguments"] == '{"city": '
        assert done["response"]["status"] == "cancelled"
        assert [i["status"] for i in done["response"]["output"]] == ["incomplete"]
        await output(ws, delta["call_id"], "sunny", event_id="late")
        err, _ = await until(ws, "error")
        assert (err["error"]["code"], err["error"]["event_id"]) == ("unknown_call_id", "late")
        assert "cut off" in err["error"]["message"]
        await ws.close()
    finally:
        await hub.stop()


async def test_a_complete_call_survives_a_cancel_and_its_late_output_is_accepted(tts_engines):
    llm = ScriptedLLM([call(0, "get_time", "{}"), call(1, "get_weather", '{"city": '), call(1, "", '"Rome"}')],
                      delay_s=0.05)
    llm.gate = threading.Event()  # the second call's last piece waits: the cancel comes in its arguments
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await ask(ws, "Time?", {"tool_choice": "required"})
        await until(ws, "response.function_call_arguments.done")  # the first call is complete
        await until(ws, "response.function_call_arguments.delta")
        await ws.send(json.dumps({"type": "response.cancel"}))
        done, _ = await until(ws, "response.done")
        llm.gate.set()
        assert done["response"]["status"] == "cancelled"
        assert [i["status"] for i in done["response"]["output"]] == ["completed", "incomplete"]
        await output(ws, "call_0", "12:00")
        added, _ = await until(ws, "conversation.item.done")
        assert added["item"]["type"] == "function_call_output"
        await ws.send(json.dumps({"type": "response.create"}))
        await until(ws, "response.done")
        assert {"role": "tool", "tool_call_id": "call_0", "content": "12:00"} in llm.seen[-1]["messages"]
        await ws.close()
    finally:
        await hub.stop()


async def test_response_create_sent_before_the_calling_response_ends_waits_for_it(tts_engines):
    llm = ScriptedLLM([call(0, "get_time", "{}"), call(1, "get_weather", '{"city": '), call(1, "", '"Rome"}')],
                      delay_s=0.05)
    llm.gate = threading.Event()  # the response stays open after its first call
    hub = await start_hub(tts_engines, llm=llm)
    try:
        ws = await connect(hub)
        await ask(ws, "Time?", {"tool_choice": "required"})
        await until(ws, "response.function_call_arguments.delta")
        await until(ws, "response.output_item.added")  # the second call: the first is complete
        await output(ws, "call_0", "12:00")  # answered at once, while the response is still open
        await ws.send(json.dumps({"type": "response.create"}))
        await asyncio.sleep(0.2)
        llm.gate.set()
        first, seen = await until(ws, "response.done")
        assert "error" not in types(seen)
        second, seen = await until(ws, "response.done")
        assert second["response"]["id"] != first["response"]["id"] and second["response"]["status"] == "completed"
        assert "error" not in types(seen)
        await ws.close()
    finally:
        await hub.stop()
