"""Language identification, fastText's lid.176 against py3langid, on text from this machine.

The evaluation set is built at run time, offline, from what the machine has (nothing large is kept
in the repository), into a temp folder (``--keep DIR`` keeps it as ``language_id_set.jsonl``):

* translated man pages, ``/usr/share/man/<lang>/man*/*.gz`` (``pt_BR`` counts as ``pt``, ``zh_CN``
  and ``zh_TW`` as ``zh``), rendered to text by the small roff stripper below (macros dropped,
  their text kept, escapes resolved). Each page is compared with its English original in
  ``/usr/share/man/man*/``: its *English share* is the fraction of its characters in paragraphs
  whose words are (at least 80% of them) words of the original, or else in lines that appear
  word for word in the original (options, examples, paragraphs left untranslated).
  A page with an English share under 0.35 is labelled with its folder's language, over 0.65 with
  ``en``; a page in between is **mixed** (either language counts as right). Pages without an
  English original are left out. Languages absent here are skipped with a message.
* English documents: Debian's ``README*`` files over 2 kB under ``/usr/share/doc`` and stories of
  ``shared/data/tinystories`` (``en``).
* short texts: the first 80 characters (cut at a space) of the first paragraph of at least 80
  characters that is not in the English original (as above), one per page, and of each English
  document.
* mixed texts of known proportions: a translated passage (lines not in the original) and an
  English story, concatenated at 80/20, 50/50 and 20/80 by characters. The expected label is the
  larger part's language; at 50/50 either counts as right.

Printed, for both models in the same run: accuracy by language on pages and on short texts;
accuracy on pages, short texts and mixed texts; the fraction of mixed texts (the 50/50 ones and
the mixed pages) given a score of at least 0.65 (the language step's default threshold), which a
threshold cannot then remove; documents/s over every text; and the peak memory of a process that
loads only that model (each model runs in a fresh process), beside one with the imports only. Usage:
``python bench/language_id.py [--max-pages 40] [--keep DIR]``; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing
import os
import random
import re
import resource
import sys
import tempfile
import time
import unicodedata
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from marin.curation.language import identify_language
from marin.curation.language_models import language_model

MODELS = ("py3langid", "fasttext-lid176")
MAN = Path("/usr/share/man")
DOC = Path("/usr/share/doc")
STORIES = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinystories" / "validation.jsonl"
LANGUAGES = ["cs", "da", "de", "es", "fi", "fr", "hr", "hu", "id", "it", "ja", "ko", "nl", "pl", "pt", "pt_BR",
             "ro", "ru", "sl", "sr", "sv", "tr", "uk", "zh_CN", "zh_TW"]
SHORT_CHARS = 80
MIXED_SHARES = (0.8, 0.5, 0.2)  # the translated part's share of a mixed text's characters
THRESHOLD = 0.65

# -- a small roff stripper: enough of man(7), mdoc(7) and tbl to read the words ---------------------

_GLYPHS = {"em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘", "cq": "’", "bu": "•",
           "co": "©", "rs": "\\", "ha": "^", "ti": "~", "hy": "-", "mi": "-", "pl": "+", "<=": "≤", ">=": "≥",
           "Fo": "«", "Fc": "»", "fo": "‹", "fc": "›", "tm": "™", "rg": "®", "de": "°", "mu": "×"}
_ESCAPE = re.compile(r"\\(?:f(?:\[[^\]]*\]|\(..|.)|s[+-]?\d+|\(..|\[[^\]]*\]|\*(?:\(..|\[[^\]]*\]|.)|[hvwkoz]'[^']*'|.)")
_PARAGRAPH = {"PP", "P", "LP", "SH", "SS", "TP", "IP", "TQ", "sp", "Pp", "Sh", "Ss", "It", "Bl", "El", "Bd", "Ed", "HP"}
_TEXT_MACROS = {"SH", "SS", "B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SM", "SB", "IP", "OP", "SY", "Nd", "Nm",
                "Sh", "Ss", "It", "Op", "Fl", "Ar", "Pa", "Dl", "Xr", "Em", "Sy", "Li", "Cm", "Dq", "Ql", "Pq", "Va",
                "Ev", "Fn", "Ft", "Ic", "Tn", "Dv", "Er", "Ad", "Aq", "Sq", "D1", "Bq", "Qq", "Ta", "Ns", "No"}
_MDOC_WORD = re.compile(r"(?<!\S)(?:[A-Z][a-z]|[A-Z][a-z][a-z]?)(?!\S)")


_ACCENTS = {"'": "\u0301", "`": "\u0300", ":": "\u0308", "^": "\u0302", "~": "\u0303", ",": "\u0327", "v": "\u030c", "o": "\u030a"}
_LETTERS = {"ss": "ß", "/o": "ø", "/O": "Ø", "ae": "æ", "AE": "Æ", "oe": "œ", "OE": "Œ", "/l": "ł", "/L": "Ł"}


def _glyph(name: str) -> str:
    """groff's two-character glyph names: punctuation, and accented letters such as ``'e`` (é)."""
    if name in _GLYPHS or name in _LETTERS:
        return _GLYPHS.get(name) or _LETTERS[name]
    if len(name) == 2 and name[0] in _ACCENTS and name[1].isalpha():
        return unicodedata.normalize("NFC", name[1] + _ACCENTS[name[0]])
    return ""


def _unescape(text: str) -> str:
    def replace(match: re.Match) -> str:
        escape = match.group(0)
        if escape.startswith("\\(") and len(escape) == 4:
            return _glyph(escape[2:])
        if escape.startswith("\\[") and escape.endswith("]"):
            name = escape[2:-1]
            if re.fullmatch(r"u[0-9A-Fa-f]{4,5}", name):
                return chr(int(name[1:], 16))
            return _glyph(name)
        return {"\\-": "-", "\\e": "\\", "\\ ": " ", "\\~": " ", "\\0": " ", "\\.": ".", "\\'": "'", "\\`": "`"}.get(escape, "")

    return _ESCAPE.sub(replace, text)


def _arguments(rest: str) -> str:
    return " ".join(part.strip('"') for part in re.findall(r'"[^"]*"|\S+', rest))


def roff_to_text(source: str) -> str:
    """Paragraphs (blank-line separated) of a man page's words; macros dropped, their text kept."""
    paragraphs: list[list[str]] = [[]]
    skipping_definition = in_table_format = False
    for raw in source.splitlines():
        # po4a wraps untranslated requests in a condition that always holds
        line = re.sub(r"^\.if\s+!'po4a'hide'\s+", "", re.split(r'\\"|\\#', raw, maxsplit=1)[0])
        if skipping_definition:
            skipping_definition = not line.startswith("..")
            continue
        if in_table_format:  # tbl's format lines run up to the one ending in '.'
            in_table_format = not line.rstrip().endswith(".")
            continue
        if line.startswith((".", "'")):
            match = re.match(r"[.'](\s*)(\S*)\s*(.*)", line)
            name, rest = (match.group(2), match.group(3)) if match else ("", "")
            if name in ("de", "de1", "am", "ig"):
                skipping_definition = True
            elif name == "TS":
                in_table_format = True
            elif name == "so":
                return ""  # a page that only points at another
            if name in _PARAGRAPH or not line.strip(".' "):
                paragraphs.append([])
            if name in _TEXT_MACROS and rest:
                text = _arguments(rest)
                if name[0].isupper() and name[1:].islower():  # mdoc: drop its callable macro names
                    text = _MDOC_WORD.sub("", text)
                paragraphs[-1].append(_unescape(text).replace("\t", " "))
            if name in ("SH", "SS", "Sh", "Ss"):
                paragraphs.append([])
            continue
        if not line.strip():
            paragraphs.append([])
            continue
        paragraphs[-1].append(_unescape(line).replace("\t", " "))
    cleaned = ["\n".join(" ".join(l.split()) for l in p if l.strip()) for p in paragraphs]
    return "\n\n".join(p for p in cleaned if p)


