"""Function calls of a reply and of the history (docs/protocol.md, "Function calling").

``ReplyCalls`` turns the LLM's ``ToolCallDelta`` s of one reply into Realtime events: each call
is an output item (``response.output_item.added``, ``response.function_call_arguments.delta`` /
``.done``, ``response.output_item.done``) that the client runs and answers with a
``function_call_output`` item. ``chat_messages`` renders the history, calls and their outputs
included, as the Chat Completions messages every LLM backend takes: each call is followed by its
output wherever that arrived, or by ``NO_RESULT`` while it has none.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from realtime import events as ev
from realtime.tools import FunctionCallItem, ToolChoiceFunction, chat_tool_choice, chat_tools
from realtime.wire import ErrorCode, new_id
from base.errors import ProtocolError

#: What the LLM reads as the result of a call the client has not answered (yet).
NO_RESULT = "(no result: the call was not answered)"


@dataclass
class Call:
    """One function call of a reply as it streams."""

    call_id: str
    name: str
    item_id: str
    output_index: int
    arguments: str = ""
    done: bool = False  # arguments complete: the client may run it
    closed: bool = False  # its item is done (completed or incomplete)

    def item(self, status: str) -> FunctionCallItem:
        return FunctionCallItem(id=self.item_id, object="realtime.item", status=status,  # type: ignore[arg-type]
                                call_id=self.call_id, name=self.name, arguments=self.arguments)


@dataclass
class ReplyCalls:
    """The function calls of one response, by the LLM's call index."""

    response_id: str
    calls: dict[int, Call] = field(default_factory=dict)

    @property
    def done(self) -> list[Call]:
        """Calls whose arguments are complete, in order."""
        return [c for c in self.calls.values() if c.done]

    def find(self, call_id: str) -> Call | None:
        return next((c for c in self.calls.values() if c.call_id == call_id), None)

    def feed(self, delta: Any, output_index: int) -> list[Any]:
        """Events for one ``ToolCallDelta``: a new index ends the calls before it and opens its item
        at ``output_index``; later pieces add to its arguments."""
        out: list[Any] = []
        call = self.calls.get(delta.index)
        if call is None:
            out += self.finish()
            call = Call(call_id=delta.call_id or new_id("call"), name=delta.name or "", item_id=new_id("item"),
                        output_index=output_index)
            self.calls[delta.index] = call
            item = call.item("in_progress")
            out += [ev.ResponseOutputItemAdded(response_id=self.response_id, output_index=output_index, item=item),
                    ev.ConversationItemAdded(item=item)]
        if delta.arguments:
            call.arguments += delta.arguments
            out.append(ev.ResponseFunctionCallArgumentsDelta(
                response_id=self.response_id, item_id=call.item_id, output_index=call.output_index,
                call_id=call.call_id, delta=delta.arguments))
        return out

    def finish(self, status: str = "completed") -> list[Any]:
        """Close every open call: ``completed``; when the response was cut (``incomplete``), a call whose
        arguments are not a whole JSON value yet ends ``incomplete`` (not run: it stays out of the
        history) and one whose arguments are whole ends ``completed``."""
        out: list[Any] = []
        for call in self.calls.values():
            if call.closed:
                continue
            call.done, call.closed = status == "completed" or _whole_json(call.arguments), True
            item = call.item("completed" if call.done else "incomplete")
            out += [ev.ResponseFunctionCallArgumentsDone(
                        response_id=self.response_id, item_id=call.item_id, output_index=call.output_index,
                        call_id=call.call_id, name=call.name, arguments=call.arguments),
                    ev.ResponseOutputItemDone(response_id=self.response_id, output_index=call.output_index, item=item),
                    ev.ConversationItemDone(item=item)]
        return out

    def items(self) -> tuple[FunctionCallItem, ...]:
        """The final call items (``response.done``'s output after the message)."""
        return tuple(c.item("completed" if c.done else "incomplete") for c in self.calls.values())


def _whole_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class ToolRequest:
    """The tools of one reply in the Chat Completions shape the LLM backends take."""

    tools: tuple[dict, ...] = ()
    tool_choice: str | dict | None = None


def tool_request(session: Any, opts: Any = None) -> ToolRequest:
    """The tools of a reply: ``response.create``'s (``opts``) when given, else the session's.

    Raises ``invalid_value`` when a ``tool_choice`` names a function that is not among them.
    """
    tools = session.tools if opts is None or opts.tools is None else opts.tools
    choice = session.tool_choice if opts is None or opts.tool_choice is None else opts.tool_choice
    if isinstance(choice, ToolChoiceFunction) and choice.name not in {t.name for t in tools}:
        raise ProtocolError(ErrorCode.INVALID_VALUE, f"response.tool_choice.name: no tool is named {choice.name!r}",
                            param="response.tool_choice.name")
    if choice == "required" and not tools:
        raise ProtocolError(ErrorCode.INVALID_VALUE, 'response.tool_choice: "required" needs at least one tool',
                            param="response.tool_choice")
    if not tools or choice == "none":
        return ToolRequest()
    return ToolRequest(chat_tools(tools), chat_tool_choice(choice))


def chat_messages(history: Sequence[Any]) -> list[dict]:
    """History entries (``pipeline.history.Message``) as Chat Completions messages (module doc).

    Calls that follow an assistant message (or each other) join it as its ``tool_calls``; an output
    whose call left the history (cut) is left out too.
    """
    outputs = {m.call_id: m.content for m in history if m.role == "function_call_output"}
    out: list[dict] = []
    pending: list[str] = []  # call ids of the assistant message being built

    def close_calls() -> None:
        for call_id in pending:
            out.append({"role": "tool", "tool_call_id": call_id, "content": outputs.get(call_id, NO_RESULT)})
        pending.clear()

    for m in history:
        if m.role == "function_call":
            call = {"id": m.call_id, "type": "function", "function": {"name": m.name, "arguments": m.content}}
            if not pending and not (out and out[-1]["role"] == "assistant" and "tool_calls" not in out[-1]):
                out.append({"role": "assistant", "content": ""})
            out[-1].setdefault("tool_calls", []).append(call)
            pending.append(m.call_id)
            continue
        if m.role == "function_call_output":
            continue  # rendered after its call
        close_calls()
        if m.content:
            out.append({"role": m.role, "content": m.content})
    close_calls()
    return out

