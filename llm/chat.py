"""Streaming chat replies from a GGUF model with llama-cpp-python.

``ChatModel(path).stream(messages, cancel)`` yields text deltas while the model
writes. The prompt comes from the chat template stored in the GGUF.

Prefix reuse: llama.cpp keeps the KV cache of the last prompt + reply. A new
prompt that starts with the same tokens (the next turn of the same conversation)
only evaluates the new suffix, so the first token of turn 2 costs the new user
message, not the whole history. Prompt evaluation is slow on small CPUs (SmolLM2
135M: ~120 tok/s on one core, ~220 on two), so this matters a lot.
It is one cache per model: conversations that take turns on one model evict
each other.

Threads: llama.cpp's OpenMP workers spin while waiting, so when the cores are
oversubscribed (TTS and ASR run in the same process; other processes) a token can
stall for seconds. On a loaded 2-core host SmolLM2 decoded at 2-16 tok/s with 2
threads (stalls up to 3.4 s) and at 21-28 tok/s with 1 thread (worst gap 0.45 s);
unloaded, 2 threads give ~90 tok/s and 1 thread ~48. Prompts: 2 threads evaluate
~1.8x faster than 1 when the host is quiet, but a 599-token prompt took 9-27 s
instead of 4.8 s when it was loaded. Tail latency matters more than the best case
here, so ``n_threads=0`` uses half the cores for both, leaving the rest to TTS,
which runs at the same time. On a dedicated host set ``llm.n_threads`` to the core
count; ``OMP_WAIT_POLICY=PASSIVE`` in the environment before llama_cpp loads
also tames the stalls.

Cancellation: ``cancel`` is checked between prompt chunks of ``PREFILL_CHUNK``
tokens and after every generated token; when set, the generator returns (it
does not raise) and the KV cache keeps what was evaluated for the next prompt.

Context overflow: when history + ``max_tokens`` does not fit in ``n_ctx``, the
oldest non-system messages are dropped (system messages and the last message
are kept; the kept part starts with a user message), down to half the budget.
The cut is remembered and reused while it still fits, so the prompt prefix and
its cache stay stable over the following turns.
"""

from __future__ import annotations

import codecs
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from voxloop.config import Config
from voxloop.errors import InvalidInput, ModelError

log = logging.getLogger(__name__)

# Prompt tokens evaluated between cancel checks: ~0.13 s on one core; 32 would be
# ~6 % faster overall (125 vs 117 tok/s), 8 ~14 % slower.
PREFILL_CHUNK = 16
TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05  # llama.cpp's defaults
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class GenerationStats:
    """Figures of the last ``stream()`` call (times in seconds from the call)."""

    prompt_tokens: int
    cached_tokens: int  # prompt tokens reused from the KV cache
    completion_tokens: int
    dropped_messages: int  # oldest messages left out to fit n_ctx
    first_token_s: float | None  # None when nothing was generated
    total_s: float
    finish_reason: str  # "stop" | "length" | "cancelled"


