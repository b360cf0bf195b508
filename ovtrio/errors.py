"""The error any layer raises for a request field it cannot take.

The field is named where the problem is found: the prompt renderer (ovtrio/text), the
image reader (ovtrio/images), the output-format builder (ovtrio/api/formats.py), the
engine's check of sampling settings (ovtrio/scheduler) or an encoder (ovtrio/embedding).
The API layer answers every FieldError alike, as a 400 naming `param`
(ovtrio/api/errors.py). A module of its own, importing nothing of ovtrio, so that every
package can raise it.
"""

from __future__ import annotations


class FieldError(ValueError):
    """What the client sent cannot be used: the message says why, `param` names the
    request field at fault (None when the raiser cannot know it), `code` is OpenAI's
    error code."""

    def __init__(self, message: str, param: str | None, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param = param
        self.code = code

    def client_message(self) -> str:
        """The message the client reads."""
        return str(self)
