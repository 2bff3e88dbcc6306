"""The evaluation report's decision table and the decisions behind it (no models)."""

import pytest

from ksemstamp.evaluation.report import KGW_STATISTIC, decision_table, markdown_table
from ksemstamp.evaluation.scoring import flagged_at_alpha

DIRECTION_STATISTIC = (
    "direction statistic: z of the summed projections on the key's directions, exactly "
    "standard normal over random keys; p is its normal tail"
)


def test_flagged_at_alpha_shares_per_key_and_worst_key():
    positives = [
        {"p_value": 0.001, "key_index": 0},
        {"p_value": 0.03, "key_index": 0},
        {"p_value": 0.2, "key_index": 1},
        {"p_value": None, "key_index": 1},  # too short: never flagged
    ]
    negatives = [{"p_value": 0.004, "key_index": 0}, {"p_value": 0.5, "key_index": 1}]
    out = flagged_at_alpha(positives, negatives)
    assert out["0.01"]["tpr"] == 0.25 and out["0.05"]["tpr"] == 0.5
    assert out["0.01"]["tpr_per_key"] == [0.5, 0.0] and out["0.01"]["tpr_worst_key"] == 0.0
    assert out["0.01"]["fpr"] == 0.5 and out["0.01"]["fpr_worst_key"] == 1.0
    single = flagged_at_alpha(positives[:2], negatives[:1])
    assert "tpr_worst_key" not in single["0.01"]


def test_flagged_at_alpha_without_negatives_has_no_false_positive_rate():
    positives = [{"p_value": 0.001, "key_index": 0}, {"p_value": 0.2, "key_index": 1}]
    out = flagged_at_alpha(positives, [])["0.01"]
    assert out["tpr"] == 0.5 and out["tpr_worst_key"] == 0.0
    assert out["fpr"] is None and out["fpr_worst_key"] is None and out["fpr_mean_over_keys"] is None


def _entry(tpr1, tpr5, kind, **extra):
    alpha = {
        "0.01": {"tpr": tpr1, "fpr": 0.0, "tpr_worst_key": tpr1 / 2, "fpr_worst_key": 0.1},
        "0.05": {"tpr": tpr5, "fpr": 0.05},
    }
    return {
        "auroc": 0.9,
        "auroc_ci95": [0.8, 1.0],
        "tpr_at_fpr_1": 0.5,
        "tpr_at_fpr_5": 0.7,
        "positives": 12,
        "negatives": 12,
        "kind": kind,
        "at_alpha": alpha,
        "roc": {"fpr": [0, 1], "tpr": [0, 1]},
        **extra,
    }


RESULTS = {
    "prompts": 12,
    "similarity": "cosine",
    "score": "z",
    "settings": {"oracle": "gemma3-270m"},
    "detection": {
        "ksemstamp": {
            "none": _entry(0.92, 1.0, "none"),
            "lm-rewrite": _entry(
                0.5,
                0.75,
                "attack",
                similarity=0.81,
                window_similarity=0.88,
                rewritten_window_similarity=0.79,
                fallbacks=3,
                fallback_share=0.25,
            ),
            "reorder": _entry(0.42, 0.58, "edit"),
        },
        "kgw": {"none": _entry(1.0, 1.0, "none")},
    },
    "quality": {
        name: {"perplexity": 10.0, "perplexity_median": 9.0, "ent3": 5.0, "sem_ent": 2.0}
        for name in ("ksemstamp", "kgw", "human")
    },
    "statistics": {
        "ksemstamp": DIRECTION_STATISTIC,
        "kgw": KGW_STATISTIC,
    },
    "size": {
        "ksemstamp": {"texts": 12, "never": 1, "median_tokens": 87.0, "alpha": 0.01},
        "kgw": {"texts": 12, "never": 7, "median_tokens": None, "alpha": 0.01},
    },
}


def test_decision_table_rows_per_algorithm_and_text():
    lines = decision_table(RESULTS)
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[1] == (
        "| k-SemStamp | clean | 12 | 0.92 | 1.00 | 0.46 | 0.900 | 0.50 | - | 87 (1 of 12 never) |"
    )
    assert rows[2].startswith("|  | lm-rewrite | 12 | 0.50 | 0.75 | 0.25 |")
    assert "0.81 (rewritten windows 0.79; 25% of windows kept)" in rows[2]
    assert rows[3].startswith("|  | reorder (edit) | 12 | 0.42 | 0.58 |")
    assert rows[4] == "| | human (FPR) | 12 | 0.000 | 0.050 | 0.100 | - | - | - | - |"
    assert rows[5].startswith("| KGW | clean |") and "never (7 of 12 never)" in rows[5]
    assert len({row.count("|") for row in rows}) == 1  # not ragged
    text = "\n".join(lines)
    assert "KGW's z-test" in text and "direction statistic" in text


def test_each_mark_says_which_test_each_of_its_p_values_is(hash_encoder):
    from ksemstamp.marks import build_mark
    from ksemstamp.scheme.core import WatermarkScheme
    from ksemstamp.scheme.partition import LSHPartition
    from ksemstamp.settings import DirectionSettings, RegionSettings
    from ksemstamp.text.splitter import get_splitter

    def described(settings, scan=False):
        scheme = WatermarkScheme(hash_encoder, LSHPartition(32), "k", get_splitter(), settings)
        return build_mark(scheme).describe(scan)["statistic"]

    region = described(RegionSettings())
    assert "paper" in region["paper"] and "exact key-randomisation" in region["exact"]
    direction = described(DirectionSettings(context_temperature=0.0))
    assert direction == {"exact": DIRECTION_STATISTIC} and "paper" not in direction["exact"]
    assert "span scan" in described(DirectionSettings(context_temperature=0.0), scan=True)["exact"]


def test_markdown_table_starts_with_the_decisions():
    table = markdown_table(RESULTS)
    assert table.index("| Algorithm | Text | n | p <= 0.01") < table.index("| Algorithm | Attack")
    assert "Decided by each algorithm's own p-value" in table
    # The direction mark's z is not the paper's: the tables never call it so.
    none = RESULTS["detection"]["ksemstamp"]["none"]
    exact = {**none, "exact": {k: none[k] for k in ("auroc", "tpr_at_fpr_1", "tpr_at_fpr_5")}}
    with_exact = {**RESULTS, "detection": {"ksemstamp": {"none": exact}}}
    assert "paper's z" not in markdown_table(with_exact)


@pytest.mark.parametrize("size", [None, {"texts": 0, "never": 0, "median_tokens": None}])
def test_decision_table_without_a_size(size):
    results = {**RESULTS, "size": {"ksemstamp": size} if size else {}}
    assert "| k-SemStamp | clean | 12 | 0.92 | 1.00 | 0.46 | 0.900 | 0.50 | - | - |" in (
        decision_table(results)
    )
