"""The Python client's function tools (voxloop/client_tools.py, ``RealtimeClient.collect_turn``).

Schemas from type hints are checked as the server checks them; a turn whose reply calls a
registered function runs it, sends the output and gets the answer (a scripted LLM: this is the
client's orchestration; the real model's calls are in tests/test_tool_format.py).
"""

from __future__ import annotations

import json
from typing import Literal

import pytest

from client_fakes import real_tts_engines, start_hub, ws_url
from conftest import scaled
from llm.replies import ToolCallDelta
from realtime.tools import FunctionTool
from test_tool_calls import ScriptedLLM
from voxloop.client import RealtimeClient
from voxloop.client_tools import Toolbox, load_tools, parameters_of

pytestmark = pytest.mark.timeout(scaled(120))


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius", days: int | None = None) -> dict:
    """Current weather of a city.

    More text that is not the description."""
    return {"city": city, "sky": "sunny", "unit": unit}


async def broken(n: int) -> str:
    """Always fails."""
    raise RuntimeError(f"no luck with {n}")


@pytest.fixture(scope="module")
def tts_engines():
    return real_tts_engines()


def test_schemas_come_from_type_hints_and_pass_the_servers_check():
    params = parameters_of(get_weather)
    assert params == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer"}}}
    tool = Toolbox([get_weather]).session_tools()[0]
    assert tool["description"] == "Current weather of a city."
    FunctionTool.from_dict(tool)  # what session.update accepts


async def test_run_gives_json_output_and_errors_as_output():
    box = Toolbox([get_weather, broken])
    assert json.loads(await box.run("get_weather", '{"city": "Oslo"}'))["sky"] == "sunny"
    assert json.loads(await box.run("broken", '{"n": 3}')) == {"error": "RuntimeError: no luck with 3"}
    assert "error" in json.loads(await box.run("get_weather", '{"town": "Oslo"}'))  # bad arguments
    assert "no function" in json.loads(await box.run("nope", "{}"))["error"]


def test_load_tools_reads_the_public_functions_of_a_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text("def lights(on: bool) -> str:\n    '''Turn the lights on or off.'''\n    return 'ok'\n\n"
                    "def _helper():\n    pass\n")
    box = load_tools(path)
    assert list(box.tools) == ["lights"]
    assert box.tools["lights"].parameters["properties"] == {"on": {"type": "boolean"}}


async def test_collect_turn_runs_the_call_and_returns_the_answer(tts_engines):
    llm = ScriptedLLM([ToolCallDelta(0, '{"city": "Oslo"}', "call_7", "get_weather")],
                      answer="Sunny in Oslo.")
    hub = await start_hub(tts_engines, llm=llm)
    try:
        async with RealtimeClient.connect(ws_url(hub), tools=[get_weather],
                                          session={"output_modalities": ["text"]}) as client:
            assert [t.name for t in client.session.tools] == ["get_weather"]
            await client.send_text("Weather in Oslo?", respond=False)
            await client.create_response(tool_choice="get_weather")
            reply = await client.collect_turn(timeout_s=scaled(30))
        assert reply.status == "completed" and reply.transcript == "Sunny in Oslo."
        [result] = reply.tool_results
        assert (result.call_id, result.name, json.loads(result.output)["city"]) == ("call_7", "get_weather", "Oslo")
        assert llm.seen[0]["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
        assert llm.seen[1]["messages"][-1] == {"role": "tool", "tool_call_id": "call_7", "content": result.output}
    finally:
        await hub.stop()
