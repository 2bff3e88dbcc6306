"""What the sentence encoder reads of a sentence: its words, without the markup of the web.

A sentence's score comes from its meaning, so text that carries none should not move it. Three
kinds of web markup do, and they recur across the texts of one source, so they make texts that
share them score alike under a key (measured on health-news tweets in docs/evaluation/README.md,
"Web markup and the false positives of one account"):

* **web addresses** (``https://...``, ``www....``, and shortened links such as ``bit.ly/x``) are
  left out: a link's characters are an arbitrary string, the same site's links share a prefix,
  and a link can be added or removed without changing what the text says;
* **HTML character references** (``&amp;``, ``&gt;``, ``&#39;``) are read as the characters they
  stand for, as a browser shows them;
* the ``@`` of a handle and the ``#`` of a hashtag are dropped, and the word is kept
  (``#NHS`` reads as ``NHS``).

Everything else is read as it is. A sentence that is nothing but markup (a bare link) is read as
it is too, so that such sentences do not all read as the same empty string.

``reading_form`` is applied by every encoder pass of the mark (``scheme.encoding.embed``,
and the training module's forward pass), so generation, detection, calibration, centroid fitting
and training read sentences alike. Sentences themselves, their offsets and what is shown to a
user are unchanged. ``READING_VERSION`` names this rule in caches of embeddings.
"""

from __future__ import annotations

import html
import re

READING_VERSION = 2
"""Bumped whenever ``reading_form`` changes what the encoder reads (1: the sentence as it was)."""

_WEB_ADDRESS = re.compile(
    r"(?:https?://|www\.)\S+"  # a link with its scheme or www.
    r"|\b[\w-]+(?:\.[\w-]+)*\.(?:com|org|net|edu|gov|ly|co|io|me|rs|gl|be|us|uk|de)/\S*",  # short links
    re.IGNORECASE,
)
_HANDLE_OR_TAG = re.compile(r"(?<![\w@#])(?:@(?=\w)|#(?=[^\W\d]))")


def reading_form(sentence: str) -> str:
    """``sentence`` as the encoder reads it (see the module docstring)."""
    if not any(mark in sentence for mark in ("/", "&", "@", "#", "www.")):
        return sentence
    text = html.unescape(sentence) if "&" in sentence else sentence
    text = _WEB_ADDRESS.sub(" ", text)
    text = _HANDLE_OR_TAG.sub("", text)
    text = " ".join(text.split())
    return text or sentence
