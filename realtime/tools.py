"""Function calling in the Realtime protocol: function tools, tool choice and the two call items.

``session.tools`` / ``response.tools`` hold :class:`FunctionTool` s (GA shape: ``type``,
``name``, ``description``, JSON-schema ``parameters``); ``tool_choice`` is ``"auto"``,
``"none"``, ``"required"`` or a :class:`ToolChoiceFunction`. A reply that calls a function
produces a :class:`FunctionCallItem`; the client answers with a :class:`FunctionCallOutputItem`
(``conversation.item.create``). ``chat_tools`` gives the Chat Completions shape every LLM
backend takes. No I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from realtime.wire import ErrorCode, ProtocolError, WireObject, check

#: Function names the OpenAI APIs accept (and chat templates can print unquoted).
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Most tools in one session or response (a prompt of more tool descriptions fills the context).
MAX_TOOLS = 32
ToolChoiceMode = Literal["auto", "none", "required"]


def _empty_object() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


@dataclass(frozen=True, kw_only=True)
class FunctionTool(WireObject):
    """A function the model may call; ``parameters`` is the JSON Schema of its arguments (an object)."""

    type: str = "function"
    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=_empty_object)

    def __post_init__(self) -> None:
        check(self.type == "function", "type", f"only function tools are supported, got {self.type!r}")
        check(bool(NAME_PATTERN.match(self.name)), "name", "must be 1-64 letters, digits, '_' or '-'")
        check_parameters(self.parameters)


def check_parameters(schema: dict[str, Any]) -> None:
    """Raise ``invalid_value`` (param ``parameters…``) unless ``schema`` is a valid JSON Schema of an object."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"parameters{where}: not a valid JSON Schema: {exc.message}",
                            param=f"parameters{where}") from None
    check(schema.get("type", "object") == "object", "parameters.type",
          "the arguments of a function are a JSON object: use \"type\": \"object\"")


@dataclass(frozen=True, kw_only=True)
class ToolChoiceFunction(WireObject):
    """``tool_choice`` naming the one function the reply must call."""

    type: str = "function"
    name: str

    def __post_init__(self) -> None:
        check(self.type == "function", "type", f"only function tool choices are supported, got {self.type!r}")


ToolChoice = ToolChoiceMode | ToolChoiceFunction


def check_tools(tools: Sequence[FunctionTool], choice: ToolChoice | None, where: str = "") -> None:
    """Raise ``invalid_value`` for duplicate names, too many tools or a ``tool_choice`` naming no tool."""
    prefix = f"{where}." if where else ""
    check(len(tools) <= MAX_TOOLS, f"{prefix}tools", f"at most {MAX_TOOLS} tools")
    names = [t.name for t in tools]
    for i, name in enumerate(names):
        check(name not in names[:i], f"{prefix}tools[{i}].name", f"two tools are named {name!r}")
    if isinstance(choice, ToolChoiceFunction):
        check(choice.name in names, f"{prefix}tool_choice.name", f"no tool is named {choice.name!r}")
    elif choice == "required":
        check(bool(names), f"{prefix}tool_choice", '"required" needs at least one tool')


@dataclass(frozen=True, kw_only=True)
class FunctionCallItem(WireObject):
    """A call the model made: ``arguments`` is JSON text; the client runs it and answers ``call_id``."""

    type: Literal["function_call"] = "function_call"
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str
    name: str
    arguments: str = ""

    def __post_init__(self) -> None:
        check(bool(self.call_id), "call_id", "must not be empty")
        check(bool(NAME_PATTERN.match(self.name)), "name", "must be 1-64 letters, digits, '_' or '-'")


@dataclass(frozen=True, kw_only=True)
class FunctionCallOutputItem(WireObject):
    """The client's result of the call ``call_id`` (free text, usually JSON)."""

    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None
    call_id: str
    output: str

    def __post_init__(self) -> None:
        check(bool(self.call_id), "call_id", "must not be empty")


def chat_tools(tools: Sequence[FunctionTool]) -> tuple[dict, ...]:
    """``tools`` in the Chat Completions shape (``{"type": "function", "function": {…}}``)."""
    out = []
    for t in tools:
        function: dict[str, Any] = {"name": t.name, "parameters": t.parameters}
        if t.description:
            function["description"] = t.description
        out.append({"type": "function", "function": function})
    return tuple(out)


def chat_tool_choice(choice: ToolChoice | None) -> str | dict | None:
    """``tool_choice`` in the Chat Completions shape."""
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice
