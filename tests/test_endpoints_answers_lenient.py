"""The lenient answer parser (rgb.endpoints.answers.AnswerParser, version 3: `model.answer_parser=lenient`) on a
table of answers over class lists like the benchmark's: which class each answer names, or why it abstains (no class,
several, negation, alternative, or an answer in a script whose denials it cannot read that is not a bare class
name: unjudged). The strict reader, the card's: test_endpoints_answers.py."""

import pytest

from helpers import raises_one_line
from rgb.data.mini import CLASS_NAMES as MINI
from rgb.commands import main as cli
from rgb.endpoints.answers import REASONS, REFUSALS, AnswerParser, Parsed, parse_answer, parse_choice
from rgb.endpoints.settings import EndpointSettings, ClientSettings
from rgb.models.chat import ChatClassifier
from rgb.endpoints.client import EndpointError

DIGITS = [str(i) for i in range(10)]
UC_MERCED = ["agricultural", "airplane", "baseballdiamond", "beach", "buildings", "chaparral", "denseresidential",
             "forest", "freeway", "golfcourse", "harbor", "intersection", "mediumresidential", "mobilehomepark",
             "overpass", "parkinglot", "river", "runway", "sparseresidential", "storagetanks", "tenniscourt"]
CALTECH = ["Faces", "Faces_easy", "Leopards", "Motorbikes", "accordion", "airplanes", "anchor", "ant", "barrel",
           "bass", "butterfly", "cougar_body", "cougar_face", "sea_horse", "wild_cat"]
PETS = ["Abyssinian", "american_bulldog", "american_pit_bull_terrier", "basset_hound", "beagle", "Bengal", "Birman",
        "Bombay", "boxer", "British_Shorthair", "chihuahua", "Egyptian_Mau", "english_cocker_spaniel",
        "english_setter", "german_shorthaired", "great_pyrenees", "havanese", "japanese_chin", "keeshond",
        "leonberger", "Maine_Coon", "miniature_pinscher", "newfoundland", "Persian", "pomeranian", "pug", "Ragdoll",
        "Russian_Blue", "saint_bernard", "samoyed", "scottish_terrier", "shiba_inu", "Siamese", "Sphynx",
        "staffordshire_bull_terrier", "wheaten_terrier", "yorkshire_terrier"]
CARS = ["AM General Hummer SUV 2000", "Audi TT RS Coupe 2012", "Audi TTS Coupe 2012", "BMW M3 Coupe 2012",
        "Bentley Continental GT Coupe 2007", "Bentley Continental GT Coupe 2012", "Chevrolet Express Van 2007",
        "Chevrolet Express Cargo Van 2007"]
SCRIPTS = ["狗", "猫", "金鱼", "собака", "кошка", "σκύλος", "γάτα", "كلب", "قطة"]
THINGS = ["hot dog", "dog", "cat", "wild cat", "Grey whale", "colour", "tyre", "jewellery", "aeroplane", "glass",
          "glasses", "sea_lion", "Boeing 747-400"]
LISTS = {"mini": MINI, "digits": DIGITS, "ucm": UC_MERCED, "caltech": CALTECH, "pets": PETS, "cars": CARS,
         "scripts": SCRIPTS, "things": THINGS, "tires": ["tire", "tyres"], "zh": ["狗", "猫", "鸟"],
         "ja": ["犬", "ネコ", "鳥"], "ko": ["개", "고양이", "새"], "th": ["หมา", "แมว", "นก"],
         "accents": ["café", "Pyrénées", "São Paulo", "crème brûlée", "Ελλάδα"]}

