"""One round of candidates, run over any ``Engine``: judging, ordered acceptance and pruning.

``draw_round`` opens a round and, between the engine's ``advance`` calls, judges the rows that
finished (the caller's ``Judge``: embedding, region, score), closes a group as soon as its outcome
is known and asks a ``Pruner`` which running rows go on. Acceptance is ordered, so that drawing
many rows at once does not change what is kept: a group closes once some accepted row ``i`` has
every row before it finished and rejected (rows after ``i`` are stopped, unfinished or not), or
when all its rows finished without an acceptance. The accepted unit is therefore the first valid
one of an i.i.d. sequence of candidates, exactly as in Algorithm 1, and not "whichever valid row
happened to be shortest".
"""

from __future__ import annotations

from .engine import (
    Candidate,
    Engine,
    GroupResult,
    Judge,
    Place,
    Pruner,
    PruneVerdict,
    Round,
    RoundRequest,
    Step,
)

Outcome = list[list[Candidate | None]]
"""``outcome[g][i]``: ``None`` while row ``i`` of group ``g`` runs, else its ``Candidate``."""


def draw_round(
    engine: Engine, request: RoundRequest, judge: Judge, pruner: Pruner | None = None
) -> list[GroupResult]:
    """Draw ``request.rows[g]`` candidates after ``request.prefixes[g]`` for every group ``g``
    with ``engine``, judged by ``judge`` and, optionally, pruned by ``pruner``.

    Returns one ``GroupResult`` per group with its candidates in draw order up to the first
    accepted one (or all of them when none was accepted).
    """
    results = [GroupResult() for _ in request.rows]
    outcome: Outcome = [[None] * n for n in request.rows]
    resolved = [False] * len(request.rows)
    round_ = engine.open(request)
    try:
        tokens = 0
        while True:
            until = None if pruner is None else (tokens // pruner.every + 1) * pruner.every
            step = round_.advance(until)
            _judge_finished(step, judge, outcome)
            _resolve(outcome, resolved, results)
            if pruner is not None and step.tokens is not None:
                tokens = step.tokens
                if tokens % pruner.every == 0:
                    _prune(pruner, tokens, round_, outcome, resolved)
                    _resolve(outcome, resolved, results)
            keep = _running(round_, outcome, resolved)
            _count_tokens(round_.retain(keep), outcome, results)
            if not keep:
                return results
    finally:
        round_.close()


def _judge_finished(step: Step, judge: Judge, outcome: Outcome) -> None:
    """Judge the rows that finished at ``step``; record their candidates."""
    if not step.finished:
        return
    verdicts = judge([f.place for f in step.finished], [f.text for f in step.finished])
    if len(verdicts) != len(step.finished):
        raise ValueError(f"the judge gave {len(verdicts)} verdicts for {len(step.finished)} rows")
    for f, (ok, info) in zip(step.finished, verdicts, strict=True):
        g, i = f.place
        accepted = bool(ok) and bool(f.text)
        outcome[g][i] = Candidate(
            f.text, f.num_tokens, accepted, info, f.truncated, f.separator, fluency=f.fluency
        )


def _running(round_: Round, outcome: Outcome, resolved: list[bool]) -> list[Place]:
    """The live rows of open groups that have not finished."""
    return [(g, i) for g, i in round_.live if not resolved[g] and outcome[g][i] is None]


def _prune(
    pruner: Pruner, tokens: int, round_: Round, outcome: Outcome, resolved: list[bool]
) -> None:
    """Ask ``pruner`` about the rows still running in open groups; mark the ones it stops and
    steer the ones it gives a new bias."""
    running = _running(round_, outcome, resolved)
    if not running:
        return
    texts = round_.partial_texts(running)
    finished = [[c for c in row if c is not None and not c.pruned] for row in outcome]
    verdict = pruner.decide(tokens, running, texts, finished)
    flags = verdict.go_on if isinstance(verdict, PruneVerdict) else verdict
    if len(flags) != len(running):
        raise ValueError(f"the pruner returned {len(flags)} flags for {len(running)} rows")
    if isinstance(verdict, PruneVerdict) and verdict.bias is not None:
        round_.steer(running, verdict.bias)
    for (g, i), go_on in zip(running, flags, strict=True):
        if not go_on:
            outcome[g][i] = Candidate("", round_.tokens_of((g, i)), False, pruned=True)


def _resolve(outcome: Outcome, resolved: list[bool], results: list[GroupResult]) -> None:
    """Close every group whose first accepted row has all rows before it finished, or whose rows
    all finished without an acceptance; a closed group keeps its candidates up to the accepted
    one (ordered acceptance, see the module docstring)."""
    for g, row_outcomes in enumerate(outcome):
        if resolved[g]:
            continue
        for i, cand in enumerate(row_outcomes):
            if cand is None:
                break
            if cand.accepted:
                results[g].accepted_index = i
                resolved[g] = True
                break
        else:
            resolved[g] = True  # every row finished, none accepted
        if resolved[g]:
            last = results[g].accepted_index
            kept = row_outcomes if last is None else row_outcomes[: last + 1]
            results[g].candidates = [c for c in kept if c is not None]


def _count_tokens(
    stopped: list[tuple[Place, int]], outcome: Outcome, results: list[GroupResult]
) -> None:
    """Add the tokens of the rows that stop now to their group's decoded tokens, and to its
    wasted ones when the row was pruned, unfinished, or drawn after the accepted one."""
    for (g, i), spent in stopped:
        results[g].decoded_tokens += spent
        cand = outcome[g][i]
        used = results[g].accepted_index
        if cand is None or cand.pruned or (used is not None and i > used):
            results[g].wasted_tokens += spent
