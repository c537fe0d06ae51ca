"""Chinese for the TTS front end: normalization, grapheme-to-pinyin, phonemes for Chinese voices.

Importing this package registers, with ``tts_engine.frontend``:

* ``normalize_zh`` as the text rules of every "zh" voice (numbers, dates, units, ...);
* phoneme_type "pinyin" (Piper's pinyin-symbol voices): ``ChinesePhonemizer("pinyin")``
  with Piper's pinyin id layout (``phonemes.pinyin_ids``);
* "espeak:zh" / "espeak:cmn" (espeak-ng ``cmn`` voices such as zh_CN-huayan-medium):
  ``ChinesePhonemizer("espeak")``, Piper's usual interspersed ids.

``configure(lexicon_path)`` sets the user lexicon (``tts.zh_lexicon_path``).
"""

from __future__ import annotations

from tts_engine.frontend import PhonemeScheme, register_language_rules, register_phoneme_type
from tts_engine.zh.normalize import normalize_zh
from tts_engine.zh.phonemes import pinyin_ids
from tts_engine.zh.phonemizer import ChinesePhonemizer, configure

__all__ = ["ChinesePhonemizer", "configure", "normalize_zh"]

for _language in ("zh", "cmn"):  # "cmn" when a voice config names only its espeak voice
    register_language_rules(_language, normalize_zh)
    register_phoneme_type(f"espeak:{_language}", PhonemeScheme(lambda _config: ChinesePhonemizer("espeak")))
register_phoneme_type("pinyin", PhonemeScheme(lambda _config: ChinesePhonemizer("pinyin"), encode=pinyin_ids))
