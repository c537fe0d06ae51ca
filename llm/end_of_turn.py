"""End of turn from the words: how likely the configured LLM thinks the user's sentence is over.

    words = TextEndOfTurn.for_chat(engine)         # None: the GGUF's template gives no usable prompt
    tokens = words.tokens("How long does it take?", conversation)   # system prompt + history so far
    engine.probe(words.probe("How long does it take?", conversation, done, session))  # done(p), engine thread

The prompt is the chat template's rendering of the conversation as the reply reads it (system
prompt, history: the last assistant turn is what the user answers) and a user turn holding the
transcript as the reply reads it but for its closing punctuation (so whisper's own full stop or
question mark does not answer the question), cut right after the words: the model is asked what
comes next. The score is the probability that the next token ends the sentence: the vocabulary's
sentence-end tokens (``?``, ``.``, ``!``, ``？``, ``。``, ``！`` and runs of them, newline forms) and
its end-of-generation tokens (``<|im_end|>``, the template's end of turn). With SmolLM2-135M a head
such as "How long does it take" scores under 0.01 (the model expects " to"), a finished sentence
0.05-0.94 (docs/protocol.md, "End of turn from words and sound").

Because the prompt is the start of the speculative reply's own prompt, the engine reads the score
from that reply's logits at the words' last token (``BatchedChat.probe``): no token is read twice.
A probe with no such reply is one prefill on a sequence of its own, from the longest cached prefix
it shares, no decode, nothing kept. (The words lowercased and without any punctuation separated the
set no better and share no prefix with the reply: docs/architecture.md, "Words and sound".)
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from base.errors import ModelError

log = logging.getLogger(__name__)

#: Pieces made only of these (and spaces) end a sentence.
SENTENCE_END = frozenset("?.!？。！")
_MARK = "\u2063voxloop\u2063"  # where the transcript goes in the rendered template
_CLOSING = re.compile(r"[^\w']+$", re.UNICODE)  # closing punctuation and spaces


def words_of(transcript: str) -> str:
    """``transcript`` as the reply reads it (stripped), without its closing punctuation."""
    return _CLOSING.sub("", transcript.strip())


def sentence_end_tokens(llm) -> list[int]:  # noqa: ANN001 - a llama_cpp.Llama
    """Token ids of ``llm``'s vocabulary that end a sentence (module doc)."""
    import llama_cpp

    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    out = []
    for token in range(llm.n_vocab()):
        if llama_cpp.llama_vocab_is_eog(vocab, token):
            out.append(token)
            continue
        piece = llm.detokenize([token], special=True).decode("utf-8", "ignore")
        bare = piece.strip()
        if (bare and set(bare) <= SENTENCE_END) or (piece and not bare and "\n" in piece):
            out.append(token)
    return out


class TextEndOfTurn:
    """Prompts and targets of the words' end-of-turn score for one GGUF (``llm.prompt.ChatPrompt``)."""

    def __init__(self, prompt) -> None:  # noqa: ANN001 - llm.prompt.ChatPrompt
        self._prompt = prompt
        self.targets = sentence_end_tokens(prompt.llm)
        if self._render((), "x") is None or not self.targets:
            raise ModelError("the chat template gives no prompt to score a transcript with")

    @classmethod
    def for_chat(cls, chat) -> "TextEndOfTurn | None":  # noqa: ANN001 - llm.batched.BatchedChat
        """For ``chat``'s model; None (said once in the log) when its template cannot be used."""
        try:
            return cls(chat.prompt)
        except Exception as exc:  # noqa: BLE001 - templates raise what they like
            log.warning("no end-of-turn score from the words (%s): the end of turn is the audio's alone", exc)
            return None

    def tokens(self, transcript: str, conversation: Sequence[dict] = (), tools: Sequence[dict] = ()) -> list[int]:
        """Prompt tokens asking what follows ``transcript`` (its closing punctuation cut here) in
        ``conversation`` (chat messages: system prompt and history) with ``tools`` (Chat Completions
        functions), as the reply's prompt has them."""
        words = words_of(transcript)
        head = self._render(conversation, words, tools)
        if head is None:  # e.g. a template that refuses this history's roles: the words alone
            head = self._render((), words, tools)
        assert head is not None  # checked at start
        return self._prompt.llm.tokenize(head.encode("utf-8"), add_bos=False, special=True)

    def probe(self, transcript: str, conversation: Sequence[dict], done, session=None,  # noqa: ANN001
              tools: Sequence[dict] = ()):  # noqa: ANN201 - llm.batched.Probe
        """The ``llm.batched.Probe`` that scores ``transcript`` after ``conversation``: ``done(probability)``
        on the engine thread; its prompt as ``tokens``, and ``short_tokens`` for a cut history."""
        from llm.batched import Probe

        return Probe(self.tokens(transcript, conversation, tools), self.targets, done, session=session,
                     short=self.short_tokens(transcript, conversation, tools))

    def short_tokens(self, transcript: str, conversation: Sequence[dict] = (), tools: Sequence[dict] = ()) -> list[int]:
        """``tokens`` with only the system messages and the last assistant turn of ``conversation``
        (for when the conversation's cached history is not the one the prompt has: a cut history)."""
        system = [m for m in conversation if m.get("role") == "system"]
        last = [m for m in conversation if m.get("role") == "assistant" and isinstance(m.get("content"), str)][-1:]
        return self.tokens(transcript, system + last, tools)

    def _render(self, conversation: Sequence[dict], words: str, tools: Sequence[dict] = ()) -> str | None:
        """The template's text up to the user's words, or None when it cannot render the turn."""
        try:
            text = self._prompt.text([*conversation, {"role": "user", "content": _MARK}], tools)
        except Exception:  # noqa: BLE001 - e.g. "conversation roles must alternate user/assistant"
            return None
        at = text.find(_MARK)
        return None if at < 0 else text[:at] + words
