"""Chinese transcript post-processing: Traditional -> Simplified characters (OpenCC).

Whisper often writes Mandarin in Traditional characters; a session whose language
is Chinese wants Simplified (``asr.zh_simplified``). OpenCC's ``t2s`` conversion
is phrase-aware (乾淨 -> 干净 but 乾隆 stays), unlike a character table.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from base.errors import ModelError

_lock = threading.Lock()


@lru_cache(maxsize=1)
def _converter():
    try:
        import opencc
    except ImportError as exc:
        raise ModelError(
            f"Traditional->Simplified conversion needs OpenCC (`pip install opencc==1.4.2`): {exc}"
        ) from None
    return opencc.OpenCC("t2s")


def to_simplified(text: str) -> str:
    """Traditional Chinese characters in ``text`` -> Simplified; other text unchanged."""
    if not text:
        return text
    converter = _converter()
    with _lock:  # one converter object; OpenCC's thread safety is not documented
        return converter.convert(text)


def is_chinese_language(language: str | None) -> bool:
    """True for "zh", "zh-CN", "zh_TW", "cmn", "yue"... (whisper reports "zh")."""
    return bool(language) and language.replace("_", "-").split("-")[0].lower() in ("zh", "cmn", "yue")


def postprocess_transcript(text: str, language: str | None, simplified: bool = True) -> str:
    """Apply ``to_simplified`` when ``language`` is Chinese and ``simplified`` (``asr.zh_simplified``)."""
    if simplified and is_chinese_language(language):
        return to_simplified(text)
    return text
