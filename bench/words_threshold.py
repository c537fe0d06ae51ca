"""The words' end-of-turn score inside conversations: what ``turn.words_threshold`` holds and what it
answers when the score is read after earlier turns, as the server reads it (llm/end_of_turn.py).

Replays ``bench.turn_taking``'s set as text, without audio: the same turns in the same order and
conversations (``--session-turns``; talker 0), the system prompt its sessions set, each user turn the
set's sentence (a short answer after the assistant's question it answers), each reply the configured
LLM's own (greedy, ``--max-tokens``). Before each turn is
added it scores the words said before each of the turn's pauses (its *heads*: a paused sentence's
head, a question's greeting) and the whole turn, after the conversation so far. Per threshold:
the heads held (score under it) and the whole turns answered (at or over it), by kind; read at a
``turn.words_sure`` candidate (0.2-0.5), the same row counts the heads only the sound can hold and the
whole turns a doubting sound makes wait ``turn.long_stop_ms``. What the
server scores is whisper's transcript, not the set's text: whisper sometimes drops a word or adds
one (docs/protocol.md, "Tuning the end of turn"); the replies are the ones a server with the same
settings gives to the set's text.

    python -m bench.words_threshold                       # the bundled model, conversations of 6
    python -m bench.words_threshold --set llm.model_path=MODEL.gguf
"""

from __future__ import annotations

import argparse
import sys

from bench.harness import add_output_arguments, write_json

#: Thresholds reported (the defaults among them: ``turn.words_threshold`` 0.03, ``turn.words_sure`` 0.5).
THRESHOLDS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.5)
#: The kinds ``bench.turn_taking`` runs for the words' must-shows.
KINDS = ("complete", "paused", "question", "paused_question", "midpause", "short")


def replay(chat, words, turns: list[dict], system: str, max_tokens: int) -> list[dict]:  # noqa: ANN001
    """Score every head and whole turn of one conversation of ``turns``; the replies in between."""
    from llm.batched import ReplyOptions

    def score(text: str, history: list[dict]) -> float | None:
        out: list = []
        chat.probe(words.probe(text, history, out.append, session="replay"))  # from the conversation's cache
        while not out:
            chat.step()
        return out[0]

    history = [{"role": "system", "content": system}]
    rows = []
    for t in turns:
        if t.get("asked"):  # the assistant's question a short answer answers, as bench.turn_taking adds it
            history.append({"role": "assistant", "content": t["asked"]})
        rows.append({"name": t["name"], "kind": t["kind"], "heads": [[h, score(h, history)] for h in t["heads"]],
                     "whole": score(t["text"], history), "at_turn": (len(history) - 1) // 2})
        history.append({"role": "user", "content": t["text"]})
        reply, _ = chat.generate("replay", history, ReplyOptions(max_tokens=max_tokens))
        history.append({"role": "assistant", "content": reply.strip()})
    chat.release("replay")
    return rows


def summarize(rows: list[dict], thresholds=THRESHOLDS) -> list[dict]:  # noqa: ANN001
    """Per threshold: heads held and whole turns answered, by kind (``held_<kind>`` / ``answered_<kind>``
    as "n/of")."""
    kinds = sorted({r["kind"] for r in rows})
    out = []
    for th in thresholds:
        row: dict = {"threshold": th}
        for kind in kinds:
            heads = [s for r in rows if r["kind"] == kind for _, s in r["heads"] if s is not None]
            if heads:
                row[f"held_{kind}"] = f"{sum(s < th for s in heads)}/{len(heads)}"
            whole = [r["whole"] for r in rows if r["kind"] == kind and r["whole"] is not None]
            row[f"answered_{kind}"] = f"{sum(s >= th for s in whole)}/{len(whole)}"
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    from base.config import load_config
    from bench.turn_set import SHORT, conversations, set_texts
    from llm.batched import BatchedChat
    from llm.end_of_turn import TextEndOfTurn

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", help="a voxloop config file (default: configs/default.toml)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="a config setting, as `voxloop --set` (e.g. llm.model_path=MODEL.gguf)")
    p.add_argument("--kinds", nargs="+", default=list(KINDS))
    p.add_argument("--session-turns", type=int, default=6, help="a new conversation every N turns")
    p.add_argument("--max-tokens", type=int, default=48, help="reply length (bench.turn_taking's runs: 48)")
    p.add_argument("--name", default="words_threshold")
    add_output_arguments(p)
    args = p.parse_args(argv)
    cfg = load_config(args.config, [*args.overrides, "llm.temperature=0"])
    turns = [t for t in set_texts() if t["kind"] in args.kinds]
    chat = BatchedChat.from_config(cfg)
    try:
        words = TextEndOfTurn.for_chat(chat)
        if words is None:
            print("this model's chat template gives no words' score (see the log)", file=sys.stderr)
            return 1
        rows = [dict(r, conversation=i) for i, conv in enumerate(conversations(turns, 0, args.session_turns))
                for r in replay(chat, words, conv, SHORT, args.max_tokens)]
    finally:
        chat.close()
    summary = summarize(rows)
    for row in summary:
        print(row, flush=True)
    path = write_json(args.name, summary, {"turns": rows, "default_threshold": cfg.turn.words_threshold,
                                           "default_sure": cfg.turn.words_sure,
                                           "session_turns": args.session_turns, "max_tokens": args.max_tokens},
                      out=args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
