"""Chat replies for many conversations at once: continuous batching on one llama.cpp context.

    engine = BatchedChat.from_config(load_config())
    reply = engine.submit("session-1", messages, ReplyOptions(max_tokens=64))   # any thread
    engine.cancel(reply)                      # any thread; stops it at the next step
    engine.prefill("session-1", messages)     # any thread; read a cut history before the next turn
    events = engine.step()                    # the owning thread: one llama_decode
    engine.probe(Probe(tokens, targets, done))  # any thread; next-token mass of ``targets``, no reply
    engine.submit("session-1", messages, probes=[probe])   # a reply and a probe of its prompt's start
    text, stats = engine.generate("s", messages)   # notebook use: submit + step until done

One context, one KV **sequence per conversation** (``session`` key), kept across its
turns: a new turn evaluates only the tokens after the longest common prefix of the
sequence's cached tokens and the new prompt (the previous reply is usually cached
already, so that is about the new user message). The KV cache is unified (one pool
of cells shared by the sequences), so the **system prompt's KV is computed once** at
start-up into a reserved sequence and a new conversation starts from a metadata copy
of it (``llama_memory_seq_cp``: the cells are shared, not copied). Flash attention
(llama.cpp's "auto") skips cells masked out for a sequence, so attending in the shared
pool costs about what a private cache would.

Each ``step()`` builds one batch: one token for every reply that is generating, then
prompt chunks of replies still reading their prompt (priority, then arrival order)
up to ``batch_tokens``, and runs **one** ``llama_decode``. Every reply samples with its
own llama.cpp sampler chain (greedy at temperature 0, else top-k 40 / top-p 0.95 /
min-p 0.05 / temperature / seeded draw: llama.cpp's defaults) in native code. A reply
submitted between steps joins the next step; a cancelled one leaves the batch at the
next step and its sequence keeps what was evaluated (the conversation's next turn reuses
it). ``release(session)`` frees the sequence (a disconnect). With more conversations
than ``max_sequences``, the least recently used idle sequence is given to the newcomer
(its conversation re-reads its prompt when it comes back); when every sequence is busy
generating, a reply waits for one to finish.

A ``Probe`` (llm/end_of_turn.py) asks for the probability mass of some next tokens after a prompt
(one softmax of its last token's logits); nothing is generated. When a reply of its conversation
(``Probe.session``) is about to read the probe's tokens as the start of its own prompt (the words'
end-of-turn score beside the turn's speculative reply), the probe is answered from that reply's
logits at its last token, in the step that reads it: no token is read twice (a probe sent with its
reply, ``submit(probes=...)``, always is; one sent after it may come once the reply has read its
prompt, and read one token of its own). Otherwise it reads its
prompt in the next steps' batches, before the replies' prompts, on a sequence of its own, starting
from the longest cached prefix it shares: its conversation's sequence (a metadata copy,
``llama_memory_seq_cp``, as for the system prompt; one token once a reply has read the words), the
system prompt's, or the last probe's. Those probes run one at a time (first come, first read);
nothing a probe reads enters a conversation's sequence.

History longer than ``n_ctx`` (per conversation) minus ``max_tokens``: ``ChatPrompt.fit``
drops the oldest messages down to half the budget and the cut is kept per conversation,
so the cached prefix stays valid over the following turns (llm/prompt.py). The turn that
cuts would read everything after the cut again (every kept token moved to a lower position:
seconds on a CPU, 1800 tokens ≈ 7 s on two cores); instead the dropped span is removed from
the sequence and the kept cells are shifted back (``llama_memory_seq_add``: llama.cpp
re-rotates their RoPE keys, its own server's context shift), so that turn reads only its new
message. The kept tokens were computed beside the dropped ones, so the reply may differ from
one after a full re-read.

Threads: ``submit``, ``cancel`` and ``release`` may be called from any thread (they
queue a command); ``step`` and ``generate`` only from the thread that owns the engine.
llama.cpp's CPU threads: ``n_threads`` 0 uses half the cores (the TTS runs at the same
time; on a loaded 2-core host one LLM thread had far smaller stalls than two). A step that
reads prompt tokens may use ``prefill_threads`` instead, when its caller says the other
cores are idle (``step(spare_cores=True)``): a turn's first token waits for that step, and
its attention over the conversation's history grows with every turn (``bench.llm_history``:
one thread of a 2-core VM, 104 ms after 24 cached tokens, 287 ms after 1654). With another
core busy, more threads are slower: llama.cpp waits for its slowest thread.
"""

from __future__ import annotations

import codecs
import collections
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from llm.prompt import ChatPrompt, Cut, check_messages, common_prefix
from llm.replies import ChatOptions, GenerationStats, Reply, ReplyEvent, ReplyOptions, ToolCallDelta
from llm.constrained import GrammarSampler
from llm.tool_format import GRAMMAR_ROOT
from base.config import Config
from base.errors import InvalidInput, ModelError, VoxloopError

log = logging.getLogger(__name__)

