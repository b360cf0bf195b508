"""Every id the server hands out, minted here so their shapes are defined once.

Response objects follow OpenAI's prefixes: `chatcmpl-…`, `cmpl-…` for completions,
`resp_…`, `msg_…`, `rs_…`, `fc_…` for the Responses API, and `call_…` for tool calls.
"""

from __future__ import annotations

import secrets
import string
import uuid


def new_id(prefix: str) -> str:
    """`prefix` and 32 random hex digits; the prefix carries its own separator
    ("chatcmpl-", "resp_")."""
    return prefix + uuid.uuid4().hex


def new_call_id() -> str:
    """OpenAI-style tool call id: "call_" and 24 random hex digits."""
    return "call_" + secrets.token_hex(12)


def new_mistral_call_id() -> str:
    """Mistral's chat templates reject tool_call_ids that are not 9 alphanumerics, and
    clients send our ids back in the next request, so Mistral calls get that shape."""
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(9))
