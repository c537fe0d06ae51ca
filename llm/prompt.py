"""Chat prompts for a GGUF model: the model's chat template, tokens, and fitting a context.

``ChatPrompt(llm).fit(messages, budget, cut)`` renders ``messages`` with the chat
template stored in the GGUF and tokenizes them. When they do not fit ``budget``
tokens, the oldest non-system messages are dropped (system messages and the last
message are kept; the kept part starts with a user message), down to half the
budget, and the cut is returned: passed back on the next turn it is reused while it
still fits, so the prompt's prefix (and the KV cache holding it) stays the same over
the following turns instead of changing at every turn.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from base.errors import InvalidInput, ModelError
from llm.tool_format import ToolFormat

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class Cut:
    """Where a long history was cut: the first message kept after the system messages."""

    role: str
    content: str


@dataclass(frozen=True)
class FittedPrompt:
    tokens: list[int]
    dropped: int  # oldest non-system messages left out
    cut: Cut | None


class ChatPrompt:
    """Renders and tokenizes chat messages for one model (``llama_cpp.Llama``)."""

    def __init__(self, llm) -> None:
        self._llm = llm
        self._template = _template(llm)
        #: How this template shows tools and calls, and how the model writes calls (llm/tool_format.py).
        self.tool_format = ToolFormat.for_template(self._template.template)
        self._fold_system = not _takes_system_role(self._template)
        if self._fold_system:
            log.info("the GGUF's chat template refuses a system message: the system prompt opens the first user turn")

    @property
    def llm(self):  # noqa: ANN201 - llama_cpp.Llama
        """The model (tokenizer and vocabulary)."""
        return self._llm

    def text(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> str:
        """The prompt text ``tokens`` tokenizes (the chat template's rendering)."""
        return render(self._template, self.tool_format, messages, tools, self._fold_system)

    def tokens(self, messages: Sequence[dict], tools: Sequence[dict] = ()) -> list[int]:
        """Prompt tokens of ``messages``, ending with the assistant's generation prompt.

        ``tools`` (Chat Completions shape) and the messages' ``tool_calls`` / ``tool`` results are
        shown as the template's family does (``ToolFormat.messages``)."""
        prompt = self.text(messages, tools)
        # The template writes the special tokens itself (added_special), so no BOS here.
        return self._llm.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)

    def system_prefix(self, system_prompt: str) -> list[int]:
        """Tokens every conversation starting with ``system_prompt`` begins with."""
        a = self.tokens([{"role": "system", "content": system_prompt}, {"role": "user", "content": "A"}])
        b = self.tokens([{"role": "system", "content": system_prompt}, {"role": "user", "content": "B"}])
        return a[:common_prefix(a, b)]

    def fit(self, messages: Sequence[dict], budget: int, cut: Cut | None = None,
            tools: Sequence[dict] = ()) -> FittedPrompt:
        """Tokens of ``messages`` (and ``tools``) within ``budget`` tokens (module doc); raises InvalidInput
        if impossible."""
        check_messages(messages)
        system = [m for m in messages if m["role"] == "system"]
        rest = [m for m in messages if m["role"] != "system"]
        if cut is not None:  # reuse the last cut while it applies and fits
            n = _find(rest, cut)
            if n is not None and n < len(rest):
                tokens = self.tokens(system + rest[n:], tools)
                if len(tokens) <= budget:
                    return FittedPrompt(tokens, n, cut)
        tokens = self.tokens(messages, tools)
        if len(tokens) <= budget:
            return FittedPrompt(tokens, 0, None)
        # Cut down to half the budget so the next turns fit under the same cut; the kept
        # part starts with a user message (templates expect user/assistant alternation).
        for n in range(1, len(rest)):
            if rest[n]["role"] != "user" and n < len(rest) - 1:
                continue
            tokens = self.tokens(system + rest[n:], tools)
            if len(tokens) <= budget // 2 or (n == len(rest) - 1 and len(tokens) <= budget):
                log.info("LLM prompt over the context: dropped the %d oldest messages", n)
                return FittedPrompt(tokens, n, Cut(rest[n]["role"], rest[n]["content"]))
        raise InvalidInput(f"prompt needs {len(tokens)} tokens; the context leaves {budget}")


def render(template, tool_format: ToolFormat, messages: Sequence[dict], tools: Sequence[dict] = (),  # noqa: ANN001
           fold_system: bool = False) -> str:
    """The prompt text of ``messages`` (and ``tools``) through a llama-cpp-python ``Jinja2ChatFormatter``."""
    shown = None
    if tools or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        messages, shown = tool_format.messages(messages, tools)
    return template(messages=alternating(messages, fold_system=fold_system), tools=shown).prompt


def alternating(messages: Sequence[dict], fold_system: bool = False) -> list[dict]:
    """``messages`` with each run of same-role messages joined into one (contents on lines of their own).

    A conversation holds two user messages in a row when the reply between them was cancelled before
    any of it was heard (it leaves the history), or when a client adds two user items. Many chat
    templates (Mistral, Llama 2, Gemma) raise "roles must alternate" on that; joined, every template
    reads it as the one turn it was to the user ("How long does it take?" … "to boil an egg").
    ``fold_system``: for templates with no system role (Gemma 2: "System role not supported"), the system
    messages open the first user message instead.
    """
    if fold_system:
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        messages = [m for m in messages if m["role"] != "system"]
        if system:
            first = messages[0]["content"] if messages and messages[0]["role"] == "user" else None
            messages = [{"role": "user", "content": system if first is None else f"{system}\n\n{first}"},
                        *messages[1 if first is not None else 0:]]
    out: list[dict] = []
    for m in messages:
        if out and out[-1]["role"] == m["role"] and m["role"] in ("user", "assistant") and not (
                m.get("tool_calls") or out[-1].get("tool_calls")):
            out[-1]["content"] = f"{out[-1]['content']}\n{m['content']}"
        else:
            out.append(dict(m))
    return out


def _takes_system_role(template) -> bool:  # noqa: ANN001 - a llama_cpp Jinja2ChatFormatter
    """False when rendering a system message raises in ``template`` (and a user message alone does not)."""
    user = {"role": "user", "content": "Hi."}
    try:
        template(messages=[{"role": "system", "content": "Be brief."}, user])
    except Exception:  # noqa: BLE001 - templates raise what they like (jinja2 errors, ValueError)
        template(messages=[user])  # a template that fails on this too is broken: let that raise
        return False
    return True


def _find(rest: Sequence[dict], cut: Cut) -> int | None:
    for i, m in enumerate(rest):
        if m["role"] == cut.role and m["content"] == cut.content:
            return i
    return None


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


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token lists."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def check_messages(messages: Sequence[dict]) -> None:
    """Chat Completions messages: a role of ``ROLES`` and str content (an assistant message with
    ``tool_calls`` may have none; a ``tool`` message names its ``tool_call_id``)."""
    if not messages:
        raise InvalidInput("no messages")
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InvalidInput(f"bad chat message {m!r}: need role in {ROLES}")
        calls_only = m["role"] == "assistant" and m.get("tool_calls") and m.get("content") is None
        if not (calls_only or isinstance(m.get("content"), str)) or (m["role"] == "tool" and not m.get("tool_call_id")):
            raise InvalidInput(f"bad chat message {m!r}: need str content (and a tool_call_id for a tool result)")
