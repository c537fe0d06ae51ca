"""Function calls in a GGUF's own format (llm/tool_format.py), and the in-process engine's calls.

Template files in the style of four families (tests/data/chat_templates: Qwen 2.5, Hermes 3,
Llama 3.1, Mistral Nemo: the same markup, roles and constraints as those models' templates) render
a conversation with tools, a call and its result; what each family's model writes is parsed back.
The bundled SmolLM2-135M (a template without tools) makes valid calls under ``tool_choice``
``required`` / a named function, through the grammar built from the JSON Schema.
"""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from llama_cpp.llama_chat_format import Jinja2ChatFormatter

from conftest import scaled
from llm.prompt import render
from llm.tool_format import GRAMMAR_ROOT, ToolFormat, mistral_id

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
PARAMS = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city",
                                            "parameters": PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "The local time",
                                         "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_0123456789abcdef", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CONVERSATION = [
    {"role": "system", "content": "You are a voice assistant."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": CALL["id"], "content": '{"sky": "sunny", "celsius": 21}'},
    {"role": "assistant", "content": "It is sunny, 21 degrees."},
    {"role": "user", "content": "And in Oslo?"},
]
#: family -> (template file, how the call is shown in the prompt, what the model writes for a call)
FAMILIES = {
    "qwen2.5": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'),
    "hermes3": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
                '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'),
    "llama3.1": ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}',
                 '{"name": "get_weather", "parameters": {"city": "Oslo"}}'),
    "mistral-nemo": ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "'
                     + mistral_id(CALL["id"]) + '"}]</s>',
                     '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}]'),
}


def formatter(name: str) -> Jinja2ChatFormatter:
    source = (TEMPLATES / f"{name}-style.jinja").read_text(encoding="utf-8")
    return Jinja2ChatFormatter(template=source, eos_token="</s>", bos_token="<s>")


