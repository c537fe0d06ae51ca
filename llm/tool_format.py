"""Function calls in a GGUF's own format: tools into the prompt, calls out of the model's text.

A chat template shows tools and calls in its family's way, and the model writes calls that way:

=========  ==========================================  ==============================================
family     the model writes                             recognised by (in the template's source)
=========  ==========================================  ==============================================
hermes     ``<tool_call>{"name", "arguments"}</tool_call>``   ``<tool_call>`` (Qwen 2.5/3, Hermes 2 Pro/3)
llama3     ``{"name", "parameters"}`` as the whole reply        ``<|python_tag|>`` (Llama 3.1-3.3)
mistral    ``[TOOL_CALLS][{"name", "arguments"}, …]``           ``[TOOL_CALLS]`` (Mistral Nemo, Small)
prompted   ``<tool_call>…</tool_call>`` as hermes               any other template (no tool support)
=========  ==========================================  ==============================================

``ToolFormat.for_template(source)`` picks the family; ``messages(messages, tools)`` prepares Chat
Completions messages (``tool_calls``, ``tool`` results) for the template (``prompted``: tools in
the system message, calls and results as text); ``parser()`` reads a reply as it streams
(``CallParser.feed`` → text to say, complete calls); ``grammar(tools, choice)`` is a GBNF grammar
that makes the reply exactly one call of the chosen tools with arguments valid against their JSON
Schema (``tool_choice`` ``required`` or a named function).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

from base.errors import InvalidInput

#: Rule of the grammar that starts a call (``llama_sampler_init_grammar``'s root).
GRAMMAR_ROOT = "tool-call"
PROMPTED_SYSTEM = (
    "You can call functions. Their signatures are within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n"
    "To call one, reply with a JSON object with the function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>')
#: A result as the ``prompted`` family shows it (a user turn). The bundled SmolLM2 answered a weather
#: result in words 3 times of 3 with this wording (``auto``, seeds 0-2), 1 of 3 with the result inside
#: ``<tool_response>`` tags: it echoed the tags and the JSON, which would then be spoken.
PROMPTED_RESULT = "The result of {name} is {content}. Please answer my question using it, in plain words."


@dataclass(frozen=True)
class ToolFormat:
    """How one chat template family shows tools and calls (module doc)."""

    family: str  # "hermes" | "llama3" | "mistral" | "prompted"

    @classmethod
    def for_template(cls, source: str) -> ToolFormat:
        if "[TOOL_CALLS]" in source:
            return cls("mistral")
        if "<|python_tag|>" in source:
            return cls("llama3")
        if "<tool_call>" in source:
            return cls("hermes")
        return cls("prompted")

    @property
    def arguments_key(self) -> str:
        return "parameters" if self.family == "llama3" else "arguments"

    # ------------------------------------------------------------------ into the prompt
    def messages(self, messages: Sequence[dict], tools: Sequence[dict]) -> tuple[list[dict], list[dict] | None]:
        """``(messages, tools)`` to render with the template (``tools`` None: the template gets none)."""
        if self.family == "prompted":
            return self._prompted(messages, tools), None
        out = []
        for m in messages:
            m = dict(m)
            if m["role"] == "tool" and self.family == "mistral":
                m["tool_call_id"] = mistral_id(m["tool_call_id"])
            if not m.get("tool_calls"):
                if self.family == "mistral" and m["role"] == "user" and out and out[-1]["role"] == "tool":
                    out.append({"role": "assistant", "content": ""})  # its template wants turns to alternate
                out.append(m)
                continue
            calls = [self._call_for_template(c) for c in m["tool_calls"]]
            if self.family == "llama3":  # its templates take one call per message
                out += [{"role": "assistant", "content": "", "tool_calls": [c]} for c in calls]
            else:
                out.append({**m, "content": m.get("content") or "", "tool_calls": calls})
        return out, (list(tools) or None)

    def _call_for_template(self, call: dict) -> dict:
        """Templates print arguments with ``tojson``: they take an object (a string would be quoted)."""
        function = dict(call["function"])
        try:
            function["arguments"] = json.loads(function["arguments"])
        except (TypeError, ValueError):
            pass
        call_id = mistral_id(call["id"]) if self.family == "mistral" else call["id"]
        return {"id": call_id, "type": "function", "function": function, **function}

    def _prompted(self, messages: Sequence[dict], tools: Sequence[dict]) -> list[dict]:
        out: list[dict] = []
        names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
        for m in messages:
            if m["role"] == "tool":
                name = names.get(m["tool_call_id"], "the function")
                out.append({"role": "user", "content": PROMPTED_RESULT.format(name=name, content=m["content"])})
            elif m.get("tool_calls"):
                calls = "\n".join(f"<tool_call>\n{json.dumps(call_json(c, 'arguments'), ensure_ascii=False)}\n"
                                  "</tool_call>" for c in m["tool_calls"])
                text = m.get("content") or ""
                out.append({"role": "assistant", "content": f"{text}\n{calls}".strip()})
            else:
                out.append({"role": m["role"], "content": m.get("content") or ""})
        if tools:
            block = PROMPTED_SYSTEM.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}"}
            else:
                out.insert(0, {"role": "system", "content": block})
        return out

    # ------------------------------------------------------------------ out of the reply
    def parser(self) -> CallParser:
        if self.family == "mistral":
            return CallParser(("[TOOL_CALLS]",), None, "arguments")
        if self.family == "llama3":
            return CallParser(("<|python_tag|>", "{"), None, "parameters", at_start=True)
        return CallParser(("<tool_call>",), "</tool_call>", "arguments")

    def grammar(self, tools: Sequence[dict], choice: str | dict | None) -> str:
        """GBNF of exactly one call (rule ``GRAMMAR_ROOT``) of the tool ``choice`` names, or of any tool."""
        from llama_cpp.llama_grammar import json_schema_to_gbnf

        if isinstance(choice, dict):
            name = choice.get("function", {}).get("name")
            tools = [t for t in tools if t["function"]["name"] == name]
        key = self.arguments_key
        calls = [{"type": "object", "properties": {
                    "name": {"const": t["function"]["name"]},
                    key: closed(t["function"].get("parameters") or {})},
                  "required": ["name", key]} for t in tools]
        schema = calls[0] if len(calls) == 1 else {"anyOf": calls}
        try:
            body = json_schema_to_gbnf(json.dumps(schema))
        except Exception as exc:  # noqa: BLE001 - the converter raises what it likes on schemas it cannot do
            raise InvalidInput(f"tools: cannot build a grammar from the functions' parameters: {exc}") from exc
        prefix, suffix = {"mistral": ('"[TOOL_CALLS]["', '"]"'), "llama3": ('""', '""')}.get(
            self.family, (r'"<tool_call>\n"', r'"\n</tool_call>"'))
        return f"{body}\n{GRAMMAR_ROOT} ::= {prefix} root {suffix}\n"


def closed(parameters: dict) -> dict:
    """The arguments' schema for the grammar: only the declared parameters (``additionalProperties``
    false unless the schema says otherwise), so a small model cannot fill a call with keys of its own."""
    return {"type": "object", "properties": {}, **parameters,
            "additionalProperties": parameters.get("additionalProperties", False)}


def mistral_id(call_id: str) -> str:
    """Mistral templates take only 9-character alphanumeric call ids: one derived from ``call_id``."""
    if len(call_id) == 9 and call_id.isalnum():
        return call_id
    return hashlib.sha1(call_id.encode()).hexdigest()[:9]


def call_json(call: dict, key: str) -> dict:
    """``{"name", key: arguments}`` of a Chat Completions tool call (arguments as an object when JSON)."""
    args = call["function"]["arguments"]
    try:
        args = json.loads(args)
    except (TypeError, ValueError):
        pass
    return {"name": call["function"]["name"], key: args}


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text
    call_id: str = field(default_factory=lambda: "call_" + secrets.token_hex(8))


class CallParser:
    """Splits a streaming reply into text to say and function calls (``ToolFormat.parser``).

    Text before the first call marker passes through (a piece that may begin a marker is held back
    until the next one tells; ``at_start``: only a reply that opens with the marker is calls); from
    the marker on, the reply is calls: each ``end`` closes one, or the reply's end closes them all
    (``end`` None). Text after the calls is dropped, and so is call markup that holds no complete
    call (cut by the token limit: the response ends ``incomplete``): markup is never said.
    """

    def __init__(self, starts: tuple[str, ...], end: str | None, key: str, at_start: bool = False) -> None:
        self._starts, self._end, self._key, self._at_start = starts, end, key, at_start
        self._held = ""  # text that may begin a marker
        self._body: str | None = None  # inside calls: what came since the first marker
        self._said = False  # text was passed on (``at_start``: no call can follow)
        self._ended = 0  # calls closed by ``end``

    def feed(self, piece: str) -> tuple[str, list[ParsedCall]]:
        """Text to pass on now and calls completed by ``piece``."""
        if self._body is not None:
            self._body += piece
            return "", self._closed()
        text, self._held = self._held + piece, ""
        if self._at_start:
            return self._feed_start(text)
        hits = [(text.find(s), s) for s in self._starts if s in text]
        if hits:
            at, start = min(hits)
            self._body = text[at + len(start):]
            return text[:at], self._closed()
        keep = max((n for s in self._starts for n in range(1, len(s)) if text.endswith(s[:n])), default=0)
        self._held = text[len(text) - keep:]
        return text[:len(text) - keep], []

    def _feed_start(self, text: str) -> tuple[str, list[ParsedCall]]:
        if self._said:
            return text, []
        stripped = text.lstrip()
        for start in self._starts:
            if stripped.startswith(start):
                self._body = stripped if start == "{" else stripped[len(start):]
                return "", []
            if start.startswith(stripped):  # empty, or the beginning of a marker
                self._held = text
                return "", []
        self._said = True
        return text, []

    def _closed(self) -> list[ParsedCall]:
        calls: list[ParsedCall] = []
        while self._end is not None and (at := self._body.find(self._end)) >= 0:
            chunk, self._body = self._body[:at], self._body[at + len(self._end):]
            if self._ended:  # later calls: after their own marker
                chunk = next((chunk.split(s, 1)[1] for s in self._starts if s in chunk), "")
            self._ended += 1
            calls += self._decode(chunk)
        return calls

    def flush(self) -> tuple[str, list[ParsedCall]]:
        """At the reply's end: held text, and the calls still open."""
        if self._body is None:
            text, self._held = self._held, ""
            return text, []
        body, self._body = self._body, ""
        if self._ended:
            body = next((body.split(s, 1)[1] for s in self._starts if s in body), "")
        return "", self._decode(body) if body.strip() else []

    def _decode(self, body: str) -> list[ParsedCall]:
        """Calls in ``body``: one JSON object, a JSON array of them, or objects separated by ``;``."""
        decoder, rest, values = json.JSONDecoder(), body.strip(), []
        while rest:
            try:
                value, n = decoder.raw_decode(rest)
            except ValueError:
                return []
            values += value if isinstance(value, list) else [value]
            rest = rest[n:].lstrip().lstrip(";").lstrip()
        calls = []
        for v in values:
            if not isinstance(v, dict) or not isinstance(v.get("name"), str):
                return []
            args = v.get(self._key, v.get("arguments", v.get("parameters", {})))
            calls.append(ParsedCall(v["name"], args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)))
        return calls
