"""The batched sampler's bookkeeping, without a model: ordered acceptance and row ranges."""

import torch

from ksemstamp.generation.batched import _segments
from ksemstamp.generation.cutter import separator as _separator
from ksemstamp.generation.draw import _resolve
from ksemstamp.generation.engine import Candidate, GroupResult


def _cand(accepted: bool) -> Candidate:
    return Candidate("A sentence.", 3, accepted)


def test_a_group_closes_only_when_every_row_before_its_accepted_one_finished():
    outcome = [
        [_cand(False), None, _cand(True)],  # row 1 still runs: open, whatever row 2 says
        [_cand(False), _cand(True), None],  # row 1 accepted, rows before it done: closed
        [_cand(False), _cand(False)],  # all finished, none accepted: closed
    ]
    resolved, results = [False] * 3, [GroupResult() for _ in outcome]
    _resolve(outcome, resolved, results)
    assert resolved == [False, True, True]
    assert results[0].candidates == [] and results[0].accepted_index is None
    assert results[1].accepted_index == 1 and len(results[1].candidates) == 2
    assert results[2].accepted_index is None and len(results[2].candidates) == 2
    outcome[0][1] = _cand(False)  # the missing row finishes rejected: row 2 wins
    _resolve(outcome, resolved, results)
    assert resolved[0] and results[0].accepted_index == 2 and len(results[0].candidates) == 3


def test_segments_are_contiguous_ranges_with_each_groups_generator():
    gens = [torch.Generator().manual_seed(i) for i in range(3)]
    segments = _segments([0, 0, 2, 2, 2], gens)
    assert [(a, b) for a, b, _ in segments] == [(0, 2), (2, 5)]
    assert segments[0][2] is gens[0] and segments[1][2] is gens[2]


def test_separator_keeps_the_models_newlines():
    assert _separator(" Next.") == " "
    assert _separator("\n\nNext.") == "\n\n"
    assert _separator("Next.") == " "
