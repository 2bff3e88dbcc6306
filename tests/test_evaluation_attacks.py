"""Paraphrase attacks with a scripted paraphraser and encoder (no models)."""

import pytest
import torch

from ksemstamp.evaluation.attacks import Attack, bigram_overlap, select_bigram

ORIGINAL = "the council approved the new budget on monday."
# Candidate -> cosine with the original (the scripted encoder below realises these exactly).
CANDIDATES = {
    "the council approved the new budget on tuesday.": 0.97,  # high overlap, very similar
    "on monday the budget was approved by the council.": 0.90,  # low overlap, within bound
    "monday saw a fresh budget passed by councillors.": 0.85,  # lowest overlap, within bound
    "councils are groups of elected people.": 0.40,  # no overlap, but drifted: out of bound
}


class ScriptedParaphraser:
    def __init__(self, table):
        self.table = table
        self.calls = []

    def candidates(self, sentences):
        self.calls.append(list(sentences))
        return [list(self.table.get(s, [])) for s in sentences]


class ScriptedEncoder:
    """Unit vectors whose cosine with ``ORIGINAL``'s vector is the scripted similarity."""

    def __init__(self, sims):
        self.sims = sims

    def encode(self, texts, convert_to_tensor=True, show_progress_bar=False):
        rows = []
        for t in texts:
            s = self.sims.get(t, 1.0)
            rows.append(torch.tensor([s, (1 - s * s) ** 0.5]))
        return torch.stack(rows)


class Splitter:
    def split(self, text):
        return [s.strip() + "." for s in text.split(".") if s.strip()]


def test_bigram_overlap_counts_shared_bigrams_of_the_original():
    assert bigram_overlap("a b c", "a b c") == 1.0
    assert bigram_overlap("a b c", "c b a") == 0.0
    assert bigram_overlap("a b c", "x a b") == 0.5


def test_bigram_selection_picks_least_overlap_within_bound():
    cands = list(CANDIDATES)
    sims = list(CANDIDATES.values())
    overlaps = [bigram_overlap(ORIGINAL, c) for c in cands]
    # The drifted candidate has the least overlap overall but is outside the bound.
    assert min(overlaps) == overlaps[3] and overlaps[2] < overlaps[1] < overlaps[0]
    assert select_bigram(ORIGINAL, cands, sims, bound=0.8) == 2
    # A tighter bound leaves only the first two: the lower-overlap of them wins.
    assert select_bigram(ORIGINAL, cands, sims, bound=0.88) == 1
    # Nothing within the bound: the most similar candidate.
    assert select_bigram(ORIGINAL, cands, sims, bound=0.99) == 0
    assert select_bigram(ORIGINAL, [], [], bound=0.5) is None


def test_attack_applies_selection_per_sentence_and_reports_similarity():
    second = "it takes effect in may."
    table = {ORIGINAL: list(CANDIDATES), second: []}  # no candidate: the sentence stays
    sims = {**CANDIDATES}
    paraphraser = ScriptedParaphraser(table)
    text = f"{ORIGINAL} {second}"
    bigram = Attack(paraphraser, ScriptedEncoder(sims), Splitter(), "bigram", 0.8)([text])[0]
    assert bigram.text == "monday saw a fresh budget passed by councillors. " + second
    assert bigram.changed == 1 and bigram.sentences == 2
    assert bigram.sentence_similarity == pytest.approx((0.85 + 1.0) / 2)
    # One batched call for all sentences of all texts.
    assert paraphraser.calls == [[ORIGINAL, second]]
    best = Attack(paraphraser, ScriptedEncoder(sims), Splitter(), "best")([text])[0]
    assert best.text.startswith("the council approved the new budget on tuesday.")
    # A text that completes its prompt keeps the space that joins it to the prompt.
    joined = Attack(paraphraser, ScriptedEncoder(sims), Splitter(), "best")([" " + text])[0]
    assert joined.text == " " + best.text


def test_attack_rejects_unknown_selection():
    with pytest.raises(ValueError, match="select"):
        Attack(ScriptedParaphraser({}), ScriptedEncoder({}), Splitter(), "longest")


def test_missing_seq2seq_paraphraser_fails_with_a_clear_error(tmp_path):
    from ksemstamp.assets import AssetError
    from ksemstamp.evaluation.attacks import Seq2SeqParaphraser

    paraphraser = Seq2SeqParaphraser(str(tmp_path / "no-such-pegasus"))  # loads lazily
    with pytest.raises(AssetError, match="no-such-pegasus.*No Pegasus/Parrot weights ship"):
        paraphraser.candidates(["The council met."])


def test_first_line_stop_waits_for_text_before_a_line_break():
    from ksemstamp.paraphrase import FirstLineDone

    class CharTokenizer:  # token id = character code
        def batch_decode(self, rows, skip_special_tokens=True):
            return ["".join(chr(int(t)) for t in row) for row in rows]

    prompt = [ord(c) for c in "P:"]
    rows = torch.tensor(
        [prompt + [ord(c) for c in text] for text in (" \n  ab", "ab\ncd ", " a b  ")]
    )
    stop = FirstLineDone(CharTokenizer(), prompt_width=len(prompt))
    # A leading blank line does not end the candidate; a break after text does.
    assert stop(rows).tolist() == [False, True, False]


@pytest.mark.e2e
def test_cached_few_shot_examples_give_the_same_candidates_as_full_prompts():
    from ksemstamp.paraphrase import LMParaphraser

    sentences = [
        "The city council approved the new budget on Tuesday after a long debate.",
        "Shares of the company rose 5% in early trading.",
    ]
    paraphraser = LMParaphraser(num_candidates=3, batch_size=4, cache_shots=False)
    plain = paraphraser.candidates(sentences)
    paraphraser.cache_shots = True
    cached = paraphraser.candidates(sentences)
    assert cached == plain  # same sampled tokens; batches of 4 rows span both sentences
    assert all(len(c) >= 1 for c in cached)
    assert paraphraser.prompt("x") == paraphraser.shots() + paraphraser.query("x")
    # The cached path was the one taken: the two parts tokenize like the whole prompt.
    assert "cache" in paraphraser._inputs([paraphraser.query(s) for s in sentences])