# (class list, answer, the class it names or None, why: "class" or the reason of the abstention)
TABLE = [
    # the mini benchmark (number words) and digit names
    ("mini", "three", "three", "class"), ("mini", "Three.", "three", "class"), ("mini", "3", "three", "class"),
    ("mini", "**seven**", "seven", "class"), ("mini", "The answer is: two.", "two", "class"),
    ("mini", "I think it is a one", "one", "class"), ("mini", "Final answer: six\nBecause the loop", "six", "class"),
    ("mini", "three or eight", None, "alternative"), ("mini", "one, two", None, "several"),
    ("mini", "a digit", None, "no class"), ("mini", "It is not 3.", None, "negation"),
    ("mini", "Answer: five", "five", "class"), ("mini", "The answer is **Nine**", "nine", "class"),
    ("mini", "  FOUR\n", "four", "class"), ("mini", "It shows the digit eight.", "eight", "class"),
    ("mini", "I cannot tell.", None, "no class"),
    ("digits", "3", "3", "class"), ("digits", "three", "3", "class"), ("digits", "Seven.", "7", "class"),
    ("digits", "zero", "0", "class"), ("digits", "The digit 8", "8", "class"), ("digits", "`4`", "4", "class"),
    ("digits", "Answer: 9", "9", "class"), ("digits", "It is not 3.", None, "negation"),
    ("digits", "isn't 5", None, "negation"), ("digits", "3 or 8", None, "alternative"),
    ("digits", "either one or seven", None, "alternative"), ("digits", "twelve", None, "no class"),
    ("digits", "3, 5", None, "several"), ("digits", "", None, "no class"), ("digits", "   ", None, "no class"),
    ("digits", None, None, "no class"),
    # UC Merced-like names: joined words, British spellings, plurals
    ("ucm", "golf course", "golfcourse", "class"), ("ucm", "Golf Course.", "golfcourse", "class"),
    ("ucm", "golf-course", "golfcourse", "class"), ("ucm", "harbour", "harbor", "class"),
    ("ucm", "Harbours", "harbor", "class"), ("ucm", "sparse residential", "sparseresidential", "class"),
    ("ucm", "a sparse residential area", "sparseresidential", "class"),
    ("ucm", "Dense Residential", "denseresidential", "class"), ("ucm", "building", "buildings", "class"),
    ("ucm", "storage tanks", "storagetanks", "class"), ("ucm", "a storage tank", "storagetanks", "class"),
    ("ucm", "tennis court", "tenniscourt", "class"), ("ucm", "Parking lot", "parkinglot", "class"),
    ("ucm", "a mobile home park", "mobilehomepark", "class"), ("ucm", "aeroplane", "airplane", "class"),
    ("ucm", "beaches", "beach", "class"), ("ucm", "agricultural land", "agricultural", "class"),
    ("ucm", "The class is: baseball diamond", "baseballdiamond", "class"),
    ("ucm", "an airplane on a runway", None, "several"), ("ucm", "not a harbor, a beach", None, "negation"),
    ("ucm", "a lake", None, "no class"),
    # Caltech-like names: case, plurals, a name inside a longer one
    ("caltech", "leopard", "Leopards", "class"), ("caltech", "Leopards", "Leopards", "class"),
    ("caltech", "faces", "Faces", "class"), ("caltech", "a face", "Faces", "class"),
    ("caltech", "Faces easy", "Faces_easy", "class"), ("caltech", "motorbike", "Motorbikes", "class"),
    ("caltech", "motor bikes", "Motorbikes", "class"), ("caltech", "an airplane", "airplanes", "class"),
    ("caltech", "a wild cat", "wild_cat", "class"), ("caltech", "ants", "ant", "class"),
    ("caltech", "seahorse", "sea_horse", "class"), ("caltech", "butterflies", "butterfly", "class"),
    ("caltech", "bass", "bass", "class"), ("caltech", "cougar face", "cougar_face", "class"),
    ("caltech", "cougar", None, "no class"), ("caltech", "an anchor or a barrel", None, "alternative"),
    # pets and cars
    ("pets", "Maine Coon", "Maine_Coon", "class"), ("pets", "a maine coon cat", "Maine_Coon", "class"),
    ("pets", "It's a Siamese.", "Siamese", "class"),
    ("pets", "American Pit Bull Terrier", "american_pit_bull_terrier", "class"),
    ("pets", "staffordshire bull terrier", "staffordshire_bull_terrier", "class"),
    ("pets", "great pyrenees", "great_pyrenees", "class"), ("pets", "Shiba Inu", "shiba_inu", "class"),
    ("pets", "a terrier", None, "no class"),
    ("pets", "english setter or english cocker spaniel", None, "alternative"),
    ("pets", "a beagle, not a basset hound", None, "negation"),
    ("pets", "No, it is a pug.", None, "negation"), ("pets", "None of them, maybe a pug", None, "negation"),
    ("cars", "Audi TT RS Coupe 2012", "Audi TT RS Coupe 2012", "class"),
    ("cars", "audi tts coupe 2012", "Audi TTS Coupe 2012", "class"),
    ("cars", "a Chevrolet Express Cargo Van 2007", "Chevrolet Express Cargo Van 2007", "class"),
    ("cars", "Chevrolet Express Van 2007", "Chevrolet Express Van 2007", "class"),
    ("cars", "Bentley Continental GT Coupe", None, "no class"),
    # other scripts, full-width letters, markdown
    ("scripts", "狗", "狗", "class"), ("scripts", "猫", "猫", "class"), ("scripts", "这是一只猫。", "猫", "class"),
    ("scripts", "金鱼", "金鱼", "class"), ("scripts", "Собака.", "собака", "class"),
    ("scripts", "КОШКА", "кошка", "class"), ("scripts", "ΣΚΎΛΟΣ", "σκύλος", "class"),
    ("scripts", "γάτα", "γάτα", "class"), ("scripts", "كلب", "كلب", "class"), ("scripts", "قطة", "قطة", "class"),
    ("scripts", "不是狗", None, "negation"), ("scripts", "собака, кошка", None, "several"),
    ("scripts", "Это не собака", None, "negation"), ("scripts", "собака или кошка", None, "alternative"),
    ("scripts", "狗或猫", None, "alternative"), ("scripts", "Είναι γάτα.", "γάτα", "class"),
    ("scripts", "a dog", None, "no class"),
    ("things", "ｃａｔ", "cat", "class"), ("things", "> **Cat**", "cat", "class"), ("things", "Cats", "cat", "class"),
    ("things", "hot dog or dog?", None, "alternative"), ("things", "hot dogs", "hot dog", "class"),
    ("things", "a wild cat chasing a cat", None, "several"), ("things", "isn't a cat", None, "negation"),
    ("things", "It cannot be a dog", None, "negation"),
    ("things", "gray whale", "Grey whale", "class"), ("things", "color", "colour", "class"),
    ("things", "tires", "tyre", "class"), ("things", "jewelry", "jewellery", "class"),
    ("things", "airplane", "aeroplane", "class"), ("things", "glasses", "glasses", "class"),
    ("things", "a glass", "glass", "class"), ("things", "It is a Sea Lion!", "sea_lion", "class"),
    ("things", "boeing 747 400", "Boeing 747-400", "class"), ("things", "a cat next to a sea lion", None, "several"),
    ("tires", "tyre", None, "several"),  # one word that fits two classes
    # parser 3 (each row read otherwise by version 2): a Chinese class name inside a longer word names no class
    # (熊猫 panda, 猫头鹰 owl, 海狗 fur seal, 子犬 puppy), only the word a frame holds (KEPT below: "是一只猫")
    ("zh", "熊猫", None, "no class"), ("zh", "猫头鹰", None, "no class"), ("zh", "这是熊猫。", None, "no class"),
    ("zh", "一只海狗", None, "no class"), ("zh", "答案：熊猫", None, "no class"),
    ("zh", "是一只猫头鹰吧", None, "no class"), ("ja", "子犬", None, "no class"),
    # scripts whose denials the parser cannot read (kana, Hangul, Thai): only a bare class name counts
    ("ja", "ネコではありません", None, "unjudged"), ("ja", "犬じゃない", None, "unjudged"),
    ("ja", "これはネコです", None, "unjudged"), ("ko", "고양이 아니에요", None, "unjudged"),
    ("ko", "개 아님", None, "unjudged"), ("ko", "새 고양이", None, "unjudged"), ("th", "แมวน้ำ", None, "unjudged"),
    ("th", "ไม่ใช่แมว", None, "unjudged"), ("th", "นกฮูก", None, "unjudged"),
    # accents and diacritics may be dropped
    ("accents", "cafe", "café", "class"), ("accents", "Pyrenees", "Pyrénées", "class"),
    ("accents", "sao paulo", "São Paulo", "class"), ("accents", "A creme brulee.", "crème brûlée", "class"),
    ("accents", "ΕΛΛΑΔΑ", "Ελλάδα", "class"), ("pets", "Great Pyrénées", "great_pyrenees", "class"),
    ("accents", "It is not a cafe", None, "negation"),
    # class names that are ordinary words: the pronoun "one", counts, modifiers, denials, a corrected first line
    ("mini", "This one is blurry", None, "no class"), ("mini", "It could be any one of them", None, "no class"),
    ("digits", "this is one of the digits", None, "no class"), ("digits", "Anything but 3.", None, "negation"),
    ("digits", "Unlikely to be a 3.", None, "negation"), ("mini", "Other than 7, nothing fits", None, "negation"),
    ("digits", "3\nActually, it's 8", None, "several"), ("mini", "Answer: 3\nActually, it's 8", None, "several"),
    ("mini", "three\nWait, no: eight", None, "negation"), ("caltech", "bass guitar", None, "no class"),
    ("caltech", "a bass guitar on a stand", None, "no class"), ("things", "hot dog stand", None, "no class"),
]
# Answers both versions read alike, kept here so that parser 3's stricter rules are seen not to over-reach.
KEPT = [
    ("zh", "猫", "猫", "class"), ("zh", "这是猫。", "猫", "class"), ("zh", "是一只猫", "猫", "class"),
    ("zh", "图中是一只鸟。", "鸟", "class"), ("zh", "可能是狗", "狗", "class"), ("zh", "不是狗", None, "negation"),
    ("zh", "狗或猫", None, "alternative"), ("zh", "这是一只猫头鹰，不是鸟", None, "negation"),
    ("ja", "ネコ", "ネコ", "class"), ("ja", "**犬**", "犬", "class"), ("ko", "고양이.", "고양이", "class"),
    ("ko", "Answer: 개", "개", "class"), ("th", "แมว", "แมว", "class"), ("caltech", "a bass", "bass", "class"),
    ("caltech", "bass fish", "bass", "class"), ("things", "a cat sitting on a mat", "cat", "class"),
    ("mini", "It is the digit one.", "one", "class"), ("mini", "The number one", "one", "class"),
    ("mini", "Answer: 8\nIt has two loops", "eight", "class"),
    ("digits", "I think it's a 7 because of the loop", "7", "class"), ("pets", "a Siamese kitten", "Siamese", "class"),
]


