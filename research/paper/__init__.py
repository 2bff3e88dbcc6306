"""Measurements behind ``docs/paper.md`` (where this project differs from the SemStamp and
k-SemStamp papers), each a module run from the repository root as ``python -m research.paper.NAME``
that writes its JSON and Markdown beside it."""
