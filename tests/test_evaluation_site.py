"""The leaderboard site (evaluate.py pool=[...] site=true): every number it shows is leaderboard.json's, and a real
headless Chromium (Debian's `chromium`, driven through Playwright's protocol client; no browser download) sorts,
filters, follows every link and logs no console error.

The pool is demo-like: a model the pool evaluates from its train run (the conftest's tiny_run, its attack runs
written as attack.py writes them), plus scores.json files of a complete, an incomplete, a PARTIAL and an
other-protocol entry.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shutil
import unicodedata
from contextlib import contextmanager
from dataclasses import replace
from html import escape
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest
from helpers import card_protocol, datamodule, raises_one_line, record, save_pool, white_box_settings, write_attack

from rgb.core.files import NameClashError
from rgb.evaluation.leaderboard import build_leaderboard, find_records
from rgb.evaluation.records import Accuracy, ProtocolScore, TrainRun
from rgb.evaluation.request import EvalRequest, RunOutputs
from rgb.evaluation.run import PoolRequest, evaluate_pool
from rgb.evaluation.site import SiteEntry, page_names, write_site

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.fixture(scope="module")
def site(tmp_path_factory, mini_dir, tiny_run, clean_pred) -> Path:
    """The leaderboard dir of a demo-like pool written with site=true."""
    root = tmp_path_factory.mktemp("pool")
    dm = datamodule(mini_dir)
    for norm, robust in (("l1", np.arange(200) % 3 == 0), ("l2", np.arange(200) % 2 == 0), ("linf", np.zeros(200))):
        write_attack(root / "attack", norm, tiny_run, dm, robust, clean_pred)
    trained = EvalRequest(
        model=RunOutputs(tiny_run, "tiny-ce", root / "eval" / "digits" / "tiny-ce"), attack_dir=root / "attack",
        data=lambda: datamodule(mini_dir), protocol="white_box", transfer=False, severity_sweep=False,
        allow_partial=False, max_images=None, worst_k=(1, 5), device="cpu", batch_size=128,
        api_cache_dir=root / "api_cache", dry_run=False, wandb_project=None)
    protocol = card_protocol("digits", image_size=32)

    def entry(name, values, loss, **fields):
        made = record(name, "digits", values, protocol=fields.pop("protocol", protocol), **fields)
        return replace(made, model=replace(made.model, loss=loss))

    partial = entry("skim", [0.5] * 5, "ce")
    partial = replace(partial, white_box=ProtocolScore("white_box", {
        **partial.white_box.settings, "autoattack_linf": Accuracy(10, 20, partial=True)}), max_images=20)
    # trades carries its train run's card, counts and seed (a pool of eval folders); half is a model behind an
    # endpoint (family api: model.json says 0 epochs)
    carded = TrainRun.of({"run_name": "trades", "run_dir": "train/digits/trades"}, {
        "epochs": 30, "seed": 7, "parameters": {"total": 368_234, "trainable": 368_234, "non_trainable": 0},
        "card": {"title": "Theoretically Principled Trade-off", "venue": "ICML 2019", "additional_data": False,
                 "url": "https://arxiv.org/abs/1901.08573"}})
    half = entry("half", [0.6, 0.5, None, 0.2, None], "ce", train=TrainRun.of({"run_name": "half"}, {"epochs": 0}))
    half = replace(half, model=replace(half.model, family="api"))
    others = [entry("trades", [0.8, 0.7, 0.3, 0.4, 0.3], "trades", train=carded), half,
              partial, entry("big-eps", [0.7, 0.6, 0.5, 0.4, 0.3], "ce",
                             protocol=card_protocol("digits", image_size=32, l2=1.0))]
    save_pool(others, root / "files")
    skim_file = root / "files" / "digits" / "skim" / "scores.json"
    skim_file.rename(skim_file.with_name("scores.partial.json"))
    out = root / "leaderboard"
    evaluate_pool(PoolRequest((trained, root / "files", skim_file.with_name("scores.partial.json")), "white_box",
                              out, ("digits",), "borda", site=True))
    return out


class _Collect(HTMLParser):
    """Every element's tag and attributes, and the text of each numeric table cell."""

    def __init__(self):
        super().__init__()
        self.elements, self.cells, self._cell = [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag == "td" and "num" in (attrs.get("class") or ""):
            self._cell = [attrs, ""]

    def handle_data(self, data):
        if self._cell is not None:
            self._cell[1] += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.cells.append((self._cell[0], self._cell[1].strip()))
            self._cell = None


def _parse(page: Path) -> _Collect:
    parser = _Collect()
    parser.feed(page.read_text())
    return parser


def _at(document, path: str):
    for key in path.split("/"):
        document = document[int(key)] if isinstance(document, list) else document[key]
    return document


def test_every_number_of_the_site_is_leaderboard_json(site, tiny_run):
    boards = {"white_box": json.loads((site / "leaderboard.json").read_text())}
    assert json.loads((site / "site" / "data" / "leaderboard.white_box.json").read_text()) == boards["white_box"]
    boards["black_box"] = json.loads((site / "site" / "data" / "leaderboard.black_box.json").read_text())
    pages = [site / "site" / "index.html", *sorted((site / "site" / "models").glob("*.html"))]
    assert len(pages) == 1 + 5  # one page per model
    checked = 0
    for page in pages:
        parsed = _parse(page)
        for attrs, text in parsed.cells:  # a numeric cell shows a number of the board, or says it has none
            assert attrs.get("data-json") or text in ("missing", "—"), (page.name, attrs, text)
        for tag, attrs in parsed.elements:
            if attrs.get("data-json"):
                protocol, path = attrs["data-json"].split(":", 1)
                assert float(attrs["data-value"]) == _at(boards[protocol], path), (page.name, path)
                checked += 1
        for attrs, text in parsed.cells:  # in %, 2 decimals (RobustBench's format); fractions in the JSON
            if attrs.get("data-json", "").endswith("/accuracy"):
                assert text.split()[0] == f"{100 * float(attrs['data-value']):.2f}%"
    assert checked > 50
    index = (site / "site" / "index.html").read_text()
    rows = {row["model"]: row for row in boards["white_box"]["rows"]}
    assert rows["tiny-ce"]["status"] == "complete" and rows["half"]["status"] == "incomplete"
    assert rows["skim"]["status"] == "PARTIAL" and rows["big-eps"]["status"] == "other protocol"
    for heading in ("Incomplete entries: ranked apart", "Under another protocol", "PARTIAL", "incomplete"):
        assert heading in index
    assert "No record of this pool is scored under black_box" in index
    scatter = index[index.index("Sum vs clean accuracy"):].split("</svg>")[0]  # complete entries only
    assert "<title>tiny-ce:" in scatter and not any(f"<title>{m}:" in scatter for m in ("half", "skim", "big-eps"))
    page = _model_pages(site / "site")["tiny-ce"]  # provenance of the model the pool trained
    model_page = page.read_text()
    assert str(tiny_run.resolve()) in model_page and "Class-wise metrics" in model_page
    assert "linf/summary.json" in model_page and (page.with_suffix("") / "digits" / "scores.json").is_file()


def test_every_number_under_another_protocol_says_so(site):
    # big-eps was attacked at L2 1 (card 0.2857): its numbers showed unmarked in the plots, on its page, under a
    # "Sum (/5)" header and as the CSV/JSON `sum`
    board = json.loads((site / "leaderboard.json").read_text())
    index = next(i for i, row in enumerate(board["rows"]) if row["model"] == "big-eps")
    assert board["rows"][index]["sum"]["score"] is None and board["rows"][index]["sum"]["status"] == "other protocol"
    csv_row = next(r for r in csv.DictReader(io.StringIO((site / "leaderboard.csv").read_text()))
                   if r["model"] == "big-eps")
    assert csv_row["sum"] == "" and csv_row["status"] == "other protocol" and float(csv_row["partial_sum"]) == pytest.approx(2.5)
    details = (site / "leaderboard.md").read_text().split("## Accuracy per setting")[1]
    (line,) = [line for line in details.splitlines() if line.startswith("| big-eps |")]
    assert line.count("(other protocol)") == 5
    page = _model_pages(site / "site")["big-eps"]
    for html in (site / "site" / "index.html", page):
        parsed = _parse(html)
        numbers = [(attrs, text) for attrs, text in parsed.cells
                   if attrs.get("data-json", "").startswith(f"white_box:rows/{index}/")]
        assert len(numbers) == (6 if html.name == "index.html" else 5), html.name  # 5 settings (+ the sum)
        assert all(text.endswith("(other protocol)") for _, text in numbers), numbers
        bars = re.findall(rf'data-json="white_box:rows/{index}/[^"]*"[^>]*><title>([^<]*)</title>', html.read_text())
        assert len(bars) == 5 and all(title.endswith("(other protocol)") for title in bars), bars
    index_html = (site / "site" / "index.html").read_text()
    other_group = index_html.split("<h3>Under another protocol")[1].split("</table>")[0]
    assert ">sum (not a Sum /5)</th>" in other_group and "Sum (/5)" not in other_group
    assert "<h3>white_box: other protocol (digits: L2 1, card 0.2857)</h3>" in page.read_text()


def _model_pages(site_dir: Path) -> dict[str, Path]:
    """Each model's page, as index.html links it from the model's name."""
    links = {}

    class Links(HTMLParser):
        href = None

        def handle_starttag(self, tag, attrs):
            self.href = dict(attrs).get("href") if tag == "a" else None

        def handle_data(self, data):
            if self.href and self.href.startswith("models/"):
                assert links.setdefault(data, self.href) == self.href, data
            self.href = None

    Links().feed((site_dir / "index.html").read_text())
    return {model: site_dir / href for model, href in links.items()}


def test_models_whose_names_differ_only_in_unsafe_characters_get_a_page_each(tmp_path):
    # the audit's pool: `x 1`, `x+1` and `x_1` all linked to models/x_1.html, which showed one of them
    values = {"x 1": 0.1, "x+1": 0.2, "x_1": 0.3}
    records = [record(name, "digits", [value] * 5, protocol=card_protocol("digits", image_size=32))
               for name, value in values.items()]
    save_pool(records, tmp_path / "eval")
    pool = find_records([tmp_path / "eval"])
    board = build_leaderboard(pool, datasets=["digits"])
    write_site([board], [SiteEntry(file, r) for file, r in pool.items()], tmp_path / "site")
    pages = _model_pages(tmp_path / "site")
    assert sorted(pages) == sorted(values) and len(set(pages.values())) == 3
    for name, page in pages.items():
        html = page.read_text()
        assert f"<h1>{escape(name)}</h1>" in html and f"{100 * values[name]:.2f}%" in html, name
        assert not any(f"{100 * v:.2f}%" in html for other, v in values.items() if other != name), name
        copied = json.loads((page.with_suffix("") / "digits" / "scores.json").read_text())
        assert copied["model"]["run_name"] == name
    write_site([board], [SiteEntry(file, r) for file, r in pool.items()], tmp_path / "again")
    assert sorted(p.name for p in _model_pages(tmp_path / "again").values()) == sorted(p.name for p in pages.values())


def test_two_models_on_one_page_are_refused():
    """One name in NFC and in NFD reads as one: the two would share a page (and every other file), refused."""
    composed, decomposed = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    with raises_one_line(NameClashError, r"model 'cafe\\u0301' and model 'caf\\xe9' would both be written to caf"):
        page_names([decomposed, composed])
    assert len(set(page_names(["X", "x", "x 1", "x_1"]).values())) == 4  # case-only and punctuation: apart


@contextmanager
def _chromium():
    """Debian's headless Chromium through Playwright: the browser and a page; on leaving, no page logged an error."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    errors = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page()
            page.set_default_timeout(10_000)
            page.on("console", lambda message: message.type == "error" and errors.append(message.text))
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield browser, page
        finally:
            browser.close()
    assert errors == []


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_the_site_in_headless_chromium(site, tmp_path):
    index = site / "site" / "index.html"
    with _chromium() as (browser, page):
        page.goto(index.as_uri())

        ranked = page.locator("section#white_box table.sortable").first
        header = ranked.locator("thead th", has_text="digits clean")
        column = [t.strip() for t in ranked.locator("thead th").all_inner_texts()].index("digits clean")

        def clean_column() -> list[float]:
            return [float(v) for v in ranked.locator(f"tbody tr td:nth-child({column + 1})").evaluate_all(
                "cells => cells.map(c => c.dataset.value)")]

        header.click()  # the first click on an accuracy sorts best first
        assert clean_column() == sorted(clean_column(), reverse=True) and len(clean_column()) == 2
        assert header.get_attribute("aria-sort") == "descending"
        header.click()
        assert clean_column() == sorted(clean_column())
        assert "sort=digits%2Ftest&dir=ascending" in page.url

        page.select_option("select[data-filter-row=loss]", "trades")
        visible = page.locator("section#white_box tbody tr:visible td:nth-child(2)").all_inner_texts()
        assert visible == ["trades"]
        page.select_option("select[data-filter-row=loss]", "")
        page.select_option("select[data-filter-column=setting]", "autoattack_linf")
        shown = [t.strip() for t in ranked.locator("thead th:visible").all_inner_texts()]
        assert "digits Linf" in shown and "digits clean" not in shown
        assert shown[:4] == ["rank", "model", "Sum (/5)", "Borda"]  # the ranking keys before the settings
        # a transfer split: the white-box board's tables go (no Sum left over a setting it does not have)
        page.select_option("select[data-filter-column=setting]", "linf_30")
        assert page.locator("section#white_box table:visible").count() == 0
        assert page.locator("section#white_box .filtered-out").is_visible()
        page.select_option("select[data-filter-column=setting]", "")

        page.fill("#search", "TRA")  # the search box: model names (and recipe columns), any case
        all_visible = page.locator("section#white_box tbody tr:visible td:nth-child(2)").all_inner_texts()
        assert all_visible == ["trades"]
        page.select_option("select[data-filter-row=loss]", "ce")
        page.fill("#search", "")
        page.select_option("#show", "10")
        shared = page.url  # a filtered, sorted view, as a user copies it
        assert "loss=ce" in shared and "show=10" in shared
        expected = page.locator("section#white_box tbody tr:visible td:nth-child(2)").all_inner_texts()
        assert "trades" not in expected and expected

        fresh = browser.new_page()
        fresh.goto(shared)  # the shared link restores the view
        assert fresh.locator("select[data-filter-row=loss]").input_value() == "ce"
        assert fresh.locator("section#white_box tbody tr:visible td:nth-child(2)").all_inner_texts() == expected
        restored = fresh.locator("section#white_box table.sortable").first
        assert restored.locator("thead th", has_text="digits clean").get_attribute("aria-sort") == "ascending"
        fresh.close()

        page.goto(index.as_uri())
        page.set_viewport_size({"width": 700, "height": 900})
        scroller = page.locator("section#white_box .scroll").first
        # rank, model, Sum and Borda stay in view together (the model column alone did; Sum scrolled away)
        pinned = page.locator("section#white_box table.leaderboard").first.locator("tbody tr").first.locator("td")
        before = [pinned.nth(i).bounding_box()["x"] for i in range(5)]
        scroller.evaluate("el => { el.scrollLeft = 600; }")
        assert scroller.evaluate("el => el.scrollLeft") > 0  # the table is wider than the page
        after = [pinned.nth(i).bounding_box()["x"] for i in range(5)]
        assert all(abs(a - b) < 2 for a, b in zip(after[:4], before[:4])), (before, after)
        assert after[4] < before[4] - 100  # the first setting scrolled away
        page.set_viewport_size({"width": 1400, "height": 900})
        page.goto(index.as_uri())
        page.screenshot(path=str(tmp_path / "index.png"), full_page=True)
        if os.environ.get("RGB_SITE_SCREENSHOT"):  # docs/leaderboard-site.png is this view
            page.screenshot(path=os.environ["RGB_SITE_SCREENSHOT"], full_page=False)

        pages = [index, *sorted((site / "site" / "models").glob("*.html"))]
        for html in pages:
            page.goto(html.as_uri())
            targets = page.locator("a[href], img[src], link[href], script[src]").evaluate_all(
                "els => els.map(e => e.href || e.src)")
            for target in targets:
                if target.startswith(("data:", "https:")):  # a card's paper
                    continue
                url = urlparse(target)
                assert url.scheme == "file" and Path(unquote(url.path)).is_file(), (html.name, target)
            assert page.locator("svg.plot").count() > 0, html.name
        page.goto(pages[1].as_uri())
        page.locator("svg.plot rect[data-json]").first.hover()
        page.screenshot(path=str(tmp_path / "model.png"), full_page=True)
    assert (tmp_path / "index.png").stat().st_size > 10_000 and (tmp_path / "model.png").stat().st_size > 10_000


def _headers(html: str) -> list[str]:
    """The column titles of the first leaderboard table of a page."""
    head = html.split('<table class="sortable leaderboard">')[1].split("</thead>")[0]
    return [re.sub(r"<[^>]+>", "", th).strip() for th in re.findall(r"<th[^>]*>(.*?)</th>", head)]


def test_each_board_states_its_budgets_ranking_keys_first_and_the_citation(site):
    # no epsilon anywhere; Sum and Borda were the last of ~40 columns; no BibTeX for the benchmark
    index = (site / "site" / "index.html").read_text()
    card = card_protocol("digits", image_size=32).budgets
    white = index.split('<section class="board" id="white_box"')[1].split("</section>")[0]
    assert "<h2>White-box (AutoAttack): digits, L1, L2, Linf</h2>" in white
    assert (f"<li>digits, L1, eps = {card['l1']:.4g}; L2, eps = {card['l2']:.4g} (big-eps: eps = 1); "
            f"Linf, eps = 4/255</li>") in white
    assert _headers(white)[:6] == ["rank", "model", "Sum (/5)", "Borda", "digits clean", "digits common"]
    assert "@inproceedings{heuillet2026robustgenbench" in index and "RobustGenBench: A Benchmark" in index


def _pool_site(tmp_path: Path, entries: list[SiteEntry]) -> Path:
    """The site of a small pool (both boards) written from its SiteEntry list."""
    pool = {e.file: e.record for e in entries}
    boards = [build_leaderboard(pool, protocol, datasets=["digits"]) for protocol in ("white_box", "black_box")]
    write_site(boards, entries, tmp_path / "site")
    return tmp_path / "site"


def _entries(tmp_path: Path, records) -> list[SiteEntry]:
    save_pool(records, tmp_path / "eval")
    return [SiteEntry(file, r) for file, r in find_records([tmp_path / "eval"]).items()]


def test_scatter_labels_both_of_two_models_at_equal_scores_and_clean_is_read_across_boards(tmp_path):
    from rgb.data.catalog import TRANSFER_SPLITS
    from rgb.evaluation.scores import black_box_score

    protocol = card_protocol("digits", image_size=32)
    transfer = {split: {"clip": Accuracy(40, 100)} for split in TRANSFER_SPLITS}
    with_transfer = record("transfer", "digits", [0.9, 0.8, 0.5, 0.5, 0.5], protocol=protocol,
                           black_box=black_box_score(Accuracy(90, 100), Accuracy(80, 100), transfer, None))
    twins = [record(name, "digits", [0.7, 0.6, 0.3, 0.3, 0.3], protocol=protocol) for name in ("twin-a", "twin-b")]
    out = _pool_site(tmp_path, _entries(tmp_path, [with_transfer, *twins]))
    index = (out / "index.html").read_text()
    scatter = index[index.index("Sum vs clean accuracy (white_box"):].split("</svg>")[0]
    labels = re.findall(r'<text x="([\d.]+)" y="([\d.]+)" class="point-label">([^<]*)</text>', scatter)
    assert sorted(label for _, _, label in labels) == ["transfer", "twin-a", "twin-b"]
    spots = {label: (x, y) for x, y, label in labels}
    assert spots["twin-a"] != spots["twin-b"]  # stacked, never one label drawn over the other
    circles = re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', scatter)
    assert len(set(circles)) == 3
    # the black-box board said "digits clean: missing" for a model evaluated without transfer
    black = index.split('<section class="board" id="black_box"')[1].split("</section>")[0]
    assert "<li>digits, L1, eps = " in black and "Linf, eps = 4/255, 8/255, 30/255" in black
    board = json.loads((out / "data" / "leaderboard.white_box.json").read_text())
    row = next(i for i, r in enumerate(board["rows"]) if r["model"] == "twin-a")
    clean = re.search(rf'data-setting="test" data-json="(white_box:rows/{row}/[^"]*)" data-value="([^"]*)">([^<]*)<',
                      black)
    assert clean and clean.group(3) == "70.00%" and _at(board, clean.group(1).split(":", 1)[1]) == 0.7


def test_model_page_shows_parameters_card_rendered_report_and_one_sha(tmp_path):
    made = record("carded", "digits", [0.5950, 0.5, 0.4, 0.3, 0.2], protocol=card_protocol("digits", image_size=32))
    made = replace(made, model=replace(made.model, weights_sha256="ab12" * 16))
    (entry,) = _entries(tmp_path, [made])
    report = entry.file.parent / "zeroshot_report"
    report.mkdir()
    from rgb.evaluation.leaderboard import markdown_table

    (report / "report.md").write_text("\n".join(["# Zero-shot prompt ensembles: carded", "", "- weights: `x`", "",
                                                 *markdown_table(["ensemble", "acc"], [["cpe", "0.5"]],
                                                                 ["---", "---:"])]) + "\n")
    card = {"title": "A paper", "authors": ["A. One", "B. Two"], "venue": "NeurIPS", "url": "https://example.org",
            "additional_data": False, "bibtex": "@article{one2026, title={A paper}}"}
    meta = {"parameters": {"total": 1234567, "trainable": 4321}, "model_card": card}
    out = _pool_site(tmp_path, [replace(entry, meta=meta)])
    html = _model_pages(out)["carded"].read_text()
    assert "total 1,234,567, trainable 4,321" in html
    for text in ("A paper", "A. One, B. Two", "NeurIPS", '<a href="https://example.org">', "@article{one2026"):
        assert text in html, text
    assert html.count(made.model.weights_sha256) == 1  # listed twice (columns and provenance)
    assert '<table class="report"><thead><tr><th>ensemble</th><th>acc</th>' in html and "<pre>#" not in html
    assert "<li>weights: <code>x</code></li>" in html
    index = (out / "index.html").read_text()
    assert "total 1,234,567" not in index and '<td data-value="1234567">1.23 M</td>' in index  # full counts: its page
    assert _headers(index)[-12:-9] == ["paper", "venue", "extra data"]  # the card's columns, RobustBench's first
    assert '<td class="paper"><a href="https://example.org">A paper</a></td>' in index
    bare = _pool_site(tmp_path / "bare", _entries(tmp_path / "bare", [made]))
    assert "no model card recorded" in _model_pages(bare)["carded"].read_text()
    assert "paper" not in _headers((bare / "index.html").read_text())  # no card: no card columns


def test_a_pool_of_eval_folders_shows_what_the_records_train_run_carries(tmp_path):
    """No model.json at hand (a pool of eval folders): parameters, card, epochs, pretraining and the train run
    come from the scores record's `train` (TrainRun), not "—"."""
    from rgb.evaluation.records import TrainRun

    made = record("carried", "digits", [0.6, 0.5, 0.4, 0.3, 0.2], protocol=card_protocol("digits", image_size=32))
    train = TrainRun.of({"run_name": "carried", "run_dir": "train/digits/carried", "wandb_id": None},
                        {"epochs": 7, "seed": 3, "parameters": {"total": 2048, "trainable": 1024, "non_trainable": 1024},
                         "card": {"title": "Carried paper"},
                         "training": {"identity": {"model.pretrained": "laion2b"}}})
    out = _pool_site(tmp_path, _entries(tmp_path, [replace(made, train=train)]))
    html = _model_pages(out)["carried"].read_text()
    for text in ("total 2,048, trainable 1,024", "Carried paper", "pretrained=laion2b", "train/digits/carried"):
        assert text in html, text
    assert re.search(r"epochs</t[hd]>\s*<td>7<", html), "epochs"
    assert re.search(r"seed</t[hd]>\s*<td>3<", html), "seed"  # carried by the record's train, not "—"


def test_settings_png_labels_keep_four_decimals():
    from rgb.evaluation.plots import settings_figure

    texts = [t.get_text() for t in settings_figure({"digits": {"test": 0.5950, "common": 0.5}}, "t").axes[0].texts]
    assert "0.5950" in texts and "0.59" not in texts  # 0.5950 printed as 0.59


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium binary on PATH (Debian: apt-get install chromium)")
def test_cards_parameters_colours_seed_epochs_pages_and_keyboard_in_chromium(tmp_path):
    """Issue 53: no venue / paper / extra-data columns although a card existed; parameters as 1,234,567 (~320 px a
    cell); a model changed colour between charts; "seed —" with the seed recorded; API rows showed epochs "0";
    "show 10" hid the rest with no next page; headers could not be sorted from the keyboard."""
    protocol = card_protocol("digits", image_size=32)
    made = [record(f"m{i:02d}", "digits", [0.9 - i / 20, 0.8 - i / 20, 0.3, 0.2, 0.1], protocol=protocol)
            for i in range(12)]
    card = {"title": "Robust digits", "venue": "NeurIPS 2024", "additional_data": True, "url": "https://example.org/p"}
    made[3] = replace(made[3], train=TrainRun.of({"run_name": "m03"}, {
        "epochs": 30, "seed": 7, "card": card,
        "parameters": {"total": 368_234, "trainable": 368_234, "non_trainable": 0}}))
    made[5] = replace(made[5], model=replace(made[5].model, family="api"),
                      train=TrainRun.of({"run_name": "m05"}, {"epochs": 0, "seed": 0}))
    out = _pool_site(tmp_path, _entries(tmp_path, made))
    pages = _model_pages(out)
    with _chromium() as (browser, page):
        page.goto((out / "index.html").as_uri())
        table = page.locator("section#white_box table.leaderboard").first
        heads = [t.strip() for t in table.locator("thead th").all_inner_texts()]
        assert {"paper", "venue", "extra data"} <= set(heads)

        def cell(model: str, column: str):
            return table.locator("tbody tr", has=page.locator(f"td:nth-child(2) >> text='{model}'")).locator(
                f"td:nth-child({heads.index(column) + 1})")

        assert cell("m03", "paper").locator("a").get_attribute("href") == "https://example.org/p"
        assert cell("m03", "paper").inner_text() == "Robust digits"
        assert (cell("m03", "venue").inner_text(), cell("m03", "extra data").inner_text()) == ("NeurIPS 2024", "yes")
        assert cell("m04", "venue").inner_text() == "—"
        assert cell("m03", "parameters").inner_text() == "0.37 M"
        assert cell("m03", "parameters").bounding_box()["width"] < 120  # was ~320 px
        assert cell("m05", "epochs").inner_text() == "—" and cell("m03", "epochs").inner_text() == "30"

        # one colour per model: its bars on the index, its point on the scatter, its bars on its own page
        def fills(selector: str) -> dict[str, set[str]]:
            marks = page.locator(selector).evaluate_all(
                "els => els.map(e => [e.querySelector('title').textContent, e.getAttribute('fill')])")
            found: dict[str, set[str]] = {}
            for title, fill in marks:
                found.setdefault(title.split(":")[0].split(",")[0], set()).add(fill)
            return found

        bars = fills("section#white_box svg.plot rect[data-json]")
        points = fills("section#white_box svg.plot circle.point")
        assert len(bars) == 12 and all(len(f) == 1 for f in bars.values())
        assert len({next(iter(f)) for f in bars.values()}) == 12  # twelve models, twelve colours
        assert all(points[m] == bars[m] for m in points) and len(points) == 12
        assert page.locator("svg circle.point").first.evaluate("e => getComputedStyle(e).fill") != ""
        index_fills = bars
        for model in ("m03", "m05"):
            page.goto(pages[model].as_uri())
            assert fills("svg.plot rect[data-json]") == {model: index_fills[model]}, model
        page.goto(pages["m03"].as_uri())
        facts = dict(zip(page.locator("table.facts th").all_inner_texts(),
                         page.locator("table.facts td").all_inner_texts()))
        assert facts["seed"] == "7" and facts["parameters"] == "total 368,234, trainable 368,234, non_trainable 0"
        page.goto(pages["m05"].as_uri())
        facts = dict(zip(page.locator("table.facts th").all_inner_texts(),
                         page.locator("table.facts td").all_inner_texts()))
        assert facts["seed"] == "0" and facts["epochs"] == "—"

        # "show 10": a next page holds the other two, and a previous page comes back
        page.goto((out / "index.html").as_uri())
        page.select_option("#show", "10")
        visible = table.locator("tbody tr:visible td:nth-child(2)")
        assert visible.count() == 10
        pager = page.locator("section#white_box nav.pager").first
        assert pager.is_visible() and pager.locator(".previous").is_disabled()
        first_page = visible.all_inner_texts()
        pager.locator(".next").click()
        second = visible.all_inner_texts()
        assert len(second) == 2 and not set(second) & set(first_page)
        assert sorted(first_page + second) == [f"m{i:02d}" for i in range(12)]
        assert pager.locator(".next").is_disabled() and "page 2 of 2" in pager.inner_text()
        assert "page1=2" in page.url and "11-12 of 12" in page.locator(".shown-count").first.inner_text()
        fresh = browser.new_page()
        fresh.goto(page.url)  # the page is part of the shared view
        assert fresh.locator("section#white_box table.leaderboard").first.locator(
            "tbody tr:visible td:nth-child(2)").all_inner_texts() == second
        fresh.close()
        pager.locator(".previous").click()
        assert visible.all_inner_texts() == first_page

        # the keyboard: Tab reaches the headers; Enter and Space sort; aria-sort says how
        page.select_option("#show", "")
        head = table.locator("thead th", has_text="digits clean")
        assert head.get_attribute("tabindex") == "0" and head.get_attribute("aria-sort") == "none"
        page.locator("#search").focus()
        for _ in range(60):
            page.keyboard.press("Tab")
            if page.evaluate("document.activeElement.textContent.trim()") == "digits clean":
                break
        assert page.evaluate("document.activeElement.textContent.trim()") == "digits clean"
        column = heads.index("digits clean") + 1
        values = table.locator(f"tbody tr td:nth-child({column})")
        page.keyboard.press("Enter")
        assert head.get_attribute("aria-sort") == "descending"
        shown = [float(v) for v in values.evaluate_all("cs => cs.map(c => c.dataset.value)")]
        assert shown == sorted(shown, reverse=True)
        page.keyboard.press(" ")
        assert head.get_attribute("aria-sort") == "ascending"
        shown = [float(v) for v in values.evaluate_all("cs => cs.map(c => c.dataset.value)")]
        assert shown == sorted(shown)


@pytest.mark.parametrize("plot", ["../../../index.html", "/abs/plot.png", "sub/plot.png", ".."])
def test_a_plot_that_is_not_a_file_name_is_refused_when_the_record_is_read(tmp_path, plot):
    """A record's `plots` are files beside its scores.json, copied under their names into the model's folder:
    `../../../index.html` replaced the site's index.html, an absolute path was a SameFileError traceback."""
    from rgb.core.jsonrecord import RecordError
    from rgb.evaluation.records import ScoresRecord

    made = record("plotted", "digits", [0.6, 0.5, 0.4, 0.3, 0.2], protocol=card_protocol("digits", image_size=32))
    with raises_one_line(RecordError, "a plot is a file name beside scores.json"):
        ScoresRecord.from_json({**made.to_json(), "plots": [plot]})


def test_a_plot_named_like_a_copied_file_is_refused_not_written_over_it(tmp_path):
    """Every path copied into a model's folder is claimed once: a plot named `scores.json` would replace the
    record's own copy."""
    made = record("plotted", "digits", [0.6, 0.5, 0.4, 0.3, 0.2], protocol=card_protocol("digits", image_size=32))
    (entry,) = _entries(tmp_path, [replace(made, plots=["scores.json"])])
    with raises_one_line(NameClashError, "would both be written to digits/scores.json"):
        _pool_site(tmp_path, [entry])
