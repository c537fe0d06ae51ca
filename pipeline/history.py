"""Conversation history of one session, bounded to fit the LLM's context window."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.tool_calls import chat_messages


@dataclass
class Message:
    role: str  # "system" | "user" | "assistant" | "function_call" | "function_call_output"
    content: str  # a function call's arguments (JSON text), a call output's text
    item_id: str
    call_id: str | None = None  # function calls and their outputs
    name: str | None = None  # function calls: the function
    #: A message item's content type: ``input_text`` | ``input_audio`` (with its transcript) |
    #: ``output_text`` | ``output_audio`` (with its transcript).
    content_type: str = "input_text"


class History:
    """Messages in order; when the total exceeds ``max_chars`` the oldest are dropped down to half.

    ``max_chars`` approximates the token budget (about 3-4 characters per token for
    English), leaving room for the reply. Dropping down to half at once, rather than one
    message per turn, keeps the start of the prompt the same over the following turns, so
    the LLM's cached KV of the conversation stays valid and a turn evaluates only the new
    messages (one message dropped per turn would change the prefix at every turn and
    re-read the whole history each time). Items are found by their id (``truncate``,
    ``remove``, ``find``), so items inserted after a given one (``previous_item_id``) or deleted
    move nothing else.
    """

    def __init__(self, max_chars: int) -> None:
        self.max_chars = max(1000, max_chars)
        self._messages: list[Message] = []
        self._dropped = 0  # messages dropped from the front so far

    def __len__(self) -> int:
        return len(self._messages)

    def add(self, role: str, content: str, item_id: str, call_id: str | None = None, name: str | None = None,
            *, content_type: str = "input_text", after: str | None = None) -> int:
        """Append a message (or insert it after item ``after``; ``"root"``: first); its index."""
        message = Message(role, content, item_id, call_id, name, content_type)
        if after is None:
            self._messages.append(message)
            position = len(self._messages) - 1
        else:
            position = 0 if after == "root" else self._position(after) + 1
            self._messages.insert(position, message)
        index = self._dropped + position
        if self._chars() > self.max_chars:
            while len(self._messages) > 1 and self._chars() > self.max_chars // 2:
                self._messages.pop(0)
                self._dropped += 1
        return index

    @property
    def dropped(self) -> int:
        """Messages dropped from the front so far (a change: the history was cut)."""
        return self._dropped

    def _chars(self) -> int:
        return sum(len(m.content) for m in self._messages)

    def last_item_id(self) -> str | None:
        return self._messages[-1].item_id if self._messages else None

    def has_item(self, item_id: str) -> bool:
        return any(m.item_id == item_id for m in self._messages)

    def has(self, role: str, call_id: str) -> bool:
        """True when a ``function_call`` (or ``function_call_output``) of ``call_id`` is in the history."""
        return any(m.role == role and m.call_id == call_id for m in self._messages)

    def find(self, item_id: str) -> Message | None:
        """The message of item ``item_id``, if the history still holds it."""
        for m in self._messages:
            if m.item_id == item_id:
                return m
        return None

    def _position(self, item_id: str) -> int:
        return next((i for i, m in enumerate(self._messages) if m.item_id == item_id), -1)

    def truncate(self, index: int, item_id: str, content: str) -> None:
        """Replace item ``item_id``'s text (message ``index`` when added) by what was heard."""
        i = self._position(item_id)
        if i >= 0:
            if content:
                self._messages[i].content = content
            else:  # nothing was heard: the reply leaves history
                del self._messages[i]

    def remove(self, item_id: str) -> bool:
        """Drop the message of ``item_id``; False if it is not in the history."""
        i = self._position(item_id)
        if i < 0:
            return False
        del self._messages[i]
        return True

    def messages(self, system: str, pending_user: str | None = None) -> list[dict]:
        """Chat messages for the LLM: system prompt, history (function calls as ``tool_calls``, each followed
        by its output: ``pipeline.tool_calls.chat_messages``), and an optional not-yet-committed user turn."""
        out = [{"role": "system", "content": system}]
        out += chat_messages(self._messages)
        if pending_user is not None:
            out.append({"role": "user", "content": pending_user})
        return out

    def snapshot(self) -> list[Message]:
        return list(self._messages)