def test_the_table_is_large_and_covers_every_reason():
    assert len(TABLE) >= 80 and {row[3] for row in TABLE} == set(REASONS) and set(REFUSALS) < set(REASONS)
    assert AnswerParser.version == 3 and AnswerParser.name == "lenient"


@pytest.mark.parametrize("names, text, expected, reason", TABLE + KEPT)
def test_answers_map_to_their_class_or_abstain_with_a_reason(names, text, expected, reason):
    classes = LISTS[names]
    parsed = AnswerParser(classes).parse(text)
    assert (parsed.pred, parsed.reason) == (None if expected is None else classes.index(expected), reason)
    assert parse_answer(text, classes, "lenient") == parsed.pred


@pytest.mark.parametrize("text, expected, reason", [
    ('{"answer": "three"}', "three", "class"), ('{"answer":"seven"}', "seven", "class"),
    ('{"answer": "Three."}', "three", "class"), ('{"answer": "not 3"}', None, "negation"),
    ("3", "three", "class"), ("It is not 3.", None, "negation"), ('{"label": "three"}', None, "unparsed"),
    ('["three"]', None, "unparsed"), ("", None, "no class"), (None, None, "no class"),
])
def test_a_choice_answer_is_its_json_value_else_the_text_parser_reads_it(text, expected, reason):
    """Text that is no JSON is read by the text parser; JSON other than the object asked for is unparsed."""
    parser = AnswerParser(MINI)
    assert parse_choice(parser, text) == Parsed(None if expected is None else MINI.index(expected), reason)


@pytest.mark.parametrize("names", [["sea_lion", "sea lion"], ["golfcourse", "Golf Course"], ["Cat", "cat"],
                                   ["cat", "***"]])
def test_class_names_that_read_the_same_are_refused_in_one_line(names):
    with raises_one_line(EndpointError) as refused:
        AnswerParser(names)
    assert repr(names[1]) in str(refused.value)
    with pytest.raises(EndpointError) as refused:  # as train.py model=api_chat and every load of its model.json build it
        ChatClassifier(EndpointSettings("http://127.0.0.1:1/v1", "tiny"), ClientSettings(), names, "data")
    assert cli._error_line(refused.value) == str(refused.value)
