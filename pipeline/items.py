"""The conversation's items as a client edits them: create (after a given item), delete, retrieve.

The items are the LLM's history (``pipeline/history.py``): what the model reads next turn is what
these events leave there. A user speech item holds its transcript, an assistant speech item what
the user heard of it; audio itself is not kept, so a retrieved speech item has its transcript only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from pipeline.history import History, Message
from realtime import events as ev
from realtime.items import ContentPart, MessageItem
from realtime.tools import FunctionCallItem, FunctionCallOutputItem
from realtime.wire import ErrorCode, new_id
from base.errors import InvalidInput

#: ``previous_item_id`` that puts an item first.
ROOT = "root"


def message_item(message: Message) -> Any:
    """The wire item of a history entry: a message (text parts carry ``text``, speech parts
    ``transcript``), a function call or a call's output."""
    common = {"id": message.item_id, "status": "completed", "object": "realtime.item"}
    if message.role == "function_call":
        return FunctionCallItem(call_id=message.call_id or "", name=message.name or "", arguments=message.content,
                                **common)
    if message.role == "function_call_output":
        return FunctionCallOutputItem(call_id=message.call_id or "", output=message.content, **common)
    kind = message.content_type
    part = (ContentPart(type=kind, transcript=message.content) if kind.endswith("audio")  # type: ignore[arg-type]
            else ContentPart(type=kind, text=message.content))  # type: ignore[arg-type]
    return MessageItem(id=message.item_id, role=message.role, status="completed",  # type: ignore[arg-type]
                       object="realtime.item", content=(part,))


class ConversationItems:
    """``conversation.item.create`` / ``.delete`` / ``.retrieve`` over one session's history."""

    def __init__(self, history: History, send: Callable[[Any], None],
                 call_items: Callable[[ev.ConversationItemCreate, str, str | None], None]) -> None:
        """``call_items(event, item_id, after)``: puts a function call or output item in the history
        (``Conversation.call_item_create``: it checks the call)."""
        self.history = history
        self._send = send
        self._call_items = call_items

    def _known(self, item_id: str, what: str) -> Message:
        message = self.history.find(item_id)
        if message is None:
            raise InvalidInput(f"{what}: no item {item_id} in the conversation", code=ErrorCode.ITEM_NOT_FOUND)
        return message

    def create(self, event: ev.ConversationItemCreate) -> None:
        """Add the item at the end, or after ``previous_item_id`` (``"root"``: first)."""
        item, after = event.item, event.previous_item_id
        if after is not None and after != ROOT:
            self._known(after, "previous_item_id")
        if item.id is not None and self.history.has_item(item.id):
            raise InvalidInput(f"item.id: the conversation already has an item {item.id}",
                               code=ErrorCode.INVALID_VALUE)
        item_id = item.id or new_id("item")
        previous = self.history.last_item_id() if after is None else (None if after == ROOT else after)
        if isinstance(item, MessageItem):
            text = " ".join(p.content_text for p in item.content).strip()
            self.history.add(item.role, text, item_id, content_type=item.content[0].type, after=after)
        else:
            self._call_items(event, item_id, after)
        done = dataclasses.replace(item, id=item_id, status="completed", object="realtime.item")
        self._send(ev.ConversationItemAdded(item=done, previous_item_id=previous))
        self._send(ev.ConversationItemDone(item=done, previous_item_id=previous))

    def delete(self, event: ev.ConversationItemDelete) -> None:
        self._known(event.item_id, "item_id")
        self.history.remove(event.item_id)
        self._send(ev.ConversationItemDeleted(item_id=event.item_id))

    def retrieve(self, event: ev.ConversationItemRetrieve) -> None:
        self._send(ev.ConversationItemRetrieved(item=message_item(self._known(event.item_id, "item_id"))))
