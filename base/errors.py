"""One exception hierarchy for the whole project.

Every error a client can see carries a stable ``code`` (used in the protocol's
``error`` event and in the ``errors_total{code}`` metric) and a human message.
"""

from __future__ import annotations


class VoxloopError(Exception):
    """Base of every error raised on purpose by voxloop."""

    code = "internal_error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self)


class ConfigError(VoxloopError):
    """Bad configuration: unknown key, wrong type, missing file."""

    code = "invalid_config"


class ModelError(VoxloopError):
    """A model could not be found, assembled or loaded."""

    code = "model_error"


class ModelUnavailable(ModelError):
    """A model behind a network server could not be reached, stopped answering or broke off a reply
    (``llm.backend = "openai"``); ``/ready`` reports it until the server answers again."""


class InvalidInput(VoxloopError):
    """Input that cannot be processed: empty text, bad audio, bad ids."""

    code = "invalid_request_error"


class Overloaded(VoxloopError):
    """Capacity exhausted; retry after ``retry_after_ms``."""

    code = "server_overloaded"

    def __init__(self, message: str, *, retry_after_ms: int = 2000) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class ConnectionFailed(VoxloopError):
    """A client could not reach the server, was refused the WebSocket, or lost it.

    ``status`` is the HTTP status of a refused upgrade (401, 403, 404…; a full server's
    503 raises ``Overloaded`` instead); ``close_code`` the WebSocket close code, if any.
    """

    code = "connection_failed"

    def __init__(self, message: str, *, status: int | None = None, close_code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.close_code = close_code


class Cancelled(VoxloopError):
    """Work for a turn or request was cancelled (barge-in, client cancel)."""

    code = "cancelled"


class ProtocolError(InvalidInput):
    """A WebSocket message that breaks the protocol (bad JSON, missing field, bad audio).

    ``code`` is one of the stable protocol error codes (see ``docs/protocol.md``);
    ``param`` is the dotted path of the offending field (``"session.audio.input.format.rate"``)
    or None; ``event_id`` is the client's event id when it could be read.
    """

    def __init__(
        self, code: str, message: str, *, param: str | None = None, event_id: str | None = None
    ) -> None:
        super().__init__(message, code=code)
        self.param = param
        self.event_id = event_id
