"""The answer parser of the `api` family: which class a model's free-text answer names, or why it names none.

Versioned (PARSER_VERSION) apart from the model: cached answers are re-parsed by the version that scores them, so a
better parser re-scores old answers without a request.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from rgb.models.api_client import ApiError

PARSER_VERSION = 2  # AnswerParser; cached answers are re-parsed by the version that scores them

_MARKDOWN = re.compile(r"[*_`#>~|\[\]()\"“”]")  # not "'": "isn't" must stay one word
_ANSWER_MARK = re.compile(r"\b(?:answer|class|category|label|prediction)\s*(?:is|:|=|-)\s*(?:is\s*)?[:\-]?\s*(.+)",
                          re.IGNORECASE)
# Scripts written without spaces between words: each character is a token, so a class name is found inside a
# sentence ("这是一只狗" names 狗) the way a name of several words is (tokens joined).
_UNSPACED = re.compile("([\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff"
                       "\uf900-\ufaff\U00020000-\U0002fa1f])")
_NOT = re.compile(r"n['’]t\b")  # "isn't" -> "is not"
ARTICLES = frozenset({"a", "an", "the"})
# Words that deny a class or offer alternatives: English, and a few of other languages an answer may come in.
NEGATIONS = frozenset({"not", "cannot", "no", "none", "never", "neither", "nor", "не", "нет", "nicht", "kein",
                       "keine", "pas", "δεν", "όχι", "ليس", "不", "没"})
ALTERNATIVES = frozenset({"or", "или", "oder", "ou", "ή", "أو", "或"})
NUMBER_WORDS = {word: str(i) for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
# British spellings (singular) and their American form: either names the same class.
SPELLINGS = {
    "harbour": "harbor", "colour": "color", "grey": "gray", "aeroplane": "airplane", "tyre": "tire",
    "jewellery": "jewelry", "centre": "center", "theatre": "theater", "metre": "meter", "aluminium": "aluminum",
    "neighbour": "neighbor", "favourite": "favorite", "moustache": "mustache", "doughnut": "donut",
    "plough": "plow", "kerb": "curb", "pyjama": "pajama", "mould": "mold", "catalogue": "catalog",
    "armour": "armor", "parlour": "parlor", "sulphur": "sulfur", "defence": "defense", "licence": "license",
}
# Plurals the s/es/ies rules miss.
IRREGULAR = {"mice": "mouse", "geese": "goose", "men": "man", "women": "woman", "children": "child",
             "people": "person", "teeth": "tooth", "feet": "foot", "knives": "knife", "leaves": "leaf",
             "wolves": "wolf", "shelves": "shelf", "buses": "bus", "cacti": "cactus", "fungi": "fungus"}
REASONS = ("class", "no class", "several", "negation", "alternative")
REFUSALS = ("negation", "alternative")  # a class named, but denied or offered as one of several


def tokens(text: str) -> list[str]:
    """The words of a text in any script: NFKC, case folded, "n't" read as "not"; every character that is not a
    letter, mark or digit (punctuation, markdown, "_", "-") separates words."""
    text = _NOT.sub(" not", unicodedata.normalize("NFKC", text).casefold())
    text = _UNSPACED.sub(r" \1 ", text)
    return "".join(c if unicodedata.category(c)[0] in "LMN" else " " for c in text).split()


def stem(word: str) -> str:
    """One form for a word's variants: number words as digits, plurals as their singular (s, es, ies and a few
    irregular ones), British spellings as American. Lossy ("movie" and "movies" both become "movy") but the same on
    both sides, which is all matching needs."""
    if word in NUMBER_WORDS:
        return NUMBER_WORDS[word]
    word = IRREGULAR.get(word, word)
    if word.endswith("ies") and len(word) >= 5:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "shes", "ches", "xes", "zes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith(("ss", "us", "is")) and len(word) >= 4:
        word = word[:-1]
    if word.endswith("ie"):
        word = word[:-2] + "y"
    elif word.endswith("oe"):
        word = word[:-1]
    return SPELLINGS.get(word, word)


@dataclass(frozen=True)
class Parsed:
    """What an answer says: `pred` the class (None: an abstention) and why (one of REASONS)."""

    pred: int | None
    reason: str


class AnswerParser:
    """Answer parser version 2 for one class list.

    A class is found as a run of words whose letters, joined without spaces, are its name's: exactly ("golf
    course" and "Golf-Course" name `golfcourse`, "sea lion" names `sea_lion`), else through `stem` (plurals,
    British spellings, number words zero..twenty for digit names). In order: markdown stripped; the part after the
    last "answer/class/label is:" marker (if any) taken on its own; the whole of that part, the whole answer or
    its first line (a leading article aside) naming one class; then the classes named inside that part, less a
    name inside a longer one named at the same place ("a wild cat" names `wild cat`, not `cat`). It abstains when
    none is named, when two are (or one run of words fits two classes), when the answer denies one ("not 3",
    "isn't a cat", "no, ..."): reason `negation`, or offers alternatives ("3 or 8"): reason `alternative`.
    Class names that read the same (`sea_lion` and `sea lion`) are refused: no answer could tell them apart."""

    def __init__(self, class_names: Sequence[str]):
        self.exact: dict[str, int] = {}
        self.stemmed: dict[str, set[int]] = {}
        for i, name in enumerate(class_names):
            words = tokens(str(name))
            key = "".join(words)
            if not key:
                raise ApiError(f"class name {name!r} has no letter or digit: no answer can name it")
            if key in self.exact:
                raise ApiError(f"class names {class_names[self.exact[key]]!r} and {name!r} read the same to the "
                               f"answer parser (case, punctuation and spaces aside): rename one of them")
            self.exact[key] = i
            self.stemmed.setdefault("".join(map(stem, words)), set()).add(i)
        self._longest = max(map(len, self.exact), default=0), max(map(len, self.stemmed), default=0)

    def _whole(self, words: list[str]) -> int | None:
        """The class that all of `words` (a leading article aside) names, if exactly one does."""
        while words and words[0] in ARTICLES:
            words = words[1:]
        key = "".join(words)
        if key in self.exact:
            return self.exact[key]
        fits = self.stemmed.get("".join(map(stem, words)), set())
        return next(iter(fits)) if len(fits) == 1 else None

    def _spans(self, words: list[str]) -> list[tuple[int, int, set[int]]]:
        """(start, end, classes) of every run of words naming a class (an exact reading beats a stemmed one)."""
        stems = [stem(w) for w in words]
        spans = []
        for start in range(len(words)):
            exact = stemmed = ""
            for end in range(start, len(words)):
                exact, stemmed = exact + words[end], stemmed + stems[end]
                if len(exact) > self._longest[0] and len(stemmed) > self._longest[1]:
                    break
                fits = {self.exact[exact]} if exact in self.exact else self.stemmed.get(stemmed)
                if fits:
                    spans.append((start, end + 1, fits))
        return [s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o[:2] != s[:2] for o in spans)]

    def parse(self, text: str | None) -> Parsed:
        if not text or not text.strip():
            return Parsed(None, "no class")
        stripped = _MARKDOWN.sub(" ", text)
        marks = list(_ANSWER_MARK.finditer(stripped))
        candidates = [marks[-1].group(1).splitlines()[0]] if marks else []
        candidates += [stripped, stripped.strip().splitlines()[0]]
        for candidate in candidates:
            found = self._whole(tokens(candidate))
            if found is not None:
                return Parsed(found, "class")
        words = tokens(candidates[0])
        spans = self._spans(words)
        if not spans:
            return Parsed(None, "no class")
        named = set().union(*(s[2] for s in spans))
        covered = {i for s in spans for i in range(s[0], s[1])}
        rest = {w for i, w in enumerate(words) if i not in covered}
        if rest & NEGATIONS:
            return Parsed(None, "negation")
        if rest & ALTERNATIVES:
            return Parsed(None, "alternative")
        return Parsed(next(iter(named)), "class") if len(named) == 1 else Parsed(None, "several")


def parse_answer(text: str | None, class_names: Sequence[str]) -> int | None:
    """The class an answer names, or None (an abstention): `AnswerParser` (version 2)."""
    return AnswerParser(class_names).parse(text).pred