TOP_K, TOP_P, MIN_P = 40, 0.95, 0.05  # llama.cpp's defaults
#: Prompt tokens a reply reads per step at least, even when the batch is full of decodes.
MIN_PREFILL = 16
_PREFIX_SEQ = 0  # the reserved sequence holding the system prompt's KV
#: Shorter runs of a cut history are read again rather than shifted (not worth a K re-rotation).
SHIFT_MIN_TOKENS = 16
#: KV cells of the probe sequence: what a probe reads beyond the cached prefix it starts from.
PROBE_CTX = 512
#: A probe with more tokens than this left to read takes its short prompt, if that has fewer (a
#: probe of a conversation whose cache holds its history reads about a dozen).
SHORT_PROBE_AFTER = 64


@dataclass(eq=False)
class Probe:
    """Read ``tokens`` (no reply) and call ``done`` on the engine thread with the next token's
    probability mass on ``targets`` (token ids), or with None when it could not run."""

    tokens: list[int]
    targets: Sequence[int]
    done: Callable[[float | None], None]
    #: The conversation whose cached tokens the probe may start from (``submit``'s ``session``).
    session: Hashable | None = None
    #: A shorter prompt asking the same (e.g. without the older history), read instead when it has
    #: fewer tokens left to read (the conversation's cache no longer holds ``tokens``' history).
    short: list[int] | None = None


@dataclass(eq=False)
class _Slot:
    seq: int
    session: Hashable | None = None
    tokens: list[int] = field(default_factory=list)  # what the sequence's KV holds, by position
    reply: Reply | None = None
    cut: Cut | None = None
    used: float = 0.0


