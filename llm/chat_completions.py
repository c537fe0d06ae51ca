"""Replies from an OpenAI-compatible ``/v1/chat/completions`` server (``llm.backend = "openai"``).

``ChatServer.stream(messages, options)`` sends a whole conversation and yields the reply as it
streams: text as ``str``, function calls as ``ToolCallDelta`` (llm/replies.py), the same shapes
the in-process engine gives; ``last_stats``-style figures come back through ``on_done``. The
translation both ways is plain code (``chat_request``, ``ChunkReader``), tested without a server;
the HTTP side is the official ``openai`` SDK (its SSE parsing, typed chunks and errors), whose
async client lets every session's reply share one connection pool without a thread each.

Failures become the project's errors with a message naming the server: cannot connect, no answer
within ``llm.read_timeout_s``, a reply that broke off, a refused key: ``ModelError``; a server
that says it is busy (429, 503): ``Overloaded`` with its ``Retry-After``.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from base.config import Config
from base.errors import ConfigError, ModelError, ModelUnavailable, Overloaded
from llm.replies import GenerationStats, ReplyOptions, ToolCallDelta

#: Longest server message quoted in an error, characters.
MAX_QUOTED = 300
#: Retry-After assumed when a busy server sends none, ms.
DEFAULT_RETRY_AFTER_MS = 2000


def chat_request(model: str, messages: Sequence[dict], options: ReplyOptions, max_tokens: int,
                 temperature: float, seed: int | None) -> dict[str, Any]:
    """Keyword arguments of ``chat.completions.create`` for one streamed reply.

    Tools go as given; ``tool_choice: "required"`` with one tool is sent as that tool named:
    the same demand, and servers that do not implement ``required`` (llama-cpp-python's)
    enforce a named function with a grammar. An assistant message that only calls functions
    gets ``content: ""`` rather than null: many GGUF chat templates concatenate the content and
    fail on null. ``stream_options.include_usage`` asks for token counts (servers that do not
    know it ignore it).
    """
    request: dict[str, Any] = {
        "model": model,
        "messages": [_sendable(m) for m in messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": options.max_tokens or max_tokens,
        "temperature": temperature if options.temperature is None else options.temperature,
    }
    seed = seed if options.seed is None else options.seed
    if seed is not None:
        request["seed"] = seed
    if options.tools:
        request["tools"] = list(options.tools)
        choice = options.tool_choice
        if choice == "required" and len(options.tools) == 1:
            choice = {"type": "function", "function": {"name": options.tools[0]["function"]["name"]}}
        if choice is not None:
            request["tool_choice"] = choice
    return request


def _sendable(message: dict) -> dict:
    if message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") is None:
        return {**message, "content": ""}
    return message


class ChunkReader:
    """Streamed ``chat.completion.chunk`` objects -> text and ``ToolCallDelta`` pieces.

    Servers differ in what they repeat: llama-cpp-python's sends the call's id and name with
    every piece, others only with the first. Here a call's first piece carries ``call_id`` and
    ``name`` and later ones only arguments, as ``ToolCallDelta`` says; a call without an id gets
    one. Reasoning text some servers stream beside the content (``reasoning_content``) is not
    part of the reply and is left out.
    """

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.pieces = 0  # content and argument pieces streamed (tokens, for servers that stream one a chunk)
        self._calls: dict[int, str] = {}  # call index -> call_id

    def feed(self, chunk: Any) -> list[str | ToolCallDelta]:
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        out: list[str | ToolCallDelta] = []
        for choice in chunk.choices or ():
            if choice.index:  # only the first choice (n = 1) is asked for
                continue
            delta = choice.delta
            if delta is not None and delta.content:
                out.append(delta.content)
            for call in (delta.tool_calls if delta is not None else None) or ():
                piece = self._call_piece(call)
                if piece is not None:
                    out.append(piece)
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        self.pieces += len(out)
        return out

    def _call_piece(self, call: Any) -> ToolCallDelta | None:
        index = call.index if call.index is not None else len(self._calls)
        function = call.function
        arguments = (function.arguments if function is not None else None) or ""
        if index in self._calls:
            return ToolCallDelta(index, arguments) if arguments else None
        call_id = call.id or "call_" + uuid.uuid4().hex[:24]
        self._calls[index] = call_id
        return ToolCallDelta(index, arguments, call_id=call_id, name=function.name if function is not None else None)

    def stats(self, total_s: float, first_token_s: float | None, cancelled: bool = False) -> GenerationStats:
        """The reply's figures: the server's token counts when it sent them, else the streamed pieces
        as completion tokens, no prompt tokens and ``usage_reported`` False (``response.done`` then
        has no ``usage``)."""
        usage = self.usage
        details = getattr(usage, "prompt_tokens_details", None)
        reason = "cancelled" if cancelled else "length" if self.finish_reason == "length" else "stop"
        return GenerationStats(
            prompt_tokens=usage.prompt_tokens if usage is not None else 0,
            cached_tokens=(getattr(details, "cached_tokens", None) or 0) if details is not None else 0,
            completion_tokens=usage.completion_tokens if usage is not None else self.pieces,
            dropped_messages=0, first_token_s=first_token_s, total_s=total_s, finish_reason=reason,
            usage_reported=usage is not None)


class ChatServer:
    """An OpenAI-compatible chat server as a reply engine (``llm.backend = "openai"``)."""

    def __init__(self, cfg: Config, environ: dict[str, str] | None = None) -> None:
        """No I/O here: the first request or ``check()`` connects. ``environ``: where the API key
        is looked up (``os.environ`` by default)."""
        import openai

        llm = cfg.llm
        if not llm.base_url:
            raise ConfigError('llm.backend = "openai" needs llm.base_url, the server\'s API root (e.g. '
                              '"http://127.0.0.1:8080/v1" for llama-server, "http://127.0.0.1:11434/v1" for Ollama)')
        self.cfg = llm
        self.base_url = llm.base_url.rstrip("/")
        self.model = llm.model
        key = (os.environ if environ is None else environ).get(llm.api_key_env, "")
        # Without a key no Authorization header is sent (the SDK insists on a key, then leaves it out).
        self._headers = {} if key else {"Authorization": openai.omit}  # each request's extra_headers
        # No retries: a voice turn waiting out the SDK's back-off (0.5-8 s) is worse than a failed
        # reply the user can repeat; a busy server's Retry-After goes to the client instead.
        self.client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=key or "none", max_retries=0,
            timeout=openai.Timeout(llm.read_timeout_s, connect=llm.connect_timeout_s))

    async def check(self) -> str:
        """The model replies will use; asks the server's ``/models`` (and picks its first model when
        ``llm.model`` is unset). Raises ``ModelError``/``Overloaded`` naming what is wrong."""
        timeout = self.cfg.connect_timeout_s
        try:
            page = await self.client.with_options(timeout=timeout).models.list(extra_headers=self._headers)
            ids = [m.id async for m in page]
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised when not the server's
            raise self.error(exc, checking=True) from exc
        if self.model is None:
            if not ids:
                raise ModelError(f"the LLM server at {self.base_url} lists no model: set llm.model")
            self.model = ids[0]
        return self.model

    async def stream(self, messages: Sequence[dict], options: ReplyOptions,
                     on_done: Callable[[GenerationStats], None] | None = None) -> AsyncIterator[str | ToolCallDelta]:
        """The reply to ``messages``: text and ``ToolCallDelta`` pieces as they arrive.

        Closing the iterator (a cancelled task) closes the HTTP stream, so the server stops
        generating. ``options.cancel``, when set, ends it at the next piece. ``on_done`` gets the
        reply's ``GenerationStats`` when it ends by itself or by ``options.cancel``.
        """
        start = time.perf_counter()
        model = self.model or await self.check()
        request = chat_request(model, messages, options, self.cfg.max_tokens, self.cfg.temperature, self.cfg.seed)
        request["extra_headers"] = self._headers
        reader = ChunkReader()
        first: float | None = None
        cancelled = streaming = False
        try:
            stream = await self.client.chat.completions.create(**request)
            streaming = True
            async with stream:
                async for chunk in stream:
                    for piece in reader.feed(chunk):
                        if first is None:
                            first = time.perf_counter() - start
                        yield piece
                    if options.cancel is not None and options.cancel.is_set():
                        cancelled = True
                        break
        except Exception as exc:  # noqa: BLE001 - translated, or re-raised when not the server's
            raise self.error(exc, streaming) from exc
        if not cancelled and reader.finish_reason is None:
            raise ModelUnavailable(
                f"the LLM server at {self.base_url} ended the reply before finishing it (it failed while streaming, "
                "or dropped it for another request as llama-cpp-python's server does unless started with "
                "--interrupt_requests false)")
        if on_done is not None:
            on_done(reader.stats(time.perf_counter() - start, first, cancelled))

    def error(self, exc: BaseException, streaming: bool = False, checking: bool = False) -> BaseException:
        """``exc`` from the SDK as the project's error, naming the server; ``streaming``: the reply
        had begun (its HTTP response had arrived); ``checking``: from ``check``."""
        import openai

        where = f"the LLM server at {self.base_url}"
        timeout, timeout_key = ((self.cfg.connect_timeout_s, "llm.connect_timeout_s") if checking
                                else (self.cfg.read_timeout_s, "llm.read_timeout_s"))
        if isinstance(exc, (ModelError, Overloaded)):
            return exc
        if isinstance(exc, openai.APIStatusError):
            status, said = exc.status_code, _quoted(exc.message)
            if status in (429, 503):
                return Overloaded(f"{where} is busy ({status}): {said}", retry_after_ms=_retry_after_ms(exc.response))
            if status in (401, 403):
                return ModelError(f"{where} refused the API key ({status}; the key comes from the environment "
                                  f"variable {self.cfg.api_key_env}, llm.api_key_env): {said}")
            if status == 404:
                return ModelError(f"{where} answered 404 (check llm.base_url, which ends in /v1 for most servers, "
                                  f"and llm.model = {self.model!r}): {said}")
            return ModelError(f"{where} refused the request ({status}): {said}")
        if isinstance(exc, openai.APITimeoutError):  # the SDK wraps its HTTP client's errors, mid-stream too
            if streaming:
                return ModelUnavailable(f"{where} sent nothing more for {timeout:g} s (llm.read_timeout_s)")
            return ModelUnavailable(f"{where} did not answer within {timeout:g} s ({timeout_key}) or connect within "
                                    f"{self.cfg.connect_timeout_s:g} s (llm.connect_timeout_s)")
        if isinstance(exc, openai.APIConnectionError):
            if streaming:
                return ModelUnavailable(f"{where} broke off the reply: {_cause(exc)}")
            return ModelUnavailable(f"{where} cannot be reached: {_cause(exc)}")
        return exc

    async def close(self) -> None:
        await self.client.close()


def _cause(exc: BaseException) -> str:
    """The root cause's words ("[Errno 111] Connection refused"), not the SDK's generic ones."""
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    return _quoted(str(exc) or type(exc).__name__)


def _quoted(text: str) -> str:
    return text if len(text) <= MAX_QUOTED else text[:MAX_QUOTED] + "…"


def _retry_after_ms(response: Any) -> int:
    try:
        return max(0, int(1000 * float(response.headers.get("retry-after"))))
    except (TypeError, ValueError, AttributeError):
        return DEFAULT_RETRY_AFTER_MS
