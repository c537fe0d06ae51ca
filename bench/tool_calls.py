"""What function calling adds to a turn's latency on the served path (docs/protocol.md, "Function calling").

A client process (JSON/base64 audio at 24 kHz, permessage-deflate offered) talks to a ``voxloop
serve`` process with the bundled models. Per trial: a user message and ``response.create`` with
``tool_choice: "required"`` (the model writes one ``get_weather`` call through the grammar), then
the call's ``function_call_output`` and ``response.create``, answered in speech. Measured:

* ``call_tail_ms``: the model's last argument token -> ``response.function_call_arguments.done``
  received: the client's time from ``response.create`` sent to ``…arguments.done`` received, less
  the server's time up to the engine's end of the reply (``x.turn.metrics``: ``stages_ms.llm_start``
  + ``llm_engine_total_ms``, the engine's submit to its last token);
* ``call_total_ms``: ``response.create`` sent -> ``…arguments.done`` received;
* ``answer_first_audio_ms``: ``function_call_output`` + ``response.create`` sent -> first audio
  delta of the answer received;
* ``answer_protocol_ms``: that, less the models' part (``stages_ms.tts_first_audio - llm_start``:
  LLM to its first clause, TTS to its first audio): reading the output, the prompt, the hand-offs,
  the socket.

Beside it, the engine alone in this process (the server stopped): ``BatchedChat`` makes the same
call from the same messages (``engine_call_ms``, submit -> the call), so ``call_total_ms`` /
``engine_call_ms`` is the served path's ratio.

    python -m bench.tool_calls --trials 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from bench.harness import (
    add_output_arguments,
    free_port,
    pct,
    run_client_processes,
    start_server,
    stop_server,
    write_json,
)

TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
QUESTIONS = ["What is the weather in Paris?", "Is it raining in Oslo?", "How warm is it in Rome today?",
             "Weather in Tokyo, please.", "Do I need an umbrella in London?"]
SYSTEM = "You are a helpful voice assistant. Answer in one short sentence."


async def _until(ws, kind: str) -> tuple[dict, float]:
    while True:
        message = await ws.recv()
        now = time.monotonic()
        if isinstance(message, str):
            event = json.loads(message)
            if event["type"] == "error":
                raise RuntimeError(event["error"]["message"])
            if event["type"] == kind:
                return event, now


async def _trial(url: str, question: str) -> dict:
    import websockets

    async with websockets.connect(url, max_size=None, compression="deflate", open_timeout=60) as ws:
        await _until(ws, "session.created")
        await ws.send(json.dumps({"type": "session.update", "session": {
            "instructions": SYSTEM, "tools": [TOOL], "tool_choice": "none", "x_events": True,  # x.turn.metrics
            "audio": {"input": {"turn_detection": None}, "output": {"format": {"type": "audio/pcm", "rate": 24000}}}}}))
        await _until(ws, "session.updated")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": item}))
        await _until(ws, "conversation.item.done")
        sent = time.monotonic()
        await ws.send(json.dumps({"type": "response.create", "response": {"tool_choice": "required"}}))
        call, call_at = await _until(ws, "response.function_call_arguments.done")
        first = (await _until(ws, "x.turn.metrics"))[0]["metrics"]
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": '{"sky": "sunny", "celsius": 21}'}
        await ws.send(json.dumps({"type": "conversation.item.create", "item": output}))
        answer_sent = time.monotonic()
        await ws.send(json.dumps({"type": "response.create"}))
        _, audio_at = await _until(ws, "response.output_audio.delta")
        second = (await _until(ws, "x.turn.metrics"))[0]["metrics"]
    engine_end = first["stages_ms"]["llm_start"] + first["llm_engine_total_ms"]
    stages = second["stages_ms"]
    answer_ms = 1000 * (audio_at - answer_sent)
    return {"question": question, "arguments": call["arguments"],
            "call_total_ms": 1000 * (call_at - sent), "call_tail_ms": 1000 * (call_at - sent) - engine_end,
            "server_llm_start_ms": first["stages_ms"]["llm_start"], "engine_total_ms": first["llm_engine_total_ms"],
            "answer_first_audio_ms": answer_ms,
            "answer_protocol_ms": answer_ms - (stages["tts_first_audio"] - stages["llm_start"])}


def client(group: list[int], url: str, t0: float) -> list[dict]:
    """One client process: its trials one after another (a conversation per trial)."""
    return [asyncio.run(_trial(url, QUESTIONS[n % len(QUESTIONS)])) for n in group]


def engine_alone(trials: int) -> list[float]:
    """ms from submit to the call, the engine on its own thread (this process)."""
    from base.config import load_config
    from llm.batched import BatchedChat
    from llm.replies import ReplyOptions
    from realtime.tools import FunctionTool, chat_tools

    chat = BatchedChat.from_config(load_config())
    tools = chat_tools([FunctionTool.from_dict(TOOL)])
    out = []
    try:
        for n in range(trials):
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": QUESTIONS[n % len(QUESTIONS)]}]
            t = time.perf_counter()
            reply = chat.submit(f"s{n}", messages, ReplyOptions(tools=tools, tool_choice="required"))
            while not reply.done:
                if any(e.reply is reply and e.tool_calls for e in chat.step(wait_s=0.001)):
                    out.append(1000 * (time.perf_counter() - t))
            chat.release(f"s{n}")
            chat.step()
    finally:
        chat.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="server config overrides")
    add_output_arguments(parser)
    args = parser.parse_args()
    port = free_port()
    server = start_server(port, [a for kv in args.set for a in ("--set", kv)])
    try:
        [(ok, rows)] = run_client_processes(client, [list(range(args.trials))],
                                            (f"ws://127.0.0.1:{port}/v1/realtime",), timeout_s=60 * args.trials)
    finally:
        stop_server(server)
    if not ok:
        raise SystemExit(f"client failed: {rows}")
    engine = engine_alone(args.trials)
    summary = {}
    for key in ("call_tail_ms", "call_total_ms", "answer_first_audio_ms", "answer_protocol_ms"):
        values = [r[key] for r in rows]
        summary[key] = {"p50": pct(values, 50), "p99": pct(values, 99)}
    summary["engine_call_ms"] = {"p50": pct(engine, 50), "p99": pct(engine, 99)}
    summary["served_over_engine_p50"] = summary["call_total_ms"]["p50"] / summary["engine_call_ms"]["p50"]
    for key, value in summary.items():
        print(f"{key}: {value}")
    path = write_json("tool_calls", rows, {"summary": summary, "trials": args.trials}, out=args.out)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