def _read_page(path: Path) -> str:
    with gzip.open(path, "rb") as handle:
        return roff_to_text(handle.read().decode("utf-8", errors="replace"))


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _words(text: str) -> list[str]:
    return re.findall(r"[^\W\d_]+", text.lower())


def english_share(page: str, english: str) -> tuple[float, set[str]]:
    """The fraction of ``page``'s characters also in its English original, and the original's units.

    A paragraph is in the original when at least 80% of its words are words of the original (a
    translation may come from an older version of the page, so an untranslated paragraph need
    not match word for word); otherwise its lines that are lines of the original count (an
    option's name above its translated description).
    """
    vocabulary = set(_words(english))
    lines = set(_lines(english))
    total = shared = 0
    for paragraph in page.split("\n\n"):
        words = _words(paragraph)
        chars = [len(line) for line in _lines(paragraph)]
        total += sum(chars)
        if words and sum(word in vocabulary for word in words) >= 0.8 * len(words):
            shared += sum(chars)
        else:
            shared += sum(len(line) for line in _lines(paragraph) if line in lines)
    return (shared / total if total else 0.0), vocabulary | lines


def _untranslated(paragraph: str, units: set[str]) -> bool:
    words = _words(paragraph)
    return any(line in units for line in _lines(paragraph)) or (bool(words) and sum(w in units for w in words) >= 0.8 * len(words))


