"""The strict answer reader (rgb.endpoints.answers.StrictReader, `model.answer_parser=strict`, the card's) on a table
of answers written apart from it: generated from hand-written templates (denials in many languages, English hedges
and questions, two classes, confidences and scores whose digits spell a class, multi-word classes across
punctuation, and plain answers) x class names, each row with the class it asserts (mostly none). No row may be read
as a class it does not assert, and every plain answer must count. Then end to end: evaluate.py on the mini
benchmark with a stand-in endpoint (FastAPI, replies built with the openai SDK's types, asked through the SDK) that
denies the true class of every image: accuracy 0, every answer unparsed and shown so; the lenient reader re-reads
the same cached answers without a request, and its numbers are marked as under another protocol."""

from __future__ import annotations

import base64
import hashlib
import html
import json
import time
from pathlib import Path

import pytest

import helpers
from helpers import raises_one_line
from rgb.core.files import distinct_name
from rgb.data.mini import CLASS_NAMES as MINI
from rgb.endpoints.answers import (CARD_PARSER, READERS, UNPARSED, AnswerParser, Parsed, StrictReader,
                                   parse_answer, parse_choice)
from rgb.endpoints.client import EndpointError, RequestStats
from rgb.endpoints.settings import ANSWER_PARSERS, CLARIFY_TURN, EndpointSettings, ClientSettings
from rgb.evaluation.records import EndpointUsage
from rgb.models.chat import ChatClassifier

THINGS = ["cat", "dog", "hot dog", "sea_lion", "sea", "lion", "golf course", "course", "café", "St. Bernard"]
LISTS = {"mini": MINI, "things": THINGS}
SPOKEN = {"sea_lion": "sea lion"}  # how an answer writes a class name (the rest: as it is)

# Denials, one or two per language, written by hand ({c}: the class name as an answer would write it).
DENIALS = {
    "Swedish": ["Det är inte en {c}", "Ingen {c} här."], "Norwegian": ["Det er ikke en {c}"],
    "Danish": ["Det er ikke en {c}."], "Icelandic": ["Þetta er ekki {c}"], "German": ["Das ist keine {c}", "Kein {c}."],
    "Dutch": ["Dit is geen {c}"], "French": ["Ce n'est pas un {c}", "Pas un {c}."], "Spanish": ["No es un {c}."],
    "Catalan": ["No és un {c}"], "Portuguese": ["Não é um {c}"], "Italian": ["Non è un {c}"],
    "Romanian": ["Nu este un {c}"], "Polish": ["To nie jest {c}"], "Czech": ["Tohle není {c}"],
    "Slovak": ["Toto nie je {c}"], "Hungarian": ["Ez nem {c}"], "Finnish": ["Tämä ei ole {c}"],
    "Estonian": ["See ei ole {c}"], "Latvian": ["Tas nav {c}"], "Lithuanian": ["Tai nėra {c}"],
    "Turkish": ["Bu bir {c} değil"], "Indonesian": ["Ini bukan {c}"], "Malay": ["Itu bukan seekor {c}"],
    "Tagalog": ["Hindi ito {c}"], "Vietnamese": ["Đây không phải là {c}"], "Swahili": ["Hii si {c}"],
    "Russian": ["Это не {c}"], "Ukrainian": ["Це не {c}"], "Greek": ["Δεν είναι {c}"], "Arabic": ["هذا ليس {c}"],
    "Persian": ["این {c} نیست"], "Hebrew": ["זה לא {c}"], "Hindi": ["यह {c} नहीं है"], "Bengali": ["এটা {c} নয়"],
    "Japanese": ["これは{c}ではありません"], "Korean": ["이것은 {c}이(가) 아닙니다"], "Chinese": ["这不是{c}"],
    "Thai": ["นี่ไม่ใช่{c}"],
}
# English hedges, questions and denials that name the class without asserting it.
HEDGES = ["{c}? Nope.", "Hardly a {c}", "Everything but a {c}", "An empty room without any {c}", "Not a {c}.",
          "Definitely not {c}", "Is it a {c}?", "{c}?", "I don't see a {c}", "No {c} here", "{c}: no", "{c} (no)",
          "It isn't {c}.", "Could be a {c}, or not", "Anything except {c}", "{c}... or maybe not",
          "The answer is not {c}", "Answer: not {c}", "Far from a {c}", "{c} is wrong", "never {c}", "~~{c}~~",
          "I would have said {c}, but no", "Unlikely {c}", "Without a doubt no {c}"]
