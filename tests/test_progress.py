"""Progress without a terminal: plain lines, not one line of carriage returns."""

from __future__ import annotations

import io
import sys

from ksemstamp.plots import progress_bar as bar


def test_without_a_terminal_each_state_is_one_line(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    with bar(total=3, desc="generate", unit="prompt", mininterval=0) as b:
        for _ in range(3):
            b.update(1)
    lines = err.getvalue().splitlines()
    assert "\r" not in err.getvalue() and len(lines) >= 2
    assert lines[0].startswith("generate:   0%") and "3/3" in lines[-1]


def test_disabled_shows_nothing_and_a_terminal_gets_tqdm_s_own_bar(monkeypatch):
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    for _ in bar(range(3), disable=True):
        pass
    assert err.getvalue() == ""
    monkeypatch.setattr(err, "isatty", lambda: True, raising=False)
    shown = bar(total=1, mininterval=0)
    assert not hasattr(shown.fp, "last")  # tqdm's own writer, not the line writer
    shown.close()
