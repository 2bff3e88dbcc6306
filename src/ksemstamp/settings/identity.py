"""What a detector must share with the generator of a text: its identity settings.

A text is scored as its generator wrote it only under the same encoder, the same centroids (or
LSH hyperplanes), the same mark with the same identity settings (``MarkSettings.identity``:
the units, the context, the components projected out, ...) and the same key. The key has its
own fingerprint in every record; the rest is the *identity* (``identity_of``), written into
every record a generation makes (``identity`` and ``identity_fingerprint``), so that a detector
can tell which of its settings differ from the generator's (``differences``). Under other
identity settings a text's p-value is still exact (the null does not depend on the text), but
the evidence the generator put in is partly thrown away: ``detect`` says so per record
(``identity_mismatch``) and once on stderr, and ``--strict`` refuses such records.

Settings of how hard generation tried (``search``, ``sampling``) and of detection
(``detection``) are not part of the identity.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any


def identity_of(settings: Any, encoder: str, centroids: str | None) -> dict[str, Any]:
    """The identity of ``WatermarkSettings`` ``settings`` with the encoder it loaded
    (``encoder``: its weights' fingerprint, or its name where it has none) and the content
    fingerprint of its centroids (``None``: an LSH partition), as a flat mapping of dotted
    names (``mark.units``) to values."""
    out: dict[str, Any] = {"encoder": encoder, "partition.kind": settings.partition.kind}
    if centroids is None:
        out["partition.lsh_bits"] = settings.partition.lsh_bits
        out["partition.lsh_seed"] = settings.partition.lsh_seed
    else:
        out["partition.centroids"] = centroids
    out |= {f"mark.{name}": value for name, value in settings.mark.identity().items()}
    return out


def identity_fingerprint(identity: dict[str, Any]) -> str:
    """A short hash of an identity (``identity_of``)."""
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def identity_fields(identity: dict[str, Any] | None) -> dict[str, Any]:
    """What a generation record carries of its identity settings (none when unknown)."""
    if identity is None:
        return {}
    return {"identity": identity, "identity_fingerprint": identity_fingerprint(identity)}


def differences(recorded: Any, here: dict[str, Any]) -> list[str]:
    """The identity settings a record's ``recorded`` identity gives other values than ``here``
    (``[]`` when they agree, or when the record carries none: an older record)."""
    if not isinstance(recorded, dict):
        return []
    names = sorted(set(recorded) | set(here), key=str)
    return [n for n in names if recorded.get(n) != here.get(n)]


def describe_differences(recorded: dict[str, Any], here: dict[str, Any], names: list[str]) -> str:
    """``mark.units: clauses there, sentences here; ...`` for the settings ``names`` (each name
    and value cut to ``SHOWN`` characters, at most ``MOST_NAMES`` settings)."""
    said = "; ".join(
        f"{shown(n)}: {shown(recorded.get(n))} there, {shown(here.get(n))} here"
        for n in names[:MOST_NAMES]
    )
    return said + (f"; and {len(names) - MOST_NAMES:,} more" if len(names) > MOST_NAMES else "")


def shown_names(names: list[str]) -> list[str]:
    """``names`` as a record echoes them: each cut to ``SHOWN`` characters, at most
    ``MOST_NAMES`` of them."""
    return [shown(n) for n in names[:MOST_NAMES]]


SHOWN = 80
"""Characters of a recorded name or value a message quotes (a record can hold anything)."""
MOST_NAMES = 20
"""Settings a message names at most."""


def shown(value: Any) -> str:
    """``value`` as a message quotes it: at most ``SHOWN`` characters, then its length."""
    text = "unset" if value is None else str(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text):,} characters)"