# Two classes (a, b): neither is asserted alone.
PAIRS = ["{a} or {b}", "{a}, {b}", "{a} and {b}", "{a}/{b}", "either {a} or {b}", "{a}\n{b}", "Answer: {a} or {b}",
         "**{a}** vs **{b}**", "{a}; {b}", "first {a}, then {b}"]
# Confidences and scores: their digits spell a class of `mini` (zero..nine) only if read as number words.
SCORES = [("3 (confidence: 0.97)", "three"), ("seven (confidence: 0.97)", "seven"), ("Confidence: 0.9", None),
          ("0.85", None), ("Score: 7/10", None), ("probability 1.0", None), ("8/10 sure", None),
          ("1", None), ("0", None), ("9.", None), ("seven: 0.91, one: 0.05", None), ("p=0.2", None),
          ("class 3", None), ("Answer: 3", "three"), ("Class: 7 (0.99)", "seven"), ("[0.1, 0.9]", None),
          ('{"answer": "3"}', "three"), ("2 of 10", None), ("100%", None), ("1st guess: four", None)]
# Multi-word classes (and their words, also classes) across punctuation: no class asserted.
ACROSS = ["a sea. Lion", "sea, lion", "golf; course", "hot. Dog", "golf\ncourse", "sea (lion)", "Sea! Lion",
          "golf: course", "hot, dog", "St Bernard? No", "sea lion, of course", "sea... lion"]
# Plain answers: each asserts its class and must count.
PLAIN = ["{c}", "{C}.", "The answer is: {c}", "**{c}**", '"{c}"', "Answer: {c}", "Prediction: {c}", "Class: {c}",
         "`{c}`", "  {c}\n", "{c}.", "{U}", "The answer is {c}.", "*{c}*", "'{c}'", "**Answer:** {c}",
         "Final answer: {c}", "“{c}”"]


def spoken(name: str) -> str:
    return SPOKEN.get(name, name)


def table() -> list[tuple[str, str, str | None]]:
    """(class list, answer, the class it asserts or None)."""
    rows = []
    for names in ("mini", "things"):
        classes = LISTS[names]
        some = [classes[i] for i in (0, 3, 7)] if names == "mini" else ["cat", "sea_lion", "golf course"]
        for language, templates in DENIALS.items():
            rows += [(names, t.format(c=spoken(c)), None) for t in templates for c in some]
        rows += [(names, h.format(c=spoken(c)), None) for h in HEDGES for c in some[:2]]
        rows += [(names, p.format(a=spoken(a), b=spoken(b)), None) for p in PAIRS
                 for a, b in zip(some, some[1:] + some[:1])]
        for c in classes:
            word = spoken(c)
            rows += [(names, p.format(c=word, C=word[:1].upper() + word[1:], U=word.upper()), c) for p in PLAIN]
    rows += [("mini", text, asserted) for text, asserted in SCORES]
    rows += [("things", text, None) for text in ACROSS]
    # other spellings of a class the folding admits: `_`, `-` and spaces, case, accents
    rows += [("things", text, c) for text, c in [("Sea-Lion", "sea_lion"), ("sea_lion", "sea_lion"),
                                                   ("SEA LION.", "sea_lion"), ("Golf-Course", "golf course"),
                                                   ("golf_course", "golf course"), ("cafe", "café"),
                                                   ("Café.", "café"), ("HOT-DOG", "hot dog"),
                                                   ("st. bernard", "St. Bernard")]]
    return rows


TABLE = table()


def misread(reader, rows) -> list[tuple[str, str, str]]:
    """The rows a reader reads as a class they do not assert: (answer, what it asserts, what was read)."""
    found = []
    for names, text, asserted in rows:
        classes = LISTS[names]
        pred = reader(classes, text)
        if pred is not None and classes[pred] != asserted:
            found.append((text, asserted, classes[pred]))
    return found


def test_the_table_is_large_and_written_in_many_languages():
    assert len(TABLE) >= 300 and len(DENIALS) >= 25
    assert sum(asserted is None for _, _, asserted in TABLE) >= 300  # mostly rows that assert no class


def test_no_row_is_read_as_a_class_it_does_not_assert_and_every_plain_answer_counts():
    assert misread(lambda classes, text: StrictReader(classes).parse(text).pred, TABLE) == []
    plain = [(names, text, c) for names, text, c in TABLE if c is not None and (names, text) not in
             {("mini", t) for t, _ in SCORES}]
    kept = [text for names, text, c in plain if parse_answer(text, LISTS[names]) == LISTS[names].index(c)]
    assert len(plain) >= 300 and len(kept) == len(plain)


