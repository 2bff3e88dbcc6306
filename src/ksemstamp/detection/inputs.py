"""What a detection record must hold to be scored, and what it says of how it was made.

``text_problem`` and ``key_problem`` say why a record cannot be scored (a missing or mistyped
field, another key's fingerprint); ``identity_fields`` are what a generation record carries of
the settings a detector must share with its generator (``settings.identity``), and
``mismatch`` which of them a detector's differ in (``--strict`` refuses such a record).
``record_problem``, ``record_prompts`` and ``detection_row`` are the one way a record is
checked, read and answered: the command line's JSONL runs and the web page's uploads both
build their rows with them.
"""

from __future__ import annotations

from typing import Any

from ..settings.identity import (  # noqa: F401  (identity_fields: re-exported)
    describe_differences,
    differences,
    identity_fields,
    identity_fingerprint,
    shown_names,
)


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


def mismatch(data: dict, identity: dict[str, Any] | None) -> tuple[list[str], str]:
    """The identity settings a record was made under that differ from ``identity`` (the
    detector's), and the differences in words; ``([], "")`` for a record without an identity
    (an older one) or one that agrees. The record's identity is read itself, never taken on
    its fingerprint's word."""
    recorded = data.get("identity")
    if identity is None or not isinstance(recorded, dict):
        return [], ""
    names = differences(recorded, identity)
    return shown_names(names), describe_differences(recorded, identity, names) if names else ""


REFUSED = "made under other identity settings than it would be scored with"
"""How ``strict_problem``'s error for a record of other identity settings starts."""
UNSHOWN = "made under identity settings it does not show"
"""How ``strict_problem``'s error for a record without a valid identity starts."""


def refused(error: Any) -> bool:
    """Whether a record's ``error`` is ``strict_problem``'s (the run counts such records)."""
    return str(error or "").startswith((REFUSED, UNSHOWN))


def strict_problem(data: dict, identity: dict[str, Any] | None) -> str | None:
    """Why ``--strict`` refuses a record: it was made under other identity settings, or it does
    not show valid ones (no ``identity`` mapping, or an ``identity_fingerprint`` that is not its
    identity's)."""
    if identity is None:
        return None
    recorded = data.get("identity")
    if not isinstance(recorded, dict):
        why = (
            "no identity"
            if recorded is None
            else f"an identity that is a {type(recorded).__name__}"
        )
        return f"{UNSHOWN} ({why}); refused under --strict: detect it with the generator's settings"
    if data.get("identity_fingerprint") != identity_fingerprint(recorded):
        return (
            f"{UNSHOWN} (its identity_fingerprint is not its identity's); refused under "
            "--strict: a record edited since it was generated"
        )
    names, said = mismatch(data, identity)
    if not names:
        return None
    return f"{REFUSED} ({said}); refused under --strict: detect it with the generator's settings"


def record_problem(
    data: dict,
    fingerprint: str,
    identity: dict[str, Any] | None,
    strict: bool,
    max_chars: int | None = None,
) -> str | None:
    """Why a detection record cannot be scored, or ``None``: its fields, its length (text and
    prompt over ``max_chars``), another key, and under ``strict`` (``detection.strict``) other
    identity settings."""
    problem = text_problem(data)
    length = 0 if problem else len(data["text"]) + len(data.get("prompt") or "")
    if max_chars is not None and length > max_chars:
        problem = f"text and prompt are longer than the limit of {max_chars:,} characters"
    problem = problem or key_problem(data, fingerprint)
    if problem is None and strict:
        problem = strict_problem(data, identity)
    return problem


def record_prompts(datas: list[dict], chat: bool) -> list[str | None]:
    """The prompt each record is detected with: none for a chat answer (a record
    ``generate --chat`` wrote, or every record under ``chat``), which its instruction does not
    seed."""
    return [None if chat or d.get("chat") is True else d.get("prompt") or None for d in datas]


def detection_row(data: dict, result: Any, identity: dict[str, Any] | None) -> dict[str, Any]:
    """The output fields of a scored record: the result's, and the identity settings the record
    was made under that differ from the detector's (scored all the same: the p-value is exact,
    part of the evidence lost)."""
    row = result.to_record()
    names, said = mismatch(data, identity)
    if names:
        row["identity_mismatch"], row["identity_differences"] = names, said
    return row
