"""Which client events need which model stages, for servers that run only some (``server.stages``).

A TTS-only server (``server.stages = ["tts"]``) serves ``x.tts.speak``; an event that needs
a stage it does not run gets an ``unsupported_event_type`` error naming the config key,
and has no other effect (the session goes on). Events that need no model
(``session.update``, ``conversation.item.create``, ``input_audio_buffer.clear``, ...) work
with any stages.
"""

from __future__ import annotations

from typing import Any

from realtime import events as ev
from realtime.wire import ErrorCode
from base.errors import InvalidInput

#: Client event type -> the stages it needs. Audio input becomes a voice turn (ASR, then the LLM).
NEEDED_STAGES: dict[type, tuple[str, ...]] = {
    ev.InputAudioBufferAppend: ("asr", "llm"),
    ev.InputAudioBufferCommit: ("asr", "llm"),
    ev.ResponseCreate: ("llm",),
    ev.XTtsSpeak: ("tts",),
}
#: The same in a transcription session (``session.type: "transcription"``): audio is only transcribed.
TRANSCRIPTION_STAGES: dict[type, tuple[str, ...]] = {
    ev.InputAudioBufferAppend: ("asr",),
    ev.InputAudioBufferCommit: ("asr",),
}

_STAGE_NAMES = {"asr": "speech recognition (asr)", "llm": "the language model (llm)", "tts": "speech (tts)"}


def missing_stage_error(event: Any, stages: tuple[str, ...], transcription: bool = False) -> InvalidInput | None:
    """The error for ``event`` when it needs a stage not in ``stages``, else None; ``transcription``:
    the session is a transcription session (it makes no responses)."""
    if transcription and isinstance(event, ev.ResponseCreate):
        return InvalidInput("response.create: a transcription session makes no responses (session.type is "
                            "'transcription')", code=ErrorCode.UNSUPPORTED_EVENT_TYPE)
    needed = (TRANSCRIPTION_STAGES if transcription else NEEDED_STAGES).get(type(event), NEEDED_STAGES.get(type(event), ()))
    missing = [s for s in needed if s not in stages]
    if not missing:
        return None
    needs = " and ".join(_STAGE_NAMES[s] for s in missing)
    served = "; x.tts.speak works" if stages == ("tts",) else ""
    if "asr" in stages and "llm" not in stages:
        served = "; transcription sessions work (session.type 'transcription' or ?intent=transcription)"
    return InvalidInput(
        f"{event.type} needs {needs}, which this server does not run "
        f"(server.stages = {list(stages)}){served}",
        code=ErrorCode.UNSUPPORTED_EVENT_TYPE,
    )