def test_a_choice_reply_that_holds_a_denial_is_unparsed_too():
    """answer_format=choice: an endpoint that ignores the schema (free text, or the JSON object with any text as
    its value) is read by the same strict rule."""
    def choice(classes, text):
        reader = StrictReader(classes)
        return parse_choice(reader, json.dumps({"answer": text})).pred
    assert misread(choice, TABLE) == []
    assert misread(lambda classes, text: parse_choice(StrictReader(classes), text).pred, TABLE) == []


@pytest.mark.parametrize("parser", ANSWER_PARSERS)
@pytest.mark.parametrize("reply", ['{"answer": "cat", "not": true}', '{"answer": "cat", "answer": "dog"}',
                                   '{"answer": "dog", "answer": "dog"}', '{"Answer": "cat"}', '["cat"]',
                                   '{"answer": ["cat"]}', '{"answer": "cat", "confidence": 0.2}',
                                   '```json\n{"answer": "cat", "not": true}\n```', '{}', '{"answer": null}'])
def test_a_choice_reply_that_is_not_exactly_the_object_asked_for_is_unparsed(parser, reply):
    """answer_format=choice: only the object asked for, its one key `answer` given once, names a class; another
    key beside it may deny it, and json.loads keeps the last of two (`dog` was read from
    `{"answer":"cat","answer":"dog"}`, `cat` from `{"answer":"cat","not":true}`). JSON is never re-read as text."""
    assert parse_choice(READERS[parser](THINGS), reply).pred is None


@pytest.mark.parametrize("reply", ['{"answer": "cat"}', '```json\n{"answer": "cat"}\n```', '```{"answer":"cat"}```',
                                   ' {"answer": "Cat"} ', '"cat"', 'cat'])
def test_a_choice_reply_in_the_object_asked_for_or_one_code_fence_counts(reply):
    assert parse_choice(StrictReader(THINGS), reply) == Parsed(THINGS.index("cat"), "class")


@pytest.mark.parametrize("reply", ["\ufeffcat", "\u200bcat\u200b", "\u200fcat.", "\u2068Cat\u2069", "cat。",
                                   "Answer: \u200bcat", "**cat**\u200d", "「cat」。"])
def test_format_characters_at_the_ends_and_an_ideographic_full_stop_are_wrappers(reply):
    """A byte order mark, zero-width and bidi characters (Unicode Cf) around an answer and "。" as its trailing
    period are removed like whitespace and "." (before: "\ufeffcat" was unparsed); never two periods, and a
    format character inside a word stays."""
    assert StrictReader(THINGS).parse(reply) == Parsed(THINGS.index("cat"), "class")
    assert StrictReader(THINGS).parse(reply.replace("at", "\u200bat")).pred is None
    assert StrictReader(THINGS).parse("cat。。").pred is None and StrictReader(THINGS).parse("cat.。").pred is None



def test_the_table_bites_the_lenient_reader_reads_some_denials_as_their_class():
    """The same table read by the lenient parser (v3): denials in languages it has no word for, English hedges and
    confidences are read as a class they do not assert. What `lenient` is marked for."""
    wrong = misread(lambda classes, text: AnswerParser(classes).parse(text).pred, TABLE)
    assert len(wrong) >= 50
    assert ("Det är inte en cat", None, "cat") in wrong and ("3 (confidence: 0.97)", "three", "zero") in wrong


@pytest.mark.parametrize("text, reason", [("seven", "class"), ("Seven.", "class"), ("The answer is: seven", "class"),
                                          ("**seven**", "class"), ('"seven"', "class"), ("seven..", UNPARSED),
                                          ("Answer: Answer: seven", UNPARSED), ("7", UNPARSED), ("", UNPARSED),
                                          (None, UNPARSED), ("Answer:", UNPARSED), ("seven!", UNPARSED)])
def test_the_wrappers_are_the_documented_ones_once_each(text, reason):
    """One label, one trailing period; a number is not its word; anything else is unparsed (reason `unparsed`)."""
    assert StrictReader(MINI).parse(text) == Parsed(MINI.index("seven") if reason == "class" else None, reason)


@pytest.mark.parametrize("names", [["sea_lion", "Sea Lion"], ["golfcourse", "Golf-Course"], ["café", "Cafe"],
                                   ["cat", "***"]])
