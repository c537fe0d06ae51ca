"""Chinese for the TTS front end: normalization, grapheme-to-pinyin, phonemes for Chinese voices.

``tts_engine.frontend`` imports this package on first use of a Chinese voice and registers:

* ``normalize_zh`` as the text rules of every "zh" voice (numbers, dates, units, ...);
* phoneme_type "pinyin" (Piper's pinyin-symbol voices): ``ChinesePhonemizer("pinyin")``
  with Piper's pinyin id layout (``phonemes.pinyin_ids``);
* "espeak:zh" / "espeak:cmn" (espeak-ng ``cmn`` voices such as zh_CN-huayan-medium):
  ``ChinesePhonemizer("espeak")``, Piper's usual interspersed ids.

This package never imports the front end (imports run one way: frontend -> zh -> espeak).

``configure(lexicon_path)`` sets the user lexicon (``tts.zh_lexicon_path``).
"""

from __future__ import annotations

from tts_engine.zh.normalize import normalize_zh
from tts_engine.zh.phonemes import pinyin_ids
from tts_engine.zh.phonemizer import ChinesePhonemizer, configure

__all__ = ["ChinesePhonemizer", "configure", "normalize_zh", "pinyin_ids"]
