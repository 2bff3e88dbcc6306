"""What a detection record must hold to be scored, and what it says of how it was made.

``text_problem`` and ``key_problem`` say why a record cannot be scored (a missing or mistyped
field, another key's fingerprint); ``identity_fields`` are what a generation record carries of
the settings a detector must share with its generator (``settings.identity``), and
``mismatch`` which of them a detector's differ in (``--strict`` refuses such a record).
The command line's JSONL runs and the web page's uploads both use them.
"""

from __future__ import annotations

from typing import Any

from ..settings.identity import describe_differences, differences, identity_fingerprint


def text_problem(data: dict) -> str | None:
    """Why a detection record cannot be scored as it is: a missing or non-string ``text``, a
    ``prompt`` that is neither a string nor null, a ``chat`` that is not true or false."""
    if "text" not in data:
        return "missing field 'text'"
    if not isinstance(data["text"], str):
        return f"'text' must be a string, got {type(data['text']).__name__}"
    prompt = data.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        return f"'prompt' must be a string or null, got {type(prompt).__name__}"
    chat = data.get("chat")
    if chat is not None and not isinstance(chat, bool):
        return f"'chat' must be true or false, got {type(chat).__name__}"
    return None


def key_problem(data: dict, fingerprint: str) -> str | None:
    """Why a record made under another key (its ``key_fingerprint``) cannot be scored here."""
    if data.get("key_fingerprint") not in (None, fingerprint):
        return (
            "this text was generated with a different key (fingerprint "
            f"{data['key_fingerprint']}, detector {fingerprint})"
        )
    return None


def identity_fields(identity: dict[str, Any] | None) -> dict[str, Any]:
    """What a generation record carries of its identity settings (none when unknown)."""
    if identity is None:
        return {}
    return {"identity": identity, "identity_fingerprint": identity_fingerprint(identity)}


def mismatch(data: dict, identity: dict[str, Any] | None) -> tuple[list[str], str]:
    """The identity settings a record was made under that differ from ``identity`` (the
    detector's), and the differences in words; ``([], "")`` for a record without an identity
    (an older one) or one that agrees."""
    if identity is None:
        return [], ""
    recorded = data.get("identity")
    if data.get("identity_fingerprint") == identity_fingerprint(identity):
        return [], ""
    names = differences(recorded, identity)
    return names, describe_differences(recorded, identity, names) if names else ""


REFUSED = "made under other identity settings than it would be scored with"
"""How ``strict_problem``'s error starts (the run counts such records)."""


def strict_problem(data: dict, identity: dict[str, Any] | None) -> str | None:
    """Why ``--strict`` refuses a record: it was made under other identity settings."""
    names, said = mismatch(data, identity)
    if not names:
        return None
    return f"{REFUSED} ({said}); refused under --strict: detect it with the generator's settings"