def test_class_names_the_strict_reader_cannot_tell_apart_are_refused_in_one_line(names):
    with raises_one_line(EndpointError) as refused:
        ChatClassifier(EndpointSettings("http://127.0.0.1:1/v1", "tiny"), ClientSettings(), names, "data")
    assert repr(names[1]) in str(refused.value)


def test_the_readers_are_named_once_and_the_default_is_the_cards():
    assert tuple(READERS) == ANSWER_PARSERS and ANSWER_PARSERS[0] == CARD_PARSER == "strict"
    assert ClientSettings().answer_parser == CARD_PARSER and EndpointSettings("http://127.0.0.1:1/v1", "m").answer_format \
        == "choice"
    assert CLARIFY_TURN.format(classes="; ".join(MINI)).endswith("eight; nine")
    with raises_one_line(ValueError, "model.answer_parser must be strict or lenient, got 'loose'"):
        ClientSettings(answer_parser="loose")


def test_a_record_written_before_strict_reading_reads_its_abstentions_as_unparsed_and_lenient():
    """scores.json from before: `abstained` per split, no answer_parser (a lenient parser): its count is read as
    unparsed, and the record is under another protocol than the card's."""
    old = {"base_url": "http://127.0.0.1:1/v1", "api_model": "m", "max_requests": None, "parser_version": 3,
           "per_split": {"test": {"images": 4, "requests": 4, "abstained": 3, "unanswered": 0}}}
    usage = EndpointUsage.from_json(old)
    assert usage.per_split["test"] == RequestStats(images=4, requests=4, unparsed=3)
    assert usage.unparsed_rate == 0.75 and usage.reader == "lenient v3"
    assert usage.reader_differences() == ["answer parser lenient v3, card strict"]
    assert "3 unparsed (75.0% of 4 answers; 0 denying a class, 0 alternatives; answer parser lenient v3)" == \
        usage.unparsed_line()


def test_a_clarifying_turn_puts_a_record_under_another_protocol():
    """model.clarify=true asks the answers a one-turn entry counts wrong a second time: marked like the lenient
    reader (before: its numbers entered card rankings unmarked)."""
    usage = EndpointUsage("http://127.0.0.1:1/v1", "m", {"test": RequestStats(images=4, requests=5, clarified=1)}, None,
                     StrictReader.version, answer_parser=CARD_PARSER, answer_format="choice", clarify=True)
    assert usage.reader_differences() == ["clarifying turn (model.clarify=true), card one turn"]
    assert EndpointUsage.from_json(usage.to_json()) == usage
    assert EndpointUsage.from_json({**usage.to_json(), "clarify": False}).reader_differences() == []


# ------------------------------------------------------------------------------ end to end through evaluate.py
fastapi = pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")  # helpers.asgi_on_localhost serves the stand-in
openai_types = pytest.importorskip("openai.types.chat")

N_IMAGES = 12
SPLITS = ("test", "common", "random_linf_30")


def mini_head(mini_dir: Path, out: Path) -> tuple[Path, dict[str, int]]:
    """The first N images of the mini benchmark's test, common and control splits, and each image's label by the
    sha256 of its stored PNG bytes (what the stand-in endpoint denies)."""
    import datasets

    from rgb.data import load_split
    from rgb.data.mini import DATASET
    from rgb.data.snapshot import write_readme, write_split

    labels = {}
    for name in SPLITS:
        split = load_split(str(mini_dir), DATASET, name).select(range(N_IMAGES))
        rows = split.cast_column("image", datasets.Image(decode=False))[:]
        rows["image"] = [image["bytes"] for image in rows["image"]]
        write_split(out / "data" / DATASET / f"{name}.parquet", MINI, rows)
        labels.update({hashlib.sha256(b).hexdigest(): int(y) for b, y in zip(rows["image"], rows["label"])})
    write_readme(out, "first images of the mini benchmark")
    return out, labels


class Denier:
    """A chat-completions endpoint (`app`, served on 127.0.0.1 by helpers.asgi_on_localhost) that ignores
    response_format and denies, in one of the table's languages (image by image in turn), the true class of every
    image it is shown; `asked` counts its requests."""

    def __init__(self, labels: dict[str, int]):
        self.templates = [t for ts in DENIALS.values() for t in ts] + HEDGES
        self.asked = 0
        app = fastapi.FastAPI()

        @app.post("/v1/chat/completions")
        async def chat(request: fastapi.Request):
            body = await request.json()
            url = body["messages"][-1]["content"][1]["image_url"]["url"]
            label = labels[hashlib.sha256(base64.b64decode(url.split(",", 1)[1])).hexdigest()]
            text = self.templates[self.asked % len(self.templates)].format(c=MINI[label])
            self.asked += 1
            return openai_types.ChatCompletion(
                id="chatcmpl-1", object="chat.completion", created=int(time.time()), model="denier",
                choices=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}],
                usage={"prompt_tokens": 20, "completion_tokens": 5, "total_tokens": 25},
            ).model_dump(mode="json", exclude_unset=True)

        self.app = app


