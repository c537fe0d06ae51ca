"""What a batched chat reply is made of: engine settings, per-reply options, the handle, its events and stats."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ChatOptions:
    """The engine's fixed settings (from ``[llm]``)."""

    n_ctx: int = 2048  # tokens per conversation
    max_sequences: int = 8
    batch_tokens: int = 32
    n_threads: int = 0
    prefill_threads: int = 0  # threads of a prompt step on idle cores; <= n_threads: n_threads
    n_gpu_layers: int = 0
    seed: int | None = None
    temperature: float = 0.2
    max_tokens: int = 160
    system_prompt: str | None = None
    memory_budget_mb: int = 0  # weights + KV cache, MiB; 0: no limit


@dataclass(frozen=True)
class ReplyOptions:
    """Per-reply settings; None takes the engine's."""

    max_tokens: int | None = None
    temperature: float | None = None
    seed: int | None = None
    #: Lower goes first when prompt chunks compete for a step (pipeline.workers priorities).
    priority: int = 1
    #: Set from any thread to cancel (checked at every step), like ``cancel(reply)``.
    cancel: threading.Event | None = None
    #: Function tools the model may call, in the Chat Completions shape
    #: (``{"type": "function", "function": {"name", "description", "parameters"}}``); empty: none.
    tools: tuple[dict, ...] = ()
    #: ``"auto"`` | ``"none"`` | ``"required"`` | ``{"type": "function", "function": {"name": ...}}``
    #: (Chat Completions shape); None: ``"auto"`` when there are tools.
    tool_choice: str | dict | None = None


@dataclass(frozen=True)
class GenerationStats:
    """Figures of one reply (times in seconds from ``submit``)."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the conversation's sequence
    completion_tokens: int
    dropped_messages: int  # oldest messages left out to fit n_ctx
    first_token_s: float | None  # None when nothing was generated
    total_s: float
    finish_reason: str  # "stop" | "length" | "cancelled" | "error" | "prefilled" (``BatchedChat.prefill``)
    first_batch: int = 0  # conversations in the llama_decode step that gave its first token
    #: False: the token counts are not the model's (an LLM server that reported no usage; then
    #: ``completion_tokens`` counts the streamed pieces and ``prompt_tokens`` is 0).
    usage_reported: bool = True


@dataclass(eq=False)
class Reply:
    """Handle of one submitted reply. ``stats`` is set when it is finished."""

    id: int
    session: Hashable
    messages: Sequence[dict]
    options: ReplyOptions
    #: The caller's own data (e.g. where to deliver events); the engine does not touch it.
    tag: object = None
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: bool = False
    stats: GenerationStats | None = None
    error: BaseException | None = None
    # Engine-thread state.
    _slot: Any = None  # the engine's sequence slot (llm.batched._Slot)
    _pending: list[int] = field(default_factory=list)  # prompt tokens not evaluated yet
    _next: int | None = None  # sampled token to feed at the next step
    _sampler: object = None
    _utf8: object = None
    _prompt_tokens: int = 0
    _cached: int = 0
    _dropped: int = 0
    _completion: int = 0
    _first_token_s: float | None = None
    _first_batch: int = 0
    _limit: int = 0
    _calls: object = None  # the reply's function-call parser (llm.tool_format.CallParser), with tools
    _call_index: int = 0  # calls found so far
    _probes: list = field(default_factory=list)  # (position, llm.batched.Probe) read from this prompt's logits

    @property
    def done(self) -> bool:
        return self.stats is not None


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a function call in a reply, as every LLM backend streams it.

    The first delta of a call carries its ``call_id`` and ``name``; later ones of the same
    ``index`` only add to ``arguments`` (JSON text, concatenated in order). A call is complete
    when a delta of a higher index or the reply's end arrives.
    """

    index: int  # order of the call in the reply, from 0
    arguments: str = ""
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class ReplyEvent:
    """Output of a step for one reply: a text delta (maybe empty), tool-call pieces and, at the end, its stats."""

    reply: Reply
    text: str
    stats: GenerationStats | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()