class BatchedChat:
    """A GGUF chat model answering many conversations with one llama.cpp context (module doc)."""

    def __init__(self, model_path: str | Path, options: ChatOptions = ChatOptions()) -> None:
        model_path = Path(model_path)
        if not model_path.is_file():
            raise ModelError(f"LLM model file {model_path} does not exist")
        if options.max_sequences < 1 or options.batch_tokens < options.max_sequences:
            raise InvalidInput("llm.batch_tokens must be >= llm.max_sequences >= 1 (one token per "
                               f"generating sequence), got {options.batch_tokens} and {options.max_sequences}")
        try:
            import llama_cpp  # before numpy where it matters (shared/gpu-recipes)
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError("llama-cpp-python is not installed: `pip install llama-cpp-python==0.3.36`") from exc
        self._ll = llama_cpp
        self.options = options
        self.model_path = model_path
        threads = options.n_threads if options.n_threads > 0 else max(1, len(os.sched_getaffinity(0)) // 2)
        self._threads = threads
        self._prefill_threads = max(threads, options.prefill_threads)
        self._threads_batch = threads  # the context's n_threads_batch now
        try:
            # Llama loads the weights (the plain low-level loader crashed on some hosts) and gives
            # the tokenizer and template; its own small context is not used for generation.
            self._llm = Llama(str(model_path), n_ctx=256, n_batch=32, n_threads=1,
                              n_gpu_layers=options.n_gpu_layers, verbose=False)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(f"cannot load {model_path}: {exc}") from exc
        weights, kv = self._fixed_bytes()
        if options.memory_budget_mb and weights + kv > options.memory_budget_mb * 2**20:
            self._llm.close()
            where = "GPU" if options.n_gpu_layers else "RAM"
            raise ModelError(
                f"the LLM needs {(weights + kv) / 2**20:.0f} MiB of {where} (weights {weights / 2**20:.0f} MiB + "
                f"KV cache {kv / 2**20:.0f} MiB for {options.max_sequences + 1} sequences x {options.n_ctx} "
                f"tokens), over llm.memory_budget_mb = {options.memory_budget_mb}: lower llm.max_sequences "
                "or llm.n_ctx, or raise the budget")
        params = llama_cpp.llama_context_default_params()
        n_seq = options.max_sequences + 2  # + the system prompt's sequence + the probes' sequence
        params.n_ctx = options.n_ctx * (n_seq - 1) + PROBE_CTX
        params.n_batch = params.n_ubatch = options.batch_tokens
        params.n_seq_max = n_seq
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self._ctx = llama_cpp.llama_init_from_model(self._llm.model, params)
        if not self._ctx:
            raise ModelError(f"llama.cpp could not create a context for {n_seq} sequences x {options.n_ctx} "
                             "tokens (out of memory? llama.cpp allows at most 256 sequences)")
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self._can_shift = bool(llama_cpp.llama_memory_can_shift(self._mem))
        #: Cached tokens kept over history cuts by shifting them (``_shift_after_cut``), since start.
        self.shifted_tokens = 0
        self._vocab = llama_cpp.llama_model_get_vocab(self._llm.model)
        self._batch = llama_cpp.llama_batch_init(options.batch_tokens, 0, 1)
        self.prompt = ChatPrompt(self._llm)
        self._slots = [_Slot(seq) for seq in range(1, n_seq - 1)]
        self._probe_seq = n_seq - 1
        self._probes: collections.deque[Probe] = collections.deque()  # engine thread
        self._probe_tokens: list[int] = []  # what the probe sequence holds
        self._probe_pending: list[int] = []  # of ``_probes[0]``, not read yet
        self._prefix: list[int] = []
        self._ids = itertools.count(1)
        self._inbox: collections.deque = collections.deque()
        self._wake = threading.Condition()
        self._waiting: list[Reply] = []  # submitted, no sequence yet
        self._active: list[Reply] = []  # holding a sequence: reading the prompt or generating
        #: Tokens evaluated so far: prompt tokens (``prompt_evaluated``) and all (``evaluated``).
        self.prompt_evaluated = 0
        self.evaluated = 0
        self.steps = 0
        #: Probes answered from a reply's own prompt (``_attach_probes``) and on the probe sequence,
        #: and the tokens read on the probe sequence.
        self.probes_shared = 0
        self.probes_alone = 0
        self.probe_evaluated = 0
        self.wide_steps = 0  # steps that ran on ``prefill_threads``
        #: Tokens in the last step's batch, and how many replies it advanced.
        self.last_batch = (0, 0)
        #: Seconds the last step spent inside ``llama_decode`` (the rest of a step is host work).
        self.last_decode_s = 0.0
        self.last_stats: GenerationStats | None = None  # of the last ``stream``/``generate``
        if options.system_prompt:
            self._cache_prefix(options.system_prompt)

    @classmethod
    def from_config(cls, cfg: Config) -> "BatchedChat":
        from base.models import resolve_llm

        c = cfg.llm
        return cls(resolve_llm(cfg).path, ChatOptions(
            n_ctx=c.n_ctx, max_sequences=c.max_sequences, batch_tokens=c.batch_tokens,
            n_threads=c.n_threads, prefill_threads=c.prefill_threads, n_gpu_layers=c.n_gpu_layers, seed=c.seed,
            temperature=c.temperature, max_tokens=c.max_tokens, system_prompt=c.system_prompt,
            memory_budget_mb=c.memory_budget_mb))

    def close(self) -> None:
        if self._ctx:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ctx = None
            self._llm.close()

    # --- any thread --------------------------------------------------------------

    def submit(self, session: Hashable, messages: Sequence[dict], options: ReplyOptions = ReplyOptions(),
               tag: object = None, probes: Sequence[Probe] = ()) -> Reply:
        """Queue a reply to ``messages`` in conversation ``session``; it joins the next step.

        A reply still running in the same conversation is cancelled (a new turn supersedes it).
        ``tag`` is kept on the returned ``Reply`` for the caller. ``probes`` are queued with it, in
        the same command: one whose tokens start the reply's prompt (the words' end-of-turn score of
        a voice turn) is read from the reply's logits in the step that reads its prompt, which a
        probe queued after the submit may miss (module doc). A probe this engine cannot read ends
        with None; the reply still runs.
        """
        limit = self.options.max_tokens if options.max_tokens is None else options.max_tokens
        if limit < 1:
            raise InvalidInput(f"max_tokens must be >= 1, got {limit}")
        return self._queue(session, messages, options, tag, limit, probes)

    def prefill(self, session: Hashable, messages: Sequence[dict], options: ReplyOptions = ReplyOptions(),
                tag: object = None) -> Reply:
        """Queue reading ``messages`` into ``session``'s sequence without a reply (it ends with finish
        reason "prefilled"): the next turn, ``messages`` + a new user message, reads only the new one.

        For a history whose oldest messages were just dropped (every cached token after the cut
        moved): read ahead while the user listens, not when the next turn waits for its first token.
        It reads only in steps where no reply generates or reads its prompt. The next turn's submit
        cancels it if still running; what it read is kept.
        """
        return self._queue(session, messages, options, tag, 0)

    def _queue(self, session: Hashable, messages: Sequence[dict], options: ReplyOptions, tag: object,
               limit: int, probes: Sequence[Probe] = ()) -> Reply:
        check_messages(messages)
        reply = Reply(next(self._ids), session, list(messages), options, tag=tag, _limit=limit)
        with_it = []
        for probe in probes:
            try:
                with_it.append(("probe", self._checked(probe)))
            except InvalidInput:
                probe.done(None)
        self._command(("submit", reply), *with_it)
        return reply

    def probe(self, probe: Probe) -> None:
        """Queue ``probe`` (module doc); any thread."""
        self._command(("probe", self._checked(probe)))

    def _checked(self, probe: Probe) -> Probe:
        if len(probe.tokens) > self.options.n_ctx and probe.short:
            probe.tokens, probe.short = probe.short, None
        if not probe.tokens or len(probe.tokens) > self.options.n_ctx:
            raise InvalidInput(f"a probe holds 1..{self.options.n_ctx} tokens, got {len(probe.tokens)}")
        return probe

    def cancel(self, reply: Reply) -> None:
        """Stop ``reply`` at the next step (it ends with finish reason "cancelled")."""
        reply.cancelled = True
        self._command(("wake", None))

    def release(self, session: Hashable) -> None:
        """Forget conversation ``session``: cancel its reply and free its sequence."""
        self._command(("release", session))

    def _command(self, *cmds: tuple) -> None:
        """Queue ``cmds`` together: the engine takes them in one step, in order."""
        with self._wake:
            self._inbox.extend(cmds)
            self._wake.notify()

    # --- the owning thread ---------------------------------------------------------

    def busy(self) -> bool:
        """True while replies are running or waiting (engine thread)."""
        return bool(self._active or self._waiting or self._inbox or self._probes)

    def step(self, wait_s: float = 0.0, spare_cores: bool = False) -> list[ReplyEvent]:
        """Take queued commands, then run one batch (one ``llama_decode``) if there is work.

        With nothing to do, waits up to ``wait_s`` for a command and returns [].
        ``spare_cores``: nothing else runs on the CPU now, so a batch with prompt tokens may
        use ``prefill_threads`` (module doc).
        """
        events: list[ReplyEvent] = []
        self.wait(wait_s)
        self._take_commands(events)
        self._drop_cancelled(events)
        self._admit(events)
        if self._active or self._probes:
            self._run_batch(events, spare_cores)
        return events

    def wait(self, timeout_s: float) -> None:
        """With nothing to do, wait up to ``timeout_s`` for a command (a submit, cancel or release)."""
        if not self.busy() and timeout_s > 0:
            with self._wake:
                self._wake.wait_for(lambda: bool(self._inbox), timeout=timeout_s)

    def generate(self, session: Hashable, messages: Sequence[dict],
                 options: ReplyOptions = ReplyOptions()) -> tuple[str, GenerationStats]:
        """Reply to ``messages`` (blocking; runs steps on this thread). Returns (text, stats)."""
        text = "".join(self.stream(session, messages, options))
        return text, self.last_stats

    def stream(self, session: Hashable, messages: Sequence[dict],
               options: ReplyOptions = ReplyOptions()) -> Iterator[str]:
        """Yield the reply's text deltas, running steps on this thread (notebooks, benches).

        Set ``options.cancel`` to stop it; its stats land in ``last_stats``.
        """
        reply = self.submit(session, messages, options)
        self.last_stats = None
        try:
            while not reply.done:
                for e in self.step():
                    if e.reply is reply and e.text:
                        yield e.text
        finally:
            if not reply.done:  # the caller stopped early
                self.cancel(reply)
                while not reply.done:
                    self.step()
        self.last_stats = reply.stats
        if reply.error is not None:
            raise reply.error

    def collect(self, replies: Sequence[Reply]) -> list[tuple[str, GenerationStats]]:
        """Run steps until every one of ``replies`` is finished; their texts and stats, in order."""
        texts = {r.id: [] for r in replies}
        while not all(r.done for r in replies):
            for e in self.step():
                if e.reply.id in texts:
                    texts[e.reply.id].append(e.text)
        for r in replies:
            if r.error is not None:
                raise r.error
        return [("".join(texts[r.id]), r.stats) for r in replies]

    def abort(self, exc: BaseException) -> list[ReplyEvent]:
        """End every reply with ``exc`` (after an unexpected failure of ``step``)."""
        events: list[ReplyEvent] = []
        for r in self._active + self._waiting:
            r.error = exc
            if r._slot is not None:
                self._clear(r._slot)
            self._finish(r, "error", events)
        self._end_probes()
        return events

    def _fixed_bytes(self) -> tuple[int, int]:
        """Bytes of the weights and of the KV cache (f16 K and V, every layer) for all sequences."""
        ll, model = self._ll, self._llm.model
        head = ll.llama_model_n_embd(model) // ll.llama_model_n_head(model)
        kv_per_token = 2 * ll.llama_model_n_layer(model) * ll.llama_model_n_head_kv(model) * head * 2
        return ll.llama_model_size(model), self._kv_tokens * kv_per_token

    @property
    def _kv_tokens(self) -> int:
        return self.options.n_ctx * (self.options.max_sequences + 1) + PROBE_CTX

    def report(self) -> dict[str, int]:
        """Fixed memory (weights; KV cache for every sequence, f16) and counters; any thread."""
        weights, kv = self._fixed_bytes()
        return {
            "weights_bytes": weights, "kv_bytes": kv,
            "kv_tokens": self._kv_tokens, "sequences": self.options.max_sequences,
            "sequences_held": sum(s.session is not None for s in self._slots),
            "replies_running": len(self._active), "replies_waiting": len(self._waiting),
            "steps": self.steps, "wide_steps": self.wide_steps, "evaluated_tokens": self.evaluated,
            "prompt_tokens_evaluated": self.prompt_evaluated,
            "probes_shared": self.probes_shared, "probes_alone": self.probes_alone,
            "probe_tokens_evaluated": self.probe_evaluated,
            "last_batch_tokens": self.last_batch[0], "last_batch_sequences": self.last_batch[1],
        }

    def cached_tokens(self, session: Hashable) -> int:
        """Tokens held in ``session``'s sequence (0 when it has none)."""
        slot = self._slot_of(session)
        return len(slot.tokens) if slot else 0

    # --- commands and admission ------------------------------------------------------

    def _take_commands(self, events: list[ReplyEvent]) -> None:
        with self._wake:
            cmds = list(self._inbox)
            self._inbox.clear()
        for kind, arg in cmds:
            if kind == "submit":
                for other in self._active + self._waiting:
                    if other.session == arg.session:
                        other.cancelled = True
                self._waiting.append(arg)
            elif kind == "probe":
                self._probes.append(arg)
            elif kind == "release":
                for r in self._active + self._waiting:
                    if r.session == arg:
                        r.cancelled = True
                self._drop_cancelled(events)
                slot = self._slot_of(arg)
                if slot is not None:
                    self._clear(slot)
                    slot.session = None

    def _drop_cancelled(self, events: list[ReplyEvent]) -> None:
        for r in list(self._waiting) + list(self._active):
            if r.cancelled or (r.options.cancel is not None and r.options.cancel.is_set()):
                self._finish(r, "cancelled", events)

    def _slot_of(self, session: Hashable) -> _Slot | None:
        return next((s for s in self._slots if s.session == session), None)

    def _admit(self, events: list[ReplyEvent]) -> None:
        for reply in list(self._waiting):
            slot = self._slot_of(reply.session) or self._free_slot()
            if slot is None:
                return  # every sequence is generating: wait for one to finish
            self._waiting.remove(reply)
            try:
                self._start(reply, slot)
            except Exception as exc:  # noqa: BLE001 - this reply fails, the others go on
                reply.error = exc if isinstance(exc, VoxloopError) else ModelError(f"cannot start the reply: {exc}")
                slot.reply = None
                self._finish(reply, "error", events)

    def _evict_idle(self) -> bool:
        """Clear the least recently used sequence that no reply uses; False if there is none.

        (The batch is one ubatch, so a failed ``llama_decode`` left nothing behind to undo.)
        """
        idle = [s for s in self._slots if s.reply is None and s.tokens]
        if not idle:
            return False
        slot = min(idle, key=lambda s: s.used)
        log.warning("LLM: KV cache full; dropping the cache of conversation %s", slot.session)
        self._clear(slot)
        return True

    def _free_slot(self) -> _Slot | None:
        idle = [s for s in self._slots if s.reply is None]
        if not idle:
            return None
        fresh = [s for s in idle if s.session is None]
        slot = fresh[0] if fresh else min(idle, key=lambda s: s.used)
        if slot.session is not None:
            log.info("LLM: sequence %d goes from conversation %s to a new one", slot.seq, slot.session)
            self._clear(slot)
        return slot

    def _clear(self, slot: _Slot) -> None:
        self._ll.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
        slot.tokens, slot.cut = [], None

    def _start(self, reply: Reply, slot: _Slot) -> None:
        """Give ``reply`` the sequence ``slot``: fit its prompt, keep the reusable prefix."""
        o = self.options
        budget = o.n_ctx - (reply._limit or o.max_tokens)  # a prefill fits as the turn after it will
        tools = reply.options.tools if reply.options.tool_choice != "none" else ()
        fitted = self.prompt.fit(reply.messages, budget, slot.cut if slot.session == reply.session else None, tools)
        tokens = fitted.tokens
        slot.session, slot.reply, slot.cut, slot.used = reply.session, reply, fitted.cut, time.perf_counter()
        keep = min(common_prefix(slot.tokens, tokens), len(tokens) - 1)  # >= 1 token: fresh logits
        if slot.session == reply.session and self._can_shift:
            keep = self._shift_after_cut(slot, tokens, keep)
        prefix = self._prefix
        if keep < len(prefix) < len(tokens) and tokens[:len(prefix)] == prefix:
            self._ll.llama_memory_seq_rm(self._mem, slot.seq, -1, -1)
            self._ll.llama_memory_seq_cp(self._mem, _PREFIX_SEQ, slot.seq, 0, len(prefix))
            slot.tokens, keep = list(prefix), len(prefix)
        else:
            self._ll.llama_memory_seq_rm(self._mem, slot.seq, keep, -1)
            del slot.tokens[keep:]
        reply._slot, reply._pending = slot, tokens[keep:]
        reply._prompt_tokens, reply._cached, reply._dropped = len(tokens), keep, fitted.dropped
        reply._sampler = self._sampler(reply.options, tools)
        reply._calls = self.prompt.tool_format.parser() if tools else None
        reply._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._active.append(reply)

    def _shift_after_cut(self, slot: "_Slot", tokens: list[int], keep: int) -> int:
        """After the oldest messages were dropped, keep what is cached of the rest: remove the dropped
        span from the sequence and shift the later cells back (llama.cpp's context shift: RoPE keys
        re-rotated in place, as its own server does), instead of reading every later token again.
        Returns the new cached length (``keep`` when the cache holds no run of the new prompt)."""
        cached = slot.tokens
        want = len(tokens) - 1 - keep  # tokens still to read (>= 1 stays: fresh logits)
        if want < SHIFT_MIN_TOKENS or len(cached) - keep < SHIFT_MIN_TOKENS:
            return keep
        first = tokens[keep]
        best_at, best = -1, 0
        for at in range(keep + 1, len(cached)):
            if cached[at] == first:
                n = common_prefix(cached[at:], tokens[keep:keep + want])
                if n > best:
                    best_at, best = at, n
        if best < SHIFT_MIN_TOKENS:
            return keep
        ll, seq = self._ll, slot.seq
        ll.llama_memory_seq_rm(self._mem, seq, best_at + best, -1)
        ll.llama_memory_seq_rm(self._mem, seq, keep, best_at)
        ll.llama_memory_seq_add(self._mem, seq, best_at, best_at + best, keep - best_at)
        slot.tokens = cached[:keep] + cached[best_at:best_at + best]
        self.shifted_tokens += best
        log.info("LLM history cut: %d cached tokens shifted back by %d instead of read again", best, best_at - keep)
        return keep + best

    def _sampler(self, options: ReplyOptions, tools: Sequence[dict] = ()):
        """The reply's sampler chain; with ``tool_choice`` ``required`` or a named function, a grammar
        makes the reply one call with valid arguments (llm/tool_format.py), checked after the chain's
        pick (``llm.constrained.GrammarSampler``)."""
        ll = self._ll
        temp = self.options.temperature if options.temperature is None else options.temperature
        seed = options.seed if options.seed is not None else self.options.seed
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        grammar = None
        if tools and (options.tool_choice == "required" or isinstance(options.tool_choice, dict)):
            text = self.prompt.tool_format.grammar(tools, options.tool_choice)
            grammar = ll.llama_sampler_init_grammar(self._vocab, text.encode(), GRAMMAR_ROOT.encode())
            if not grammar:
                raise InvalidInput("tools: llama.cpp cannot use the grammar made from the functions' parameters")
        chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
        if temp <= 0:
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
        else:
            for s in (ll.llama_sampler_init_top_k(TOP_K), ll.llama_sampler_init_top_p(TOP_P, 1),
                      ll.llama_sampler_init_min_p(MIN_P, 1), ll.llama_sampler_init_temp(temp),
                      ll.llama_sampler_init_dist(seed)):
                ll.llama_sampler_chain_add(chain, s)
        if grammar is not None:
            return GrammarSampler(ll, chain, grammar, ll.llama_vocab_n_tokens(self._vocab))
        return chain

    def _cache_prefix(self, system_prompt: str) -> None:
        """Evaluate the system prompt's tokens once into the reserved sequence."""
        prefix = self.prompt.system_prefix(system_prompt)
        for i in range(0, len(prefix), self.options.batch_tokens):
            chunk = prefix[i:i + self.options.batch_tokens]
            self._fill([(t, i + j, _PREFIX_SEQ, False) for j, t in enumerate(chunk)])
            self._decode()
        self._prefix = prefix

    # --- one step ---------------------------------------------------------------------

    def _run_batch(self, events: list[ReplyEvent], spare_cores: bool = False) -> None:
        rows: list[tuple[int, int, int, bool]] = []  # (token, pos, seq, wants logits)
        sampled: list[tuple[Reply, int]] = []  # (reply, batch index of its logits)
        self._attach_probes()
        while self._probes and not self._probe_pending:
            self._start_probe()  # before this step's tokens join the sequences it may copy
        decoding = [r for r in self._active if r._next is not None]
        for r in decoding:
            slot = r._slot
            sampled.append((r, len(rows)))
            rows.append((r._next, len(slot.tokens), slot.seq, True))
            slot.tokens.append(r._next)
            r._next = None
        budget = max(self.options.batch_tokens - len(rows), min(MIN_PREFILL, self.options.batch_tokens))
        budget = min(budget, self.options.batch_tokens - len(rows))
        # Before the replies' prompts: its turn commits when it is read. (After them: no faster on
        # 2 cores, commit p50 923 against 868 ms, bench.turn_taking 2026-12-07.)
        probe_row = self._probe_rows(rows, budget)
        budget -= len(rows) - len(decoding)
        reading = sorted((r for r in self._active if r._pending), key=lambda r: (r.options.priority, r.id))
        if decoding or any(r._limit for r in reading):  # prefills read only in idle steps: a step
            reading = [r for r in reading if r._limit]  # of 32 prompt tokens is slow for the others
        prompt_rows = 0
        prefilled: list[Reply] = []  # prefills whose last prompt token is in this batch
        probed: list[tuple[Probe, int]] = []  # probes read from a reply's prompt: (probe, batch index)
        for r in reading:
            if budget <= 0:
                break
            chunk, r._pending = r._pending[:budget], r._pending[budget:]
            slot = r._slot
            for j, t in enumerate(chunk):
                last = j == len(chunk) - 1 and not r._pending
                if last and r._limit == 0:
                    prefilled.append(r)
                    last = False  # no logits: nothing is sampled
                elif last:
                    sampled.append((r, len(rows)))
                at = [p for pos, p in r._probes if pos == len(slot.tokens)] if r._probes else ()
                if at:
                    probed += [(p, len(rows)) for p in at]
                    last = True
                rows.append((t, len(slot.tokens), slot.seq, last))
                slot.tokens.append(t)
            if r._probes:
                r._probes = [(pos, p) for pos, p in r._probes if pos >= len(slot.tokens)]
            budget -= len(chunk)
            prompt_rows += len(chunk)
        self._fill(rows)
        wide = spare_cores and prompt_rows > 0 and self._prefill_threads > self._threads
        self._set_batch_threads(self._prefill_threads if wide else self._threads)
        self.wide_steps += wide
        started = time.perf_counter()
        rc = self._decode()
        while rc == 1 and self._evict_idle():  # no room in the KV cache: give up an idle conversation
            rc = self._decode()
        self.last_decode_s = time.perf_counter() - started
        self.steps += 1
        self.evaluated += len(rows)
        self.prompt_evaluated += prompt_rows
        self.last_batch = (len(rows), len({seq for _, _, seq, _ in rows}))
        if rc != 0:
            for probe, _ in probed:
                probe.done(None)
            self._fail_batch(rows, rc, events)
            return
        if probe_row is not None:
            self._end_probe(probe_row)
            self.probes_alone += 1
        for probe, index in probed:
            probe.done(self._mass(probe, index))
            self.probes_shared += 1
        for r in prefilled:
            self._finish(r, "prefilled", events)
        now = time.perf_counter()
        for r, index in sampled:
            token = r._sampler.sample(self._ctx, index) if isinstance(r._sampler, GrammarSampler) else \
                self._ll.llama_sampler_sample(r._sampler, self._ctx, index)
            self._take_token(r, token, now, events)

    def _take_token(self, r: Reply, token: int, now: float, events: list[ReplyEvent]) -> None:
        if self._ll.llama_vocab_is_eog(self._vocab, token):
            self._finish(r, "stop", events)
            return
        if r._first_token_s is None:
            r._first_token_s, r._first_batch = now - r.submitted, self.last_batch[1]
        r._completion += 1
        # with tools, special tokens are call markers of some templates ([TOOL_CALLS], <|python_tag|>)
        piece = r._utf8.decode(self._llm.detokenize([token], special=r._calls is not None))
        event = self._event(r, piece)
        if event is not None:
            events.append(event)
        if r._completion >= r._limit:
            self._finish(r, "length", events)
            return
        r._next = token

    def _event(self, r: Reply, piece: str, stats: GenerationStats | None = None,
               last: bool = False) -> ReplyEvent | None:
        """The event of a piece of the reply: its text, and with tools the calls it completes."""
        if r._calls is None:
            return ReplyEvent(r, piece, stats) if piece or stats is not None else None
        text, calls = r._calls.feed(piece)
        if last:
            rest, more = r._calls.flush()
            text, calls = text + rest, calls + more
        deltas = []
        for call in calls:
            deltas.append(ToolCallDelta(r._call_index, call.arguments, call.call_id, call.name))
            r._call_index += 1
        if not (text or deltas or stats is not None):
            return None
        return ReplyEvent(r, text, stats, tuple(deltas))

    def _set_batch_threads(self, n: int) -> None:
        """llama.cpp's threads for batches of more than one token (one token keeps ``n_threads``)."""
        if n != self._threads_batch:
            self._ll.llama_set_n_threads(self._ctx, self._threads, n)
            self._threads_batch = n

    def _fill(self, rows: list[tuple[int, int, int, bool]]) -> None:
        b = self._batch
        for i, (token, pos, seq, logits) in enumerate(rows):
            b.token[i] = token
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = int(logits)
        b.n_tokens = len(rows)

    def _decode(self) -> int:
        return self._ll.llama_decode(self._ctx, self._batch)

    def _probe_rows(self, rows: list[tuple[int, int, int, bool]], budget: int) -> int | None:
        """Add the next probe's prompt (as much as ``budget`` allows) to ``rows``; the batch index of
        its logits when its last token is in."""
        if not self._probes or budget <= 0:
            return None
        seq = self._probe_seq
        chunk, self._probe_pending = self._probe_pending[:budget], self._probe_pending[budget:]
        for j, t in enumerate(chunk):
            rows.append((t, len(self._probe_tokens), seq, j == len(chunk) - 1 and not self._probe_pending))
            self._probe_tokens.append(t)
        self.probe_evaluated += len(chunk)
        return None if self._probe_pending else len(rows) - 1

    def _start_probe(self) -> None:
        """Start the next probe from the longest cached prefix it shares (module doc); a probe with
        more than ``PROBE_CTX`` tokens to read ends with None."""
        probe, seq, ll = self._probes[0], self._probe_seq, self._ll
        slot = self._slot_of(probe.session) if probe.session is not None else None
        sources = [(self._probe_tokens, seq), (self._prefix, _PREFIX_SEQ)]
        if slot is not None:
            sources.append((slot.tokens, slot.seq))
        # (tokens left to read, -kept, source, tokens) of each prompt from each cached prefix; the
        # short prompt only when the whole one has more than SHORT_PROBE_AFTER tokens left to read
        left, _, src, tokens = min(self._probe_starts(probe.tokens, sources))
        if left > SHORT_PROBE_AFTER and probe.short:
            left, _, src, tokens = min(left_src for left_src in [(left, 0, src, tokens),
                                                                  *self._probe_starts(probe.short, sources)])
        if left > PROBE_CTX:
            self._probes.popleft().done(None)
            return
        keep = len(tokens) - left
        if src == seq:
            ll.llama_memory_seq_rm(self._mem, seq, keep, -1)
        else:
            ll.llama_memory_seq_rm(self._mem, seq, -1, -1)
            ll.llama_memory_seq_cp(self._mem, src, seq, 0, keep)
        self._probe_tokens, self._probe_pending = tokens[:keep], tokens[keep:]

    @staticmethod
    def _probe_starts(tokens: list[int], sources: list[tuple[list[int], int]]):  # noqa: ANN205
        for cached, src in sources:
            keep = min(common_prefix(cached, tokens), len(tokens) - 1)
            yield len(tokens) - keep, -keep, src, tokens

    def _attach_probes(self) -> None:
        """Queued probes whose tokens a reply of their conversation is about to read (the words'
        prompt is the start of the turn's speculative reply's) are read from that reply's logits at
        their last token instead of on the probe sequence: no token is read twice."""
        waiting = list(self._probes)[1 if self._probe_pending else 0:]
        for probe in waiting:
            for r in self._active:
                if r.session != probe.session or not r._limit or not r._pending:
                    continue
                cached, n = r._slot.tokens, len(probe.tokens)
                if len(cached) < n <= len(cached) + len(r._pending) and \
                        cached + r._pending[:n - len(cached)] == probe.tokens:
                    self._probes.remove(probe)
                    r._probes.append((n - 1, probe))
                    break

    def _end_probe(self, index: int) -> None:
        """The probe's last token was read: its targets' share of the next token's softmax."""
        probe = self._probes.popleft()
        probe.done(self._mass(probe, index))

    def _mass(self, probe: Probe, index: int) -> float:
        """``probe``'s targets' share of the softmax of the logits at batch ``index``."""
        import numpy as np

        n_vocab = self._ll.llama_vocab_n_tokens(self._vocab)
        logits = np.ctypeslib.as_array(self._ll.llama_get_logits_ith(self._ctx, index), shape=(n_vocab,))
        logits = logits.astype(np.float64)
        logits -= logits.max()
        p = np.exp(logits)
        return float(p[np.asarray(probe.targets, dtype=np.int64)].sum() / p.sum())

    def _end_probes(self) -> None:
        """Every queued probe ends with None (its batch failed, or the engine aborts)."""
        self._ll.llama_memory_seq_rm(self._mem, self._probe_seq, -1, -1)
        self._probe_tokens, self._probe_pending = [], []
        while self._probes:
            self._probes.popleft().done(None)

    def _fail_batch(self, rows, rc: int, events: list[ReplyEvent]) -> None:
        """llama_decode failed: end the replies in the batch and drop what their sequences hold."""
        seqs = {seq for _, _, seq, _ in rows}
        if self._probe_seq in seqs:
            self._end_probes()
        log.error("llama_decode failed (%d) on a batch of %d tokens in %d sequences", rc, len(rows), len(seqs))
        for r in [r for r in self._active if r._slot.seq in seqs]:
            r.error = ModelError(f"llama_decode failed ({rc})")
            self._clear(r._slot)
            self._finish(r, "error", events)

    def _finish(self, r: Reply, reason: str, events: list[ReplyEvent]) -> None:
        tail = ""
        if r._utf8 is not None and reason in ("stop", "length"):
            tail = r._utf8.decode(b"", final=True)
        if r in self._active:
            self._active.remove(r)
        if r in self._waiting:
            self._waiting.remove(r)
        if r._slot is not None:
            r._slot.reply, r._slot.used = None, time.perf_counter()
        if r._sampler is not None:
            if isinstance(r._sampler, GrammarSampler):
                r._sampler.free()
            else:
                self._ll.llama_sampler_free(r._sampler)
            r._sampler = None
        r._next, r._pending = None, []
        if r._probes:  # left before reading their words (cancelled): read on the probe sequence
            waiting = [p for _, p in r._probes]
            r._probes = []
            head = [self._probes.popleft()] if self._probe_pending else []
            self._probes.extendleft(reversed(head + waiting))
        r.stats = GenerationStats(
            prompt_tokens=r._prompt_tokens, cached_tokens=r._cached, completion_tokens=r._completion,
            dropped_messages=r._dropped, first_token_s=r._first_token_s,
            total_s=time.perf_counter() - r.submitted, finish_reason=reason, first_batch=r._first_batch)
        events.append(self._event(r, tail, r.stats, last=reason in ("stop", "length")))