# -- the evaluation set ------------------------------------------------------------------------------


def _cut(text: str, chars: int) -> str:
    text = " ".join(text.split())
    if len(text) <= chars:
        return text
    return text[: text.rfind(" ", 0, chars + 1) if " " in text[:chars + 1] else chars]


def man_page_items(language_dir: str, max_pages: int, rng: random.Random) -> list[dict]:
    """Pages, short texts and translated passages of one folder of translated man pages."""
    language = language_dir.split("_")[0]
    seen, items = set(), []
    paths = sorted(p for p in (MAN / language_dir).glob("man*/*.gz") if p.is_file())
    rng.shuffle(paths)
    for path in paths:
        real = path.resolve()
        original = MAN / path.parent.name / path.name
        if real in seen or not original.exists():
            continue
        seen.add(real)
        page, english = _read_page(real), _read_page(original.resolve())
        if len(page) < 200 or not english:
            continue
        share, english_units = english_share(page, english)
        label = language if share < 0.35 else "en" if share > 0.65 else "mixed"
        source = f"man/{language_dir}/{path.parent.name}/{path.name}"
        items.append({"kind": "page", "language": language, "expected": [language, "en"] if label == "mixed" else [label],
                      "mixed": label == "mixed", "english_share": round(share, 3), "source": source, "text": page})
        translated = [p for p in page.split("\n\n") if not _untranslated(p, english_units)]
        prose = [p for p in translated if len(p) >= SHORT_CHARS]
        if prose and label == language:
            items.append({"kind": "short", "language": language, "expected": [language], "mixed": False, "source": source, "text": _cut(prose[0], SHORT_CHARS)})
        if label == language:
            items.append({"kind": "passage", "language": language, "source": source, "text": " ".join(" ".join(translated).split())})
        if sum(item["kind"] == "page" for item in items) >= max_pages:
            break
    return items


def english_items(max_docs: int) -> list[dict]:
    """Debian READMEs and TinyStories stories, each as a document and a short text (``en``)."""
    items = []
    readmes = sorted(p for p in DOC.glob("*/README*") if p.is_file() and not p.name.endswith(".gz") and p.stat().st_size > 2048)
    for path in readmes[:max_docs]:
        text = path.read_text(encoding="utf-8", errors="replace")
        items.append({"kind": "page", "language": "en", "expected": ["en"], "mixed": False, "source": f"doc/{path.parent.name}/{path.name}", "text": text})
    if STORIES.exists():
        with STORIES.open(encoding="utf-8") as handle:
            for number, line in zip(range(max_docs), handle):
                items.append({"kind": "page", "language": "en", "expected": ["en"], "mixed": False, "source": f"tinystories/{number}", "text": json.loads(line)["text"]})
    else:
        print(f"skipped: {STORIES} is absent (no TinyStories stories)", file=sys.stderr)
    for item in list(items):
        items.append({**item, "kind": "short", "mixed": False, "text": _cut(item["text"], SHORT_CHARS)})
    return items


