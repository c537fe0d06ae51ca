"""``llm.backend = "openai"`` without a server: the request voxloop sends, the streamed chunks it
reads (in the shapes real servers send them, parsed by the openai SDK's own types), the errors it
makes of a server's refusals, and the settings. The real server is in test_llm_server.py."""

from __future__ import annotations

import httpx2
import openai
import pytest
from openai._models import construct_type
from openai.types.chat import ChatCompletionChunk

from base.config import load_config
from base.errors import ConfigError, ModelError, ModelUnavailable, Overloaded
from llm.chat_completions import ChatServer, ChunkReader, chat_request
from llm.replies import ReplyOptions, ToolCallDelta
from pipeline.engine_link import engine_stages

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


def chunk(delta: dict | None = None, finish: str | None = None, usage: dict | None = None) -> ChatCompletionChunk:
    """A streamed chunk as the SDK hands it over: built without validation, as its streams do by
    default, so what a lax server sends (a call without an ``index``, Ollama's) arrives as sent."""
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return construct_type(type_=ChatCompletionChunk, value={"id": "c", "object": "chat.completion.chunk", "created": 0,
                                                            "model": "m", "choices": choices, "usage": usage})


def call(index: int | None, arguments: str, id_: str | None = None, name: str | None = None) -> dict:
    return {"index": index, "id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_request_carries_the_history_settings_and_tools_as_given():
    history = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [
                   {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    options = ReplyOptions(max_tokens=50, tools=(WEATHER, TIME), tool_choice="auto")
    request = chat_request("m", history, options, max_tokens=160, temperature=0.2, seed=7)
    assert request["model"] == "m" and request["stream"] is True
    assert request["max_tokens"] == 50 and request["temperature"] == 0.2 and request["seed"] == 7
    assert request["stream_options"] == {"include_usage": True}
    assert request["tools"] == [WEATHER, TIME] and request["tool_choice"] == "auto"
    # Chat templates that concatenate the content fail on null: a call-only assistant turn sends "".
    assert request["messages"][2]["content"] == "" and request["messages"][2]["tool_calls"] == history[2]["tool_calls"]
    assert request["messages"][3] == history[3] and history[2]["content"] is None  # the history is not changed


def test_no_tools_send_no_tool_fields_and_unset_values_take_the_configured_ones():
    request = chat_request("m", [{"role": "user", "content": "Hi"}], ReplyOptions(), 160, 0.2, None)
    assert "tools" not in request and "tool_choice" not in request and "seed" not in request
    assert request["max_tokens"] == 160
    named = {"type": "function", "function": {"name": "get_time"}}
    request = chat_request("m", [], ReplyOptions(tools=(WEATHER, TIME), tool_choice=named, temperature=0.0), 160, 0.2, 1)
    assert request["tool_choice"] == named and request["temperature"] == 0.0


def test_required_with_one_tool_is_sent_as_that_tool_named():
    request = chat_request("m", [], ReplyOptions(tools=(WEATHER,), tool_choice="required"), 160, 0.2, None)
    assert request["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    request = chat_request("m", [], ReplyOptions(tools=(WEATHER, TIME), tool_choice="required"), 160, 0.2, None)
    assert request["tool_choice"] == "required"


def test_text_and_a_call_as_openai_streams_them():
    reader = ChunkReader()
    pieces = []
    for c in [chunk({"role": "assistant", "content": ""}), chunk({"content": "Let me check."}),
              chunk({"tool_calls": [call(0, "", "call_abc", "get_weather")]}),
              chunk({"tool_calls": [call(0, '{"city":')]}), chunk({"tool_calls": [call(0, ' "Paris"}')]}),
              chunk({}, finish="tool_calls"),
              chunk(None, usage={"prompt_tokens": 40, "completion_tokens": 12, "total_tokens": 52,
                                 "prompt_tokens_details": {"cached_tokens": 32}})]:
        pieces += reader.feed(c)
    assert pieces == ["Let me check.", ToolCallDelta(0, "", call_id="call_abc", name="get_weather"),
                      ToolCallDelta(0, '{"city":'), ToolCallDelta(0, ' "Paris"}')]
    stats = reader.stats(total_s=1.0, first_token_s=0.2)
    assert (stats.prompt_tokens, stats.cached_tokens, stats.completion_tokens) == (40, 32, 12)
    assert stats.finish_reason == "stop" and stats.first_token_s == 0.2 and stats.usage_reported


def test_llama_cpp_pythons_repeated_ids_and_names_give_one_first_piece_per_call():
    """llama-cpp-python's server repeats the call's id and name (and a legacy ``function_call``) in
    every chunk and never sends usage."""
    reader = ChunkReader()
    pieces = []
    for args in ['{"', "city", '": "', "Paris", '"}', ""]:
        delta = {"function_call": {"name": "get_weather", "arguments": args},
                 "tool_calls": [call(0, args, "call__0_get_weather_cmpl-1", "get_weather")]}
        pieces += reader.feed(chunk(delta))
    reader.feed(chunk({}, finish="tool_calls"))
    assert pieces[0] == ToolCallDelta(0, '{"', call_id="call__0_get_weather_cmpl-1", name="get_weather")
    assert all(p.call_id is None and p.name is None for p in pieces[1:])
    assert "".join(p.arguments for p in pieces) == '{"city": "Paris"}' and len(pieces) == 5  # no empty piece
    stats = reader.stats(1.0, 0.1)
    assert stats.prompt_tokens == 0 and stats.completion_tokens == 5  # no usage: the streamed pieces
    assert not stats.usage_reported  # so response.done counts the streamed tokens instead


def test_calls_without_ids_or_indexes_get_them_in_order_and_reasoning_is_not_spoken():
    reader = ChunkReader()
    pieces = reader.feed(chunk({"tool_calls": [call(None, "{}", None, "get_time"), call(None, '{"city":"Oslo"}', None,
                                                                                          "get_weather")]}))
    pieces += reader.feed(chunk({"reasoning_content": "The user wants...", "content": "Sure."}, finish="length"))
    first, second, text = pieces
    assert (first.index, first.name, second.index, second.name) == (0, "get_time", 1, "get_weather")
    assert first.call_id.startswith("call_") and first.call_id != second.call_id
    assert text == "Sure." and reader.stats(1.0, 0.1).finish_reason == "length"
    assert reader.stats(1.0, 0.1, cancelled=True).finish_reason == "cancelled"


def status_error(status: int, headers: dict | None = None, message: str = "nope") -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
    response = httpx2.Response(status, headers=headers or {}, request=request, json={"error": {"message": message}})
    return openai.APIStatusError(message, response=response, body=None)


def server(*overrides: str, environ: dict | None = None) -> ChatServer:
    cfg = load_config(None, ["llm.backend=openai", "llm.base_url=http://127.0.0.1:9/v1", *overrides], environ={})
    return ChatServer(cfg, environ=environ or {})


def test_a_servers_refusals_become_errors_that_say_what_to_change():
    s = server("llm.api_key_env=MY_LLM_KEY")
    busy = s.error(status_error(429, {"Retry-After": "3"}))
    assert isinstance(busy, Overloaded) and busy.retry_after_ms == 3000 and busy.code == "server_overloaded"
    assert s.error(status_error(503)).retry_after_ms == 2000  # none given
    key = s.error(status_error(401, message="Invalid API key"))
    assert type(key) is ModelError and "MY_LLM_KEY" in key.message and "Invalid API key" in key.message
    assert "llm.base_url" in s.error(status_error(404)).message
    refused = s.error(status_error(400, message="x" * 1000))
    assert refused.code == "model_error" and "(400)" in refused.message and len(refused.message) < 400
    request = httpx2.Request("GET", "http://127.0.0.1:9/v1/models")
    down = s.error(openai.APIConnectionError(request=request))
    assert isinstance(down, ModelUnavailable) and "cannot be reached" in down.message
    assert "broke off" in s.error(openai.APIConnectionError(request=request), streaming=True).message
    late = s.error(openai.APITimeoutError(request=request))
    assert isinstance(late, ModelUnavailable) and "llm.read_timeout_s" in late.message
    assert "llm.connect_timeout_s" in s.error(openai.APITimeoutError(request=request), checking=True).message
    bug = ValueError("not the server's")
    assert s.error(bug) is bug


def test_the_key_comes_from_the_named_environment_variable_only():
    assert server("llm.api_key_env=MY_LLM_KEY", environ={"MY_LLM_KEY": "sk-1"}).client.api_key == "sk-1"
    keyless = server(environ={"OTHER": "sk-2"})
    assert keyless._headers == {"Authorization": openai.omit}  # no key: no Authorization header


def test_settings_are_checked():
    with pytest.raises(ConfigError, match="llm.backend"):
        load_config(None, ["llm.backend=ollama"], environ={})
    with pytest.raises(ConfigError, match="llm.base_url"):
        load_config(None, ["llm.base_url=127.0.0.1:8080"], environ={})
    with pytest.raises(ConfigError, match="read_timeout_s"):
        load_config(None, ["llm.read_timeout_s=0"], environ={})
    # base_url may come from another source than backend (file, environment, --set): checked when the server is made.
    cfg = load_config(None, ["llm.backend=openai"], environ={})
    with pytest.raises(ConfigError, match="needs llm.base_url"):
        ChatServer(cfg)
    cfg = load_config(None, ["llm.backend=openai", "llm.base_url=http://h/v1"], environ={"VOXLOOP_LLM__MODEL": "qwen3"})
    assert ChatServer(cfg, environ={}).model == "qwen3"


def test_front_ends_stream_from_the_server_themselves():
    cfg = load_config(None, ["llm.backend=openai", "llm.base_url=http://h/v1", "llm.n_gpu_layers=-1",
                             "asr.device=cuda"], environ={})
    assert engine_stages(cfg) == ("asr",)  # not the LLM, though n_gpu_layers is set
    cfg = cfg.replace("server", engine_stages=("asr", "llm"))
    with pytest.raises(ConfigError, match='Remove "llm" from server.engine_stages'):
        engine_stages(cfg)


def test_the_server_stage_has_the_batched_stages_interface():
    """Sessions use ``engines.llm`` the same way whichever backend: every public member of
    ``BatchedLlm`` but its thread's own has the same parameters on ``ServerLlm``."""
    import inspect

    from pipeline.llm_worker import BatchedLlm
    from pipeline.server_llm import ServerLlm

    own = {"stop", "probe_words", "words_probe"}  # the batching thread's, and the LLM process's hand-off
    for name, member in inspect.getmembers(BatchedLlm):
        if name.startswith("_") or name in own:
            continue
        theirs = getattr(ServerLlm, name)
        if callable(member):
            assert inspect.signature(theirs).parameters.keys() == inspect.signature(member).parameters.keys(), name
            assert inspect.iscoroutinefunction(theirs) == inspect.iscoroutinefunction(member), name
            assert inspect.isasyncgenfunction(theirs) == inspect.isasyncgenfunction(member), name
