"""Objects nested inside Realtime events: conversation items, content parts, responses.

Items are ``message`` s here and the two function-call items of realtime/tools.py (``Item``).
Text content only on the way in:
``input_text`` for user/system messages, ``output_text`` for assistant messages; the
server also sends ``input_audio`` (user speech, with its transcript) and ``output_audio``
(assistant speech, with its transcript) parts. Audio bytes are never embedded in items.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from realtime.session_schema import AudioOutput
from realtime.tools import FunctionCallItem, FunctionCallOutputItem, FunctionTool, ToolChoice, check_tools
from realtime.wire import WireObject, check, nullable

Role = Literal["user", "assistant", "system"]
ItemStatus = Literal["completed", "incomplete", "in_progress"]
ContentType = Literal["input_text", "input_audio", "output_text", "output_audio", "text", "audio"]
ResponseStatus = Literal["completed", "cancelled", "failed", "incomplete", "in_progress"]
#: Content types a client may put in ``conversation.item.create``, by role.
CLIENT_CONTENT_TYPES: Mapping[str, frozenset[str]] = {
    "user": frozenset({"input_text"}),
    "system": frozenset({"input_text"}),
    "assistant": frozenset({"output_text"}),
}


@dataclass(frozen=True, kw_only=True)
class ContentPart(WireObject):
    """One part of a message: text (``text``) or speech (``transcript``).

    In ``response.content_part.*`` events the type is ``"audio"`` or ``"text"`` (the
    GA API's part types); inside items it is ``input_*`` / ``output_*``.
    """

    type: ContentType
    text: str | None = None
    transcript: str | None = None

    @property
    def content_text(self) -> str:
        """The words of this part: its text, else its transcript, else ''."""
        return self.text if self.text is not None else (self.transcript or "")


@dataclass(frozen=True, kw_only=True)
class MessageItem(WireObject):
    """A conversation message (``{"type": "message", "role": …, "content": […]}``)."""

    type: Literal["message"] = "message"
    role: Role
    content: tuple[ContentPart, ...] = ()
    #: Server-assigned ``item_…`` id; a client may propose its own in ``conversation.item.create``.
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: ItemStatus | None = None

    @property
    def text(self) -> str:
        """All parts' words joined (what the LLM sees for this message)."""
        return "".join(part.content_text for part in self.content)


#: Any conversation item (decoded by its ``type``).
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


@dataclass(frozen=True, kw_only=True)
class ErrorInfo(WireObject):
    """Error details inside ``response.status_details`` and transcription failures."""

    type: str
    code: str | None = None
    message: str | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseStatusDetails(WireObject):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    #: Why a response was cancelled or is incomplete.
    reason: Literal["turn_detected", "client_cancelled", "max_output_tokens", "content_filter"] | None = None
    error: ErrorInfo | None = None


@dataclass(frozen=True, kw_only=True)
class ResponseUsage(WireObject):
    """Token counts of one response (LLM tokens)."""

    total_tokens: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


@dataclass(frozen=True, kw_only=True)
class ResponseAudio(WireObject):
    output: AudioOutput = field(default_factory=AudioOutput)


@dataclass(frozen=True, kw_only=True)
class ResponseObject(WireObject):
    """The ``response`` of ``response.created`` (status in_progress) and ``response.done``."""

    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: ResponseStatus = "in_progress"
    status_details: ResponseStatusDetails | None = nullable()
    output: tuple[Item, ...] = ()
    conversation_id: str | None = None
    output_modalities: tuple[Literal["audio", "text"], ...] = ("audio",)
    audio: ResponseAudio | None = None
    max_output_tokens: int | Literal["inf"] = "inf"
    usage: ResponseUsage | None = None
    metadata: dict[str, str] | None = nullable()


@dataclass(frozen=True, kw_only=True)
class InputItem(WireObject):
    """An item of ``response.create``'s ``input``: a message (as in ``conversation.item.create``) or
    ``{"type": "item_reference", "id": "item_…"}``, an item of the conversation."""

    type: Literal["message", "item_reference"]
    id: str | None = None
    role: Role | None = None
    content: tuple[ContentPart, ...] = ()

    def __post_init__(self) -> None:
        if self.type == "item_reference":
            check(bool(self.id), "id", "is required for an item_reference")
            return
        check(self.role is not None, "role", "is required for a message")
        allowed = CLIENT_CONTENT_TYPES.get(self.role or "user", frozenset())
        for i, part in enumerate(self.content):
            check(part.type in allowed, f"content[{i}].type",
                  f"{self.role} messages accept {', '.join(sorted(allowed))}, not {part.type!r}")
            check(part.text is not None, f"content[{i}].text", "is required")


@dataclass(frozen=True, kw_only=True)
class ResponseOptions(WireObject):
    """The optional ``response`` of ``response.create``: per-response overrides.

    ``conversation: "none"`` makes an out-of-band response (not added to history); ``input``
    replaces the conversation as what the model reads for this response (``[]``: nothing but
    the instructions). ``tools`` / ``tool_choice`` replace the session's for this response. Other
    GA keys (audio, prompt…) are ignored.
    """

    instructions: str | None = None
    output_modalities: tuple[Literal["audio", "text"], ...] | None = None
    conversation: Literal["auto", "none"] | None = None
    input: tuple[InputItem, ...] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    metadata: dict[str, str] | None = None
    tools: tuple[FunctionTool, ...] | None = None
    tool_choice: ToolChoice | None = None

    def __post_init__(self) -> None:
        if self.tools is not None:
            check_tools(self.tools, self.tool_choice)
        modalities = self.output_modalities
        check(modalities is None or len(modalities) == 1, "output_modalities", 'must be ["audio"] or ["text"]')
        tokens = self.max_output_tokens
        check(tokens in (None, "inf") or 1 <= tokens <= 4096, "max_output_tokens", 'must be 1–4096 or "inf"')
        check(self.metadata is None or len(self.metadata) <= 16, "metadata", "at most 16 keys")