def mixed_items(passages: list[dict], stories: list[str], rng: random.Random, chars: int = 600) -> list[dict]:
    """A translated passage and an English story, concatenated at each of MIXED_SHARES."""
    items = []
    for passage in passages:
        if len(passage["text"]) < chars or not stories:
            continue
        story = " ".join(rng.choice(stories).split())
        while len(story) < chars:
            story += " " + " ".join(rng.choice(stories).split())
        for share in MIXED_SHARES:
            ours, theirs = _cut(passage["text"], round(chars * share)), _cut(story, round(chars * (1 - share)))
            expected = [passage["language"]] if share > 0.5 else ["en"] if share < 0.5 else [passage["language"], "en"]
            items.append({"kind": f"mixed-{round(share * 100)}", "language": passage["language"], "expected": expected,
                          "mixed": share == 0.5, "source": passage["source"], "text": f"{ours}\n\n{theirs}"})
    return items


def build_set(max_pages: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    items: list[dict] = []
    for language_dir in LANGUAGES:
        if not (MAN / language_dir).is_dir():
            print(f"skipped: no translated man pages for {language_dir} ({MAN / language_dir} is absent)", file=sys.stderr)
            continue
        items += man_page_items(language_dir, max_pages, rng)
    english = english_items(max_pages * 2)
    stories = [i["text"] for i in english if i["kind"] == "page" and i["source"].startswith("tinystories/")]
    passages = [i for i in items if i["kind"] == "passage"]
    return [i for i in items if i["kind"] != "passage"] + english + mixed_items(passages, stories, rng)


# -- measuring ---------------------------------------------------------------------------------------


def score(items: list[dict], model: str) -> tuple[list[tuple[str, float]], float, float]:
    """Predictions, seconds and the peak resident MiB of a fresh process that loads only ``model``."""
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_score_here, items, model).result()


def _score_here(items: list[dict], model: str | None) -> tuple[list[tuple[str, float]], float, float]:
    predictions, seconds = [], 0.0
    if model is not None:  # None: the process with the imports only, what the models' figures start from
        identify_language("warm-up: load the model before the clock starts", model)
        start = time.perf_counter()
        predictions = [identify_language(item["text"], model) for item in items]
        seconds = time.perf_counter() - start
    return predictions, seconds, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def accuracy(rows: list[tuple[dict, tuple[str, float]]]) -> str:
    if not rows:
        return "-"
    return f"{sum(pred in item['expected'] for item, (pred, _) in rows) / len(rows):.3f}"


def confident(rows: list[tuple[dict, tuple[str, float]]]) -> str:
    if not rows:
        return "-"
    return f"{sum(conf >= THRESHOLD for _, (_, conf) in rows) / len(rows):.3f}"


