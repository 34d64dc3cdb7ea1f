"""How the `api` family reads a model's answer: which class it asserts, or that it asserts none (unparsed).

Two readers, chosen by `model.answer_parser`: `strict` (StrictReader, the card's and the default: an admit-list, an
answer counts only when it is exactly one class name once a few documented wrappers are removed) and `lenient`
(AnswerParser, parser version 3: finds a class named inside a sentence, knows some denials; its numbers are under
another protocol). Versioned apart from the model: cached answers are re-read by the reader that scores them, so a
change of reader re-scores old answers without a request. Also the other answer format a model may ask for
(`model.answer_format=choice`, the default): a JSON object whose one value is a class name, read without words.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from rgb.endpoints.client import EndpointError
from rgb.endpoints.settings import ANSWER_PARSERS

CARD_PARSER = ANSWER_PARSERS[0]  # the card's reader ("strict"): numbers read otherwise are under another protocol
UNPARSED = "unparsed"  # StrictReader's reason for an answer that is not exactly one class name (counted wrong)
CHOICE_FIELD = "answer"  # model.answer_format=choice: a JSON object {CHOICE_FIELD: one of the class names}

_MARKDOWN = re.compile(r"[*_`#>~|\[\]()\"“”]")  # not "'": "isn't" must stay one word
_ANSWER_MARK = re.compile(r"\b(?:answer|class|category|label|prediction)\s*(?:is|:|=|-)\s*(?:is\s*)?[:\-]?\s*(.+)",
                          re.IGNORECASE)
_NOT = re.compile(r"n['’]t\b")  # "isn't" -> "is not"
_BREAK = re.compile(r"[.,;:!?…\n\r()\[\]{}\"“”«»、。]")  # ends a phrase (after NFKC: full-width forms too)
# Chinese is written without spaces, so no word boundary marks where a class name ends: a run of Han characters is
# one word, less the frames around it below ("这是一只猫" is 这 是 一只 猫, "熊猫" stays one word and names no 猫).
_HAN_RUN = re.compile("[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f]+")
_HAN_ALTERNATIVE = re.compile("(或者|或是|还是|或(?!许))")
_HAN_FRAME = re.compile(
    "(这张图片?|这幅图|图片?中的?|图里的?|图像中的?|照片中的?|答案|类别|这|那|它|此)?"  # subject
    "(可能|应该|大概|也许|或许|肯定|一定)?"  # hedge
    "(并不是|不是|并非|不|没有|没|非)?"  # negation
    "(就是|是|为|属于)?"  # copula
    "([一这那][只个条头匹辆架艘棵朵张位种])?"  # numeral or demonstrative with a classifier
    "(.+?)"  # the word itself
    "(的图片|的照片|的图像|的图|吧|呢|啊|呀|了|的)?")  # "a picture of", sentence particles
# Scripts whose denials the parser reads (NEGATIONS has their words); in any other script (kana, Hangul, Thai,
# Hebrew, Devanagari, ...) only a bare class name counts: a longer answer may deny it in words unknown here.
JUDGED_SCRIPTS = ("LATIN", "GREEK", "CYRILLIC", "ARABIC", "CJK")
_ACCENTED = ("LATIN", "GREEK", "ARABIC")  # scripts whose accents and diacritics answers may drop ("cafe": café)
ARTICLES = frozenset({"a", "an", "the"})
# Words that deny a class or offer alternatives: English, and a few of other languages an answer may come in.
NEGATIONS = frozenset({"not", "cannot", "no", "none", "never", "neither", "nor", "unlikely", "except", "excluding",
                       "impossible", "non", "não", "nao", "niet", "geen", "nie", "nein", "ne", "nunca", "jamais",
                       "не", "нет", "ни", "nicht", "kein", "keine", "pas", "δεν", "όχι", "ليس", "ليست", "لا",
                       "不", "不是", "并不是", "并非", "没", "没有", "非"})
NEGATION_PHRASES = frozenset({("anything", "but"), ("other", "than"), ("rather", "than"), ("instead", "of")})
ALTERNATIVES = frozenset({"or", "или", "oder", "ou", "ή", "أو", "或", "或者", "或是", "还是"})
NUMBER_WORDS = {word: str(i) for i, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty".split())}
# "one" after these is a pronoun ("this one is blurry", "any one of them"), not the number.
PRONOUN_ONE = frozenset({"this", "that", "any", "each", "every", "which", "another", "some", "no", "the", "same",
                         "other", "only", "single", "right", "wrong", "last", "next", "first", "such", "either"})
# Words that may follow a class name in English without making it the modifier of another noun ("bass guitar" is
# no bass, "hotdog stand" no hot dog): function words, and generic nouns of what a class is ("a Maine Coon cat").
FOLLOWERS = frozenset(
    "a an the and or but nor not no is are was were be been being am s it its this that these those which who what "
    "here there on in at of to from by with without near next beside behind under over above below into onto inside "
    "outside between among against along across around through toward towards for as than then so too also very "
    "quite maybe perhaps probably possibly likely definitely clearly i you he she we they me him her us them my your "
    "his our their can could would should might may must will shall do does did has have had shown visible seen "
    "because since although though while when where if due based given like just only now yet still again rather "
    "instead actually either both all each one ones "
    "area land field zone region scene site view image picture photo photograph digit number numeral character "
    "symbol sign class category label type kind species breed animal cat kitten dog puppy bird fish".split())
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
REASONS = ("class", "no class", "several", "negation", "alternative", "unjudged")
REFUSALS = ("negation", "alternative")  # a class named, but denied or offered as one of several


def _han_words(run: str) -> list[str]:
    """A run of Han characters as words: its alternatives ("或") apart, and each part's frame (subject, hedge,
    negation, copula, classifier, particles) apart from the one word it frames."""
    words = []
    for part in _HAN_ALTERNATIVE.split(run):
        framed = _HAN_FRAME.fullmatch(part) if part and part not in ALTERNATIVES else None
        words += [w for w in framed.groups() if w] if framed else [part] if part else []
    return words


def tokens(text: str) -> list[str]:
    """The words of a text in any script: NFKC, case folded, "n't" read as "not"; every character that is not a
    letter, mark or digit (punctuation, markdown, "_", "-") separates words; Han runs are split by `_han_words`.
    Joined, the words of a text are its letters, marks and digits: a split changes no joined key."""
    text = _NOT.sub(" not", unicodedata.normalize("NFKC", text).casefold())
    text = _HAN_RUN.sub(lambda run: " " + " ".join(_han_words(run.group())) + " ", text)
    return "".join(c if unicodedata.category(c)[0] in "LMN" else " " for c in text).split()


def phrases(text: str) -> tuple[list[str], set[int]]:
    """`tokens` of a text, and the indices of the words that start a phrase (after punctuation or a line end)."""
    words, starts = [], set()
    for phrase in _BREAK.split(unicodedata.normalize("NFKC", text)):
        starts.add(len(words))
        words += tokens(phrase)
    return words, starts


def judged(text: str) -> bool:
    """Whether every letter of `text` is of a script whose denials the parser reads (JUDGED_SCRIPTS)."""
    return all(unicodedata.name(c, "").startswith(JUDGED_SCRIPTS) for c in unicodedata.normalize("NFKC", text)
               if unicodedata.category(c)[0] == "L")


def _unaccented(c: str) -> str:
    if not unicodedata.name(c, "").startswith(_ACCENTED):
        return c
    return "".join(d for d in unicodedata.normalize("NFKD", c) if not unicodedata.combining(d))


def stem(word: str) -> str:
    """One form for a word's variants: accents and diacritics of Latin, Greek and Arabic letters dropped, number
    words as digits, plurals as their singular (s, es, ies and a few irregular ones), British spellings as American.
    Lossy ("movie" and "movies" both become "movy") but the same on both sides, which is all matching needs."""
    word = "".join(map(_unaccented, word))
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


def _latin_word(word: str) -> bool:
    return all(unicodedata.name(c, "").startswith("LATIN") for c in word if unicodedata.category(c)[0] == "L") \
        and any(unicodedata.category(c)[0] == "L" for c in word)


@dataclass(frozen=True)
class Parsed:
    """What an answer says: `pred` the class (None: an abstention) and why (one of REASONS)."""

    pred: int | None
    reason: str


class AnswerParser:
    """Answer parser version 3 for one class list.

    A class is found as a run of words whose letters, joined without spaces, are its name's: exactly ("golf
    course" and "Golf-Course" name `golfcourse`, "sea lion" names `sea_lion`), else through `stem` (accents,
    plurals, British spellings, number words zero..twenty for digit names). In order: markdown stripped; the part
    after the last "answer/class/label is:" marker (if any); that part's first line, the whole answer or its first
    line (a leading article aside) naming one class, a line only when nothing after it names a class ("3\nActually,
    it's 8" is no 3); then the classes named inside that part, less a name inside a longer one named at the same
    place ("a wild cat" names `wild cat`, not `cat`), a number word used as a pronoun or count ("this one",
    "one of them") and, in English, a name that modifies the noun after it ("bass guitar"; `FOLLOWERS` may follow).
    Chinese has no spaces: a run of Han characters is one word less its frames (`_HAN_FRAME`: "是一只猫" names 猫,
    "熊猫" and "猫头鹰" name no 猫). It abstains when none is named, when two are (or one run of words fits two
    classes), when the answer denies one ("not 3", "isn't a cat", "no, ...", "anything but 3", "不是狗"): reason
    `negation`, or offers alternatives ("3 or 8"): reason `alternative`. An answer with a letter of a script whose
    denials it cannot read (kana, Hangul, Thai, ...: not in JUDGED_SCRIPTS) counts only as a bare class name:
    anything longer abstains, reason `unjudged`. Class names that read the same (`sea_lion` and `sea lion`) are
    refused: no answer could tell them apart."""

    name: ClassVar[str] = "lenient"
    version: ClassVar[int] = 3

    def __init__(self, class_names: Sequence[str]):
        self.class_names = [str(name) for name in class_names]
        self.exact: dict[str, int] = {}
        self.stemmed: dict[str, set[int]] = {}
        for i, name in enumerate(self.class_names):
            words = tokens(name)
            key = "".join(words)
            if not key:
                raise EndpointError(f"class name {name!r} has no letter or digit: no answer can name it")
            if key in self.exact:
                raise EndpointError(f"class names {class_names[self.exact[key]]!r} and {name!r} read the same to the "
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

    def _spans(self, words: list[str], breaks: set[int]) -> list[tuple[int, int, set[int]]]:
        """(start, end, classes) of every run of words naming a class (an exact reading beats a stemmed one),
        less those inside a longer one, number words used as pronouns or counts, and modifiers of a noun (an
        English word after it in the same phrase: `breaks` are the indices of words that start one)."""
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
        spans = [s for s in spans if not any(o[0] <= s[0] and s[1] <= o[1] and o[:2] != s[:2] for o in spans)]
        starts = {s[0] for s in spans} | breaks

        def names(span) -> bool:
            start, end, _ = span
            before = words[start - 1] if start else None
            after = words[end] if end < len(words) else None
            if end - start == 1 and words[start] in NUMBER_WORDS and (
                    after == "of" or (words[start] == "one" and before in PRONOUN_ONE)):
                return False
            return (after is None or end in starts or not _latin_word(after) or after in FOLLOWERS
                    or stems[end] in FOLLOWERS or after in NEGATIONS or after in ALTERNATIVES
                    or after.endswith(("ing", "ed")))

        return [s for s in spans if names(s)]

    def _names_nothing(self, text: str, readable: bool) -> bool:
        """Whether `text` (what follows a line that names a class) names no class: in a script the parser cannot
        judge, whether it has no letter at all."""
        if not readable:
            return not any(unicodedata.category(c)[0] == "L" for c in text)
        return not self._spans(*phrases(text))

    def parse(self, text: str | None) -> Parsed:
        if not text or not text.strip():
            return Parsed(None, "no class")
        stripped = _MARKDOWN.sub(" ", text).strip()
        readable = judged(stripped)
        marks = list(_ANSWER_MARK.finditer(stripped))
        scope = stripped
        candidates = []
        if marks:
            line, after = marks[-1].group(1), stripped[marks[-1].end():]
            if self._names_nothing(after, readable):
                candidates.append(line)
                scope = line
        candidates.append(stripped)
        line, _, after = stripped.partition("\n")
        if self._names_nothing(after, readable):
            candidates.append(line)
        for candidate in candidates:
            found = self._whole(tokens(candidate))
            if found is not None:
                return Parsed(found, "class")
        if not readable:
            return Parsed(None, "unjudged")
        words, breaks = phrases(scope)
        spans = self._spans(words, breaks)
        if not spans:
            return Parsed(None, "no class")
        named = set().union(*(s[2] for s in spans))
        covered = {i for s in spans for i in range(s[0], s[1])}
        rest = [w if i not in covered else None for i, w in enumerate(words)]
        if set(rest) & NEGATIONS or set(zip(rest, rest[1:])) & NEGATION_PHRASES:
            return Parsed(None, "negation")
        if set(rest) & ALTERNATIVES:
            return Parsed(None, "alternative")
        return Parsed(next(iter(named)), "class") if len(named) == 1 else Parsed(None, "several")


# The wrappers StrictReader removes around a class name, and nothing else (an admit-list: no word that denies a
# class is known here, so none can be missed): surrounding whitespace and format characters (Unicode category Cf: a
# byte order mark, zero-width spaces, bidi marks); surrounding quotes or markdown emphasis and code marks, as
# matching pairs, any number of layers; ONE leading label (LABEL); ONE trailing period (PERIODS).
QUOTES = {'"': '"', "'": "'", "\u201c": "\u201d", "\u2018": "\u2019", "\u00ab": "\u00bb", "\u201e": "\u201c",
          "\u300c": "\u300d"}
EMPHASIS = ("```", "***", "**", "__", "*", "_", "`")
# "Answer:", "Final answer:", "The answer is:" (its colon optional), "Prediction:", "Class:", "Label:",
# "Category:", in any case, the label itself possibly in emphasis ("**Answer:** seven").
LABEL = re.compile(r"(?P<em>[*_]{0,3})\s*(?:the\s+answer\s+is(?:\s*(?P=em)\s*:?|\s*:\s*(?P=em))"
                   r"|(?:(?:final\s+)?answer|prediction|class|label|category)(?:\s*(?P=em)\s*:|\s*:\s*(?P=em)))\s*",
                   re.IGNORECASE)
PERIODS = (".", "\u3002")  # "." and the ideographic full stop "。" (NFKC keeps it)


def _trimmed(text: str) -> str:
    """`text` less the whitespace and format characters (Cf) at its ends; those within it are kept (a zero-width
    non-joiner is part of a Persian word)."""
    start, end = 0, len(text)
    while start < end and (text[start].isspace() or unicodedata.category(text[start]) == "Cf"):
        start += 1
    while end > start and (text[end - 1].isspace() or unicodedata.category(text[end - 1]) == "Cf"):
        end -= 1
    return text[start:end]


# "_", "-" and spaces within a line: "sea_lion" is "Sea Lion" is "sea-lion" (a line break is not: "sea\nlion" is two)
_SEPARATORS = re.compile(r"[ \t_\-\u2010\u2011]+")


def folded(text: str) -> str:
    """The form StrictReader compares: NFKC, case folded, the accents of Latin, Greek and Arabic letters dropped,
    `_`, `-`, spaces and tabs removed, one trailing period dropped ("St. Bernard" keeps its inner one)."""
    text = "".join(map(_unaccented, unicodedata.normalize("NFKC", text).casefold()))
    return _SEPARATORS.sub("", text).removesuffix(".")


def _unwrapped(text: str) -> str:
    """`text` less the wrappers StrictReader admits around a class name (QUOTES, EMPHASIS, one LABEL, one trailing
    period), in any order."""
    text, label, period = _trimmed(unicodedata.normalize("NFKC", text)), False, False
    while True:
        before = text
        pair = next(((o, QUOTES[o]) for o in QUOTES if len(text) > 2 and text[0] == o and text[-1] == QUOTES[o]),
                    None) or next(((m, m) for m in EMPHASIS if len(text) > 2 * len(m) and text.startswith(m)
                                   and text.endswith(m)), None)
        if not label and (found := LABEL.match(text)) and found.end() < len(text):
            text, label = _trimmed(text[found.end():]), True
        elif pair:
            text = _trimmed(text[len(pair[0]): -len(pair[1])])
        elif not period and text.endswith(PERIODS) and not text[:-1].endswith(PERIODS):
            text, period = _trimmed(text[:-1]), True
        if text == before:
            return text


class StrictReader:
    """The card's answer reader (`model.answer_parser=strict`, the default): an answer asserts a class only when,
    once the wrappers above are removed, what remains is exactly one class name (compared `folded`). Anything else
    is unparsed: never a class, counted wrong and apart. It reads no words, so no denial in any language ("Det är
    inte en katt", "cat? Nope.", "Hardly a cat"), no second class, no confidence ("3 (confidence: 0.97)") and no
    number for its word ("7" is not `seven`) can be taken for a class. Class names that fold the same (`sea_lion`,
    `Sea Lion`) are refused: no answer could tell them apart."""

    name: ClassVar[str] = CARD_PARSER
    version: ClassVar[int] = 4  # after AnswerParser's 1..3: scores.json's api.parser_version

    def __init__(self, class_names: Sequence[str]):
        self.class_names = [str(name) for name in class_names]
        self.keys: dict[str, int] = {}
        for i, name in enumerate(self.class_names):
            key = folded(_unwrapped(name))
            if not any(unicodedata.category(c)[0] in "LN" for c in key):
                raise EndpointError(f"class name {name!r} has no letter or digit: no answer can name it")
            if key in self.keys:
                raise EndpointError(f"class names {self.class_names[self.keys[key]]!r} and {name!r} read the same to the "
                               f"strict answer reader (case, accents, `_`, `-` and spaces aside): rename one of them")
            self.keys[key] = i

    def parse(self, text: str | None) -> Parsed:
        pred = self.keys.get(folded(_unwrapped(text or "")))
        return Parsed(None, UNPARSED) if pred is None else Parsed(pred, "class")


# model.answer_parser: each reader by its name (settings.ANSWER_PARSERS; CARD_PARSER's numbers alone enter a Sum or
# Borda of card entries).
READERS: dict[str, type[StrictReader] | type[AnswerParser]] = {StrictReader.name: StrictReader,
                                                               AnswerParser.name: AnswerParser}
Reader = StrictReader | AnswerParser


def choice_format(class_names: Sequence[str]) -> dict:
    """The `response_format` of answer_format=choice (OpenAI structured outputs): a JSON object whose one field is
    an enum of the class names, so a conforming endpoint can answer nothing else."""
    schema = {"type": "object", "properties": {CHOICE_FIELD: {"type": "string", "enum": [str(n) for n in class_names]}},
              "required": [CHOICE_FIELD], "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "class_choice", "strict": True, "schema": schema}}


_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)\n?[ \t]*```", re.DOTALL)  # one code fence: ```json {...} ```


class _KeyTwice(Exception):
    """A JSON object that gives one key twice: JSON, but not the object asked for."""


def _unique_keys(pairs: list[tuple]) -> dict:
    """A JSON object's keys and values, refusing a key given twice (json.loads would keep the last one)."""
    if len({key for key, _ in pairs}) < len(pairs):
        raise _KeyTwice
    return dict(pairs)


def parse_choice(parser: Reader, text: str | None) -> Parsed:
    """An answer to `choice_format`: its class when the reply (less one code fence, ```json ... ```) is the JSON
    object asked for, exactly: its one key CHOICE_FIELD, given once, whose value is a class name (or reads as one
    to the text reader). Any other JSON object or array (`{"answer": "cat", "not": true}`, a key given twice) is
    unparsed, never re-read as text; a reply that is no JSON, or a bare JSON value (`"cat"`, quotes being a
    wrapper), is an endpoint that ignores the format, read by the text reader (strict by default)."""
    fenced = _FENCE.fullmatch((text or "").strip())
    body = fenced.group(1) if fenced else text
    try:
        reply = json.loads(body or "", object_pairs_hook=_unique_keys)
    except _KeyTwice:
        return Parsed(None, UNPARSED)
    except ValueError:
        return parser.parse(text)
    if not isinstance(reply, (dict, list)):
        return parser.parse(text)
    value = reply.get(CHOICE_FIELD) if isinstance(reply, dict) and reply.keys() == {CHOICE_FIELD} else None
    if not isinstance(value, str):
        return Parsed(None, UNPARSED)
    return Parsed(parser.class_names.index(value), "class") if value in parser.class_names else parser.parse(value)


def parse_answer(text: str | None, class_names: Sequence[str], parser: str = CARD_PARSER) -> int | None:
    """The class an answer asserts, or None (unparsed), by the reader named `parser` (READERS)."""
    return READERS[parser](class_names).parse(text).pred