def test_an_endpoint_denying_every_image_scores_zero_end_to_end_and_every_answer_is_unparsed(tmp_path, mini_dir):
    from rgb.commands.evaluate import run_evaluation
    from rgb.commands.train import train
    from rgb.data.mini import DATASET
    from rgb.evaluation.leaderboard import build_leaderboard, find_records, to_markdown
    from rgb.evaluation.model_eval import format_table
    from rgb.evaluation.records import SCORES_FILE, ScoresRecord
    from rgb.evaluation.scores import OTHER_PROTOCOL

    bench, labels = mini_head(mini_dir, tmp_path / "bench")
    run = tmp_path / "outputs" / "train" / DATASET / "api_denier"
    out = tmp_path / "outputs" / "eval" / DATASET / run.name

    def config(name: str, *overrides: str):
        return helpers.compose_config(name, f"paths.root_dir={tmp_path}", f"paths.mini_dir={bench}", *overrides)

    endpoint = Denier(labels)
    with helpers.asgi_on_localhost(endpoint.app) as base_url:
        def make(*overrides: str) -> None:  # train.py model=api_chat: model.json only, the defaults' format
            train(config("train", "model=api_chat", f"model.base_url={base_url}", "model.api_model=denier",
                         "model.check_endpoint=false", "model.max_concurrency=2", f"run_dir={run}", *overrides))

        def evaluate() -> tuple[ScoresRecord, dict]:
            run_evaluation(config("evaluate", f"run={run}", "protocol=black_box"))
            return ScoresRecord.load(out / SCORES_FILE), json.loads((out / SCORES_FILE).read_text())

        make()
        assert json.loads((run / "model.json").read_text())["api"]["answer_format"] == "choice"
        record, saved = evaluate()
        asked = endpoint.asked
        assert 0 < asked <= N_IMAGES * len(SPLITS)
        settings = {"test": record.black_box.settings["test"], "common": record.black_box.settings["common"],
                    "control": record.control}
        assert all(a.correct == 0 and a.total == N_IMAGES for a in settings.values()), settings
        answers = N_IMAGES * len(SPLITS)
        assert saved["api"]["total"]["unparsed"] == answers and saved["api"]["unparsed_rate"] == 1.0
        assert saved["api"]["answer_parser"] == "strict" and saved["api"]["parser_version"] == 4
        assert saved["api"]["per_split"]["test"]["unparsed"] == N_IMAGES
        assert saved["api"]["answer_format"] == "choice"
        assert (f"{answers} unparsed (100.0% of {answers} answers; answer parser strict v4; answer format choice)"
                in format_table(record))
        assert record.differences_for("black_box") == []  # the card's reader: a card entry

        # the same cached answers re-read by the lenient reader (a client setting: the same run dir), asking nothing
        make("model.answer_parser=lenient")
        lenient, saved = evaluate()
        assert endpoint.asked == asked and lenient.api.total["requests"] == 0
    assert saved["api"]["answer_parser"] == "lenient" and lenient.api.parser_version == 3
    assert lenient.black_box.settings["test"].correct > 0  # it reads some denials as the very class they deny
    assert "answer parser lenient v3, card strict" in lenient.differences_for("black_box")
    board = build_leaderboard(find_records([tmp_path / "outputs" / "eval"]), "black_box", [DATASET])
    assert [r.status for r in board.rows] == [OTHER_PROTOCOL] and board.rows[0].rank is None
    assert "answer parser lenient v3, card strict" in to_markdown(board)
    run_evaluation(config("evaluate", f"pool=[{tmp_path / 'outputs' / 'eval'}]", "protocol=black_box", "site=true",
                          f"leaderboard_datasets=[{DATASET}]"))
    markdown = next(tmp_path.rglob("leaderboard.md")).read_text()
    assert "Answers read as no class" in markdown and lenient.api.unparsed_line() in markdown
    page = next(tmp_path.rglob(f"site/models/{distinct_name(run.name)}.html")).read_text()
    assert html.escape(lenient.api.unparsed_line()) in page and OTHER_PROTOCOL in page