def parse(fmt: ToolFormat, reply: str, step: int = 3) -> tuple[str, list]:
    """Feed ``reply`` in pieces of ``step`` characters, as tokens arrive."""
    parser, text, calls = fmt.parser(), [], []
    for i in range(0, len(reply), step):
        t, c = parser.feed(reply[i:i + step])
        text.append(t)
        calls += c
    t, c = parser.flush()
    return "".join(text + [t]), calls + c


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_template_shows_tools_calls_and_results_and_its_calls_parse_back(name):
    family, shown, written = FAMILIES[name]
    template = formatter(name)
    fmt = ToolFormat.for_template(template.template)
    assert fmt.family == family
    prompt = render(template, fmt, CONVERSATION, (WEATHER, TIME))
    assert "Current weather of a city" in prompt and "get_time" in prompt  # the tools
    assert shown in prompt  # the call, arguments as an object
    assert '{"sky": "sunny", "celsius": 21}' in prompt and "It is sunny, 21 degrees." in prompt
    assert prompt.index("Weather in Paris?") < prompt.index(shown) < prompt.index('"sky"') < prompt.index("And in Oslo?")
    text, calls = parse(fmt, written)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert text.strip() in ("", "Checking.")
    assert calls[0].call_id.startswith("call_")


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_family_template_takes_several_calls_and_an_unanswered_one(name):
    """Two calls in one assistant turn (Llama 3.1's template takes one per message: split), the
    second unanswered (its result is the placeholder the history gives), then the user speaks again."""
    second = {"id": "call_fedcba9876543210", "type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    conversation = [*CONVERSATION[:2], {"role": "assistant", "content": "", "tool_calls": [CALL, second]},
                    {"role": "tool", "tool_call_id": CALL["id"], "content": "sunny"},
                    {"role": "tool", "tool_call_id": second["id"], "content": "(no result)"},
                    {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks."}]
    template = formatter(name)
    prompt = render(template, ToolFormat.for_template(template.template), conversation, (WEATHER, TIME))
    assert prompt.count("get_time") >= 2 and "(no result)" in prompt
    # The user speaks right after the results (a barge-in before the answer): still a valid prompt.
    interrupted = render(template, ToolFormat.for_template(template.template), conversation[:5] + conversation[6:],
                         (WEATHER, TIME))
    assert "Thanks." in interrupted  # Mistral's template refuses a user turn right after results


def test_plain_text_replies_pass_through_every_parser_unchanged():
    for family in ("hermes", "llama3", "mistral", "prompted"):
        reply = "The sky is {blue} today; <tool is not a tag> and [TOOL is not either."
        assert parse(ToolFormat(family), reply) == (reply, [])


def test_a_call_cut_short_is_not_said():
    """The token limit stops a reply inside its call: nothing of the markup becomes text to speak."""
    for family, cut in (("hermes", 'Sure. <tool_call>\n{"name": "get_weather", "argu'),
                        ("mistral", '[TOOL_CALLS][{"name": "get_wea'), ("llama3", '{"name": "get_weather", "par')):
        assert parse(ToolFormat(family), cut) == ("Sure. " if family == "hermes" else "", [])


def test_a_template_without_tools_gets_them_in_the_system_message():
    """SmolLM2's kind of template (ChatML, no ``tools``): the prompted family."""
    plain = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    template = Jinja2ChatFormatter(template=plain, eos_token="<|im_end|>", bos_token="")
    fmt = ToolFormat.for_template(plain)
    prompt = render(template, fmt, CONVERSATION, (WEATHER,))
    assert fmt.family == "prompted"
    assert prompt.startswith("<|im_start|>system\nYou are a voice assistant.\n\nYou can call functions.")
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' \
        in prompt
    assert '<|im_start|>user\nThe result of get_weather is {"sky": "sunny", "celsius": 21}.' in prompt


def test_a_grammar_is_one_call_of_the_named_tool():
    grammar = ToolFormat("hermes").grammar((WEATHER, TIME), {"type": "function", "function": {"name": "get_time"}})
    assert f"{GRAMMAR_ROOT} ::=" in grammar and "get_time" in grammar and "get_weather" not in grammar
    both = ToolFormat("llama3").grammar((WEATHER, TIME), "required")
    assert "get_time" in both and "get_weather" in both and "parameters" in both


# --------------------------------------------------------------------------- the bundled model
@pytest.fixture(scope="module")
def engine():
    from base.config import load_config
    from llm.batched import BatchedChat

    chat = BatchedChat.from_config(load_config(None, ["llm.max_sequences=2", "llm.temperature=0.7"], environ={}))
    yield chat
    chat.close()


def reply(engine, session, messages, **options):
    from llm.replies import ReplyOptions

    r = engine.submit(session, messages, ReplyOptions(max_tokens=96, **options))
    text, calls = [], []
    while not r.done:
        for e in engine.step(wait_s=0.01):
            if e.reply is r:
                text.append(e.text)
                calls += e.tool_calls
    assert r.error is None, r.error
    return "".join(text), calls, r.stats


@pytest.mark.slow
@pytest.mark.timeout(scaled(300))
def test_the_bundled_model_makes_valid_calls_when_a_call_is_required(engine):
    messages = CONVERSATION[:2]
    for seed in range(3):  # sampled at temperature 0.7: every draw is a valid call
        text, calls, stats = reply(engine, f"s{seed}", messages, tools=(WEATHER, TIME), tool_choice="required",
                                   seed=seed)
        assert text == "" and len(calls) == 1 and stats.finish_reason == "stop"
        tool = {"get_weather": WEATHER, "get_time": TIME}[calls[0].name]
        jsonschema.validate(json.loads(calls[0].arguments), tool["function"]["parameters"])
    text, calls, _ = reply(engine, "named", messages, tools=(WEATHER, TIME), seed=1,
                           tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert [c.name for c in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0].arguments), PARAMS)
    assert calls[0].index == 0 and calls[0].call_id.startswith("call_")
    # The result goes back; the answer is text (auto: the model decides; this one answers).
    answer = [*messages, {"role": "assistant", "content": "", "tool_calls": [
        {"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": '{"sky": "sunny"}'}]
    text, calls, stats = reply(engine, "named", answer, tools=(WEATHER, TIME), tool_choice="none", seed=1)
    assert text.strip() and calls == [] and stats.cached_tokens > 0  # the call turn's tokens were reused