class ChatModel:
    """A GGUF chat model (one conversation at a time: one worker owns it).

    ``n_threads`` 0 uses half the available cores (module doc); ``seed`` None
    samples differently each call, an int makes replies reproducible; ``max_tokens``
    caps a reply; ``system_prompt`` (the usual first message) is only used by ``warmup()``.
    """

    def __init__(
        self,
        model_path: str | Path,
        n_ctx: int = 2048,
        n_threads: int = 0,
        n_gpu_layers: int = 0,
        seed: int | None = None,
        temperature: float = 0.4,
        max_tokens: int = 160,
        system_prompt: str | None = None,
    ) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelError(f"LLM model file {model_path} does not exist")
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError(
                "llama-cpp-python is not installed: `pip install llama-cpp-python==0.3.36`"
            ) from exc
        threads = n_threads if n_threads > 0 else max(1, len(os.sched_getaffinity(0)) // 2)
        try:
            self._llm = Llama(
                str(model_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                n_gpu_layers=n_gpu_layers, verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(f"cannot load {model_path}: {exc}") from exc
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.seed = seed
        self.temperature = temperature
        self.max_tokens = max_tokens
        self.system_prompt = system_prompt
        self._template = _template(self._llm)
        import llama_cpp

        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._busy = threading.Lock()
        self._cut: tuple[int, str] | None = None  # (messages dropped, first kept message)
        self.last_stats: GenerationStats | None = None

    @classmethod
    def from_config(cls, cfg: Config) -> "ChatModel":
        from voxloop.models import resolve_llm

        c = cfg.llm
        return cls(resolve_llm(cfg).path, n_ctx=c.n_ctx, n_threads=c.n_threads,
                   n_gpu_layers=c.n_gpu_layers, seed=c.seed, temperature=c.temperature,
                   max_tokens=c.max_tokens, system_prompt=c.system_prompt)

    def warmup(self) -> None:
        """Generate a few tokens; the ``system_prompt`` tokens stay cached for turn 1."""
        messages = [{"role": "user", "content": "Hello!"}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        for _ in self.stream(messages, max_tokens=4):
            pass

    def count_tokens(self, messages: Sequence[dict]) -> int:
        """Prompt length in tokens of ``messages`` (with the generation prompt)."""
        return len(self._tokenize(self._render(messages)))

    # --- generation ----------------------------------------------------------

    def stream(
        self,
        messages: Sequence[dict],
        cancel: threading.Event | None = None,
        max_tokens: int | None = None,
    ) -> Iterator[str]:
        """Yield the reply to ``messages`` (dicts with ``role`` and ``content``) as text deltas.

        Stops at the end of the reply, after ``max_tokens`` tokens, or soon after
        ``cancel`` is set (checked between tokens). Stats land in ``last_stats``.
        """
        _check_messages(messages)
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {limit}")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("ChatModel.stream() is already running; one worker owns a model")
        try:
            yield from self._generate(messages, cancel, limit)
        finally:
            self._busy.release()

    def _generate(self, messages, cancel, limit) -> Iterator[str]:
        started = time.perf_counter()
        tokens, dropped = self._fit(messages, limit)
        run = _Run(prompt_tokens=len(tokens), dropped=dropped)
        self.last_stats = None
        try:
            if self._prefill(tokens, cancel, run):
                for piece in self._decode(tokens, cancel, limit, run):
                    if run.first_token_s is None:
                        run.first_token_s = time.perf_counter() - started
                    yield piece
        finally:
            self.last_stats = GenerationStats(
                prompt_tokens=run.prompt_tokens, cached_tokens=run.cached,
                completion_tokens=run.completion_tokens, dropped_messages=run.dropped,
                first_token_s=run.first_token_s, total_s=time.perf_counter() - started,
                finish_reason=run.finish_reason)

    def _prefill(self, tokens: list[int], cancel: threading.Event | None, run: "_Run") -> bool:
        """Evaluate the part of ``tokens`` not already in the KV cache, in cancellable chunks.

        Returns False when cancelled.
        """
        llm = self._llm
        cached = _common_prefix(llm.input_ids[: llm.n_tokens].tolist(), tokens)
        run.cached = cached = min(cached, len(tokens) - 1)  # >= 1 token: fresh logits to sample
        llm.n_tokens = cached  # eval() drops the KV entries past n_tokens
        for i in range(cached, len(tokens), PREFILL_CHUNK):
            if cancel is not None and cancel.is_set():
                return False
            llm.eval(tokens[i : i + PREFILL_CHUNK])
        return True

    def _decode(self, tokens, cancel, limit, run: "_Run") -> Iterator[str]:
        """Sample after the evaluated prompt; yields non-empty text deltas."""
        import llama_cpp

        llm = self._llm
        seed = self.seed if self.seed is not None else int.from_bytes(os.urandom(4), "little")
        llm.set_seed(seed)
        # The whole prompt is evaluated: generate() finds it cached and samples at once.
        gen = llm.generate(tokens, top_k=TOP_K, top_p=TOP_P, min_p=MIN_P,
                           temp=self.temperature, repeat_penalty=1.0)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        last = ""  # the delta of the token that hit the length limit
        try:
            for token in gen:
                if cancel is not None and cancel.is_set():
                    return  # finish_reason stays "cancelled"
                if llama_cpp.llama_vocab_is_eog(self._vocab, token):
                    run.finish_reason = "stop"
                    break
                run.completion_tokens += 1
                piece = utf8.decode(llm.detokenize([token]))
                if run.completion_tokens >= limit:
                    run.finish_reason, last = "length", piece
                    break
                if piece:
                    yield piece
                    if cancel is not None and cancel.is_set():
                        return
        finally:
            gen.close()
        tail = last + utf8.decode(b"", final=True)
        if tail:
            yield tail

    # --- prompt --------------------------------------------------------------

    def _render(self, messages: Sequence[dict]) -> str:
        return self._template(messages=[dict(role=m["role"], content=m["content"])
                                        for m in messages]).prompt

    def _tokenize(self, prompt: str) -> list[int]:
        # The template writes the special tokens itself (added_special), so no BOS here.
        return self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def _fit(self, messages: Sequence[dict], max_tokens: int) -> tuple[list[int], int]:
        """Prompt tokens leaving ``max_tokens`` free, and how many messages were dropped."""
        budget = self.n_ctx - max_tokens
        system = [m for m in messages if m["role"] == "system"]
        rest = [m for m in messages if m["role"] != "system"]
        if self._cut is not None:  # reuse the last cut while it applies and fits
            n, first = self._cut
            if 0 < n < len(rest) and rest[n]["content"] == first:
                tokens = self._tokenize(self._render(system + rest[n:]))
                if len(tokens) <= budget:
                    return tokens, n
        tokens = self._tokenize(self._render(messages))
        if len(tokens) <= budget:
            return tokens, 0
        # Cut down to half the budget so the next turns fit under the same cut; the kept
        # part starts with a user message (templates expect user/assistant alternation).
        for n in range(1, len(rest)):
            if rest[n]["role"] != "user" and n < len(rest) - 1:
                continue
            tokens = self._tokenize(self._render(system + rest[n:]))
            if len(tokens) <= budget // 2 or (n == len(rest) - 1 and len(tokens) <= budget):
                self._cut = (n, rest[n]["content"])
                log.info("LLM prompt over n_ctx: dropped the %d oldest messages", n)
                return tokens, n
        raise InvalidInput(
            f"prompt needs {len(tokens)} tokens; n_ctx {self.n_ctx} minus max_tokens "
            f"{max_tokens} leaves {budget}"
        )


@dataclass
class _Run:
    """Mutable figures of one ``stream()`` call (becomes ``GenerationStats``)."""

    prompt_tokens: int
    dropped: int
    cached: int = 0
    completion_tokens: int = 0
    first_token_s: float | None = None
    finish_reason: str = "cancelled"


def _template(llm):
    """The GGUF's chat template as a llama-cpp-python formatter."""
    from llama_cpp import llama_chat_format

    source = llm.metadata.get("tokenizer.chat_template")
    if not source:
        raise ModelError("the GGUF has no tokenizer.chat_template; use a chat (instruct) model")
    eos_id, bos_id = llm.token_eos(), llm.token_bos()

    def text(token: int) -> str:
        return llm.detokenize([token], special=True).decode("utf-8") if token != -1 else ""

    eos, bos = text(eos_id), text(bos_id)
    return llama_chat_format.Jinja2ChatFormatter(template=source, eos_token=eos, bos_token=bos)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _check_messages(messages: Sequence[dict]) -> None:
    if not messages:
        raise InvalidInput("no messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(
                m.get("content"), str):
            raise InvalidInput(f"bad chat message {m!r}: need role in {ROLES} and str content")