def report(items: list[dict], results: dict[str, tuple[list, float]]) -> dict:
    def rows(model, keep):
        return [(item, pred) for item, pred in zip(items, results[model][0]) if keep(item)]

    # by the expected language: a translated page that is mostly English counts under en
    languages = sorted({i["expected"][0] for i in items if not i["mixed"]})
    header = f"{'language':<9}{'pages':>6}" + "".join(f"{'page ' + m[:8]:>15}" for m in MODELS) + f"{'short':>7}" + "".join(f"{'short ' + m[:8]:>16}" for m in MODELS)
    print(header)
    for language in languages:
        def pages(i):
            return i["kind"] == "page" and i["expected"] == [language]

        def shorts(i):
            return i["kind"] == "short" and i["expected"] == [language]

        count_pages = sum(map(pages, items))
        count_short = sum(map(shorts, items))
        print(f"{language:<9}{count_pages:>6}" + "".join(f"{accuracy(rows(m, pages)):>15}" for m in MODELS)
              + f"{count_short:>7}" + "".join(f"{accuracy(rows(m, shorts)):>16}" for m in MODELS))
    measures = {
        "pages (not mixed)": (lambda i: i["kind"] == "page" and not i["mixed"], accuracy),
        "  English documents": (lambda i: i["kind"] == "page" and not i["source"].startswith("man/"), accuracy),
        "  man pages mostly translated": (lambda i: i["kind"] == "page" and i["source"].startswith("man/") and i["expected"] == [i["language"]], accuracy),
        "  man pages mostly English": (lambda i: i["kind"] == "page" and i["source"].startswith("man/") and i["expected"] == ["en"], accuracy),
        "short texts": (lambda i: i["kind"] == "short", accuracy),
        "mixed 80/20 and 20/80": (lambda i: i["kind"] in ("mixed-80", "mixed-20"), accuracy),
        "mixed 50/50": (lambda i: i["kind"] == "mixed-50", accuracy),
        "mixed pages": (lambda i: i["kind"] == "page" and i["mixed"], accuracy),
        f"mixed 50/50 scored >= {THRESHOLD}": (lambda i: i["kind"] == "mixed-50", confident),
        f"mixed pages scored >= {THRESHOLD}": (lambda i: i["kind"] == "page" and i["mixed"], confident),
    }
    figures: dict = {"documents": len(items), "megabytes": round(sum(len(i["text"].encode()) for i in items) / 1e6, 2)}
    print(f"\n{'measure':<32}{'count':>7}" + "".join(f"{m:>18}" for m in MODELS))
    for label, (keep, measure) in measures.items():
        count = sum(map(keep, items))
        values = [measure(rows(m, keep)) for m in MODELS]
        figures[label.strip()] = {"count": count, **dict(zip(MODELS, values))}
        print(f"{label:<32}{count:>7}" + "".join(f"{v:>18}" for v in values))
    speeds = [len(items) / results[m][1] for m in MODELS]
    figures["documents/s"] = dict(zip(MODELS, [round(s, 1) for s in speeds]))
    print(f"{'documents/s (all texts)':<32}{len(items):>7}" + "".join(f"{s:>18.1f}" for s in speeds))
    peaks = [results[m][2] for m in MODELS]
    figures["peak_rss_mib"] = dict(zip(MODELS, [round(p, 1) for p in peaks]))
    print(f"{'peak memory, MiB (process)':<32}{'':>7}" + "".join(f"{p:>18.1f}" for p in peaks))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-pages", type=int, default=40, help="translated pages per language folder (English: twice that)")
    parser.add_argument("--keep", type=Path, help="a folder to keep the evaluation set in (language_id_set.jsonl)")
    args = parser.parse_args()
    items = build_set(args.max_pages)
    with tempfile.TemporaryDirectory() as scratch:
        folder = args.keep or Path(scratch)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "language_id_set.jsonl", "w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(item, ensure_ascii=False) + "\n" for item in items)
        print(f"evaluation set: {len(items)} texts in {folder / 'language_id_set.jsonl'}", file=sys.stderr)
    results = {model: score(items, model) for model in MODELS}
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        bare_mib = pool.submit(_score_here, [], None).result()[2]
    identities = {m: language_model(m).identity().sha256[:12] for m in MODELS}
    print("models: " + ", ".join(f"{m} (sha256 {h}...)" for m, h in identities.items()) + f"; {os.cpu_count()} CPUs\n")
    figures = report(items, results)
    figures["peak_rss_mib"]["imports_only"] = round(bare_mib, 1)
    print(f"(a process with the imports only, no model loaded: {bare_mib:.1f} MiB)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
