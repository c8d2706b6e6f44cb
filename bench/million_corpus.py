"""A large raw corpus for the curation benchmark, built offline, seeded and deterministic.

Most documents are generated stories (``storygen``: story ``i`` of a seed is the same text in
every process, so shards are built in parallel); the rest is real text found on the machine, cut
into documents: the shared TinyStories sample, man pages (``/usr/share/man``, in English and some
thirty other languages, troff markup stripped) and package documentation (``/usr/share/doc``:
READMEs, changelogs, copyright files). Real text brings what generated text lacks: other
languages, markup-heavy pages the quality rules remove, and the duplicates a real machine holds.

Planted on top, with their originals recorded in ``planted.json`` so recall can be measured:

* exact copies: a document repeated word for word (whitespace and case changed, as a scraped copy
  would be; the exact step's normalisation must see through it);
* near copies: a document with 1 to 3% of its words replaced (Jaccard of word 5-grams about 0.85
  to 0.95);
* leaks: a story with an evaluation item (a sentence of the TinyStories validation sample, which
  is not used as training text) appended; the evaluation items are written to ``eval.jsonl``.

Shards alternate ``.jsonl.gz`` and ``.jsonl.zst`` (the curation steps read both), documents in a
seeded shuffled order within each shard, each ``{"id", "text"}``.
"""

from __future__ import annotations

import gzip
import json
import math
import multiprocessing
import os
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zstandard
from storygen import story

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "tinystories"
MAN = Path("/usr/share/man")
DOC = Path("/usr/share/doc")
DOCUMENTS_PER_SHARD = 31_250  # 32 shards at a million documents
REAL_TEXT_SHARE = 0.15  # at most this share of the corpus is real text
EXACT_SHARE, NEAR_SHARE, LEAKS_PER_MILLION = 0.01, 0.01, 100
_CHUNK_CHARS = (400, 3000)  # real text is cut into documents of about this many characters
_REPLACEMENTS = ("pebble", "lantern", "meadow", "whistle", "pudding", "button", "comet", "violet")


@dataclass(frozen=True)
class CorpusLayout:
    """Where the corpus is and what it holds (``planted.json`` lists the planted pairs)."""

    folder: Path
    shards: list[str]
    eval_file: str
    documents: int
    planted: dict

    @property
    def description(self) -> str:
        counts = self.planted["counts"]
        return (f"{self.documents:,} documents in {len(self.shards)} shards: {counts['stories']:,} stories, "
                f"{counts['real']:,} real-text documents, {counts['exact']:,} exact and {counts['near']:,} "
                f"near copies planted, {counts['leaks']} evaluation leaks")


# -- real text on this machine -------------------------------------------------------------------------

_TROFF_FONT = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)")
_TROFF_ESCAPE = re.compile(r"\\(?:\(..|\[[^\]]*\]|[*$]\(?..|.)")


def _man_text(raw: str) -> str:
    """A man page's troff source as plain paragraphs: macro lines become breaks, escapes go."""
    lines = []
    for line in raw.splitlines():
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].partition(" ")
            if macro in ("SH", "SS", "PP", "P", "LP", "TP", "IP", "sp", "br"):
                lines.append("")
            if macro in ("SH", "SS", "B", "I", "BR", "IR", "RB", "BI", "IB", "RI") and rest:
                lines.append(rest.replace('"', ""))
            continue
        line = _TROFF_FONT.sub("", line).replace("\\-", "-").replace("\\e", "\\")
        lines.append(_TROFF_ESCAPE.sub("", line))
    return "\n".join(lines)


def _paragraph_chunks(text: str) -> Iterator[str]:
    """Consecutive paragraphs joined into documents of about :data:`_CHUNK_CHARS` characters."""
    low, high = _CHUNK_CHARS
    chunk: list[str] = []
    size = 0
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        chunk.append(paragraph)
        size += len(paragraph)
        if size >= low:
            yield "\n\n".join(chunk)[: high * 2]
            chunk, size = [], 0
    if chunk and size >= low // 2:
        yield "\n\n".join(chunk)


def _read_maybe_gzip(path: Path) -> str | None:
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
        if b"\0" in data[:4096]:
            return None  # binary
        return data.decode("utf-8")
    except (OSError, EOFError, UnicodeDecodeError, gzip.BadGzipFile):
        return None


def real_text_chunks() -> list[str]:
    """Every real-text document this machine offers, in a fixed order (sorted paths)."""
    chunks: list[str] = []
    train = SHARED / "train.jsonl"
    if train.exists():
        chunks += [json.loads(line)["text"] for line in train.read_text().splitlines() if line.strip()]
    if MAN.exists():
        for path in sorted(p for p in MAN.rglob("*") if p.is_file() and not p.is_symlink()):
            raw = _read_maybe_gzip(path)
            if raw and not raw.startswith(".so "):
                chunks += _paragraph_chunks(_man_text(raw))
    if DOC.exists():
        for path in sorted(p for p in DOC.rglob("*") if p.is_file() and not p.is_symlink()):
            name = path.name.lower()
            if name.startswith(("readme", "changelog", "copyright", "news", "authors")) or path.suffix in (".txt", ".md", ".rst"):
                text = _read_maybe_gzip(path)
                if text:
                    chunks += _paragraph_chunks(text)
    return chunks


def evaluation_items() -> list[str]:
    """Sentences of at least 13 words from the TinyStories validation sample (never training text here)."""
    items = []
    validation = SHARED / "validation.jsonl"
    for line in validation.read_text().splitlines() if validation.exists() else ():
        for sentence in re.split(r"(?<=[.!?])\s+", json.loads(line)["text"]):
            if len(sentence.split()) >= 13:
                items.append(sentence.strip())
    return items[:100] or [f"the little robot counted {n} shiny stones beside the quiet river before the sun went down" for n in range(100)]


# -- planting -----------------------------------------------------------------------------------------


def near_copy(text: str, rng: random.Random) -> str:
    words = text.split()
    share = rng.uniform(0.01, 0.03)
    for index in rng.sample(range(len(words)), max(1, round(len(words) * share))):
        words[index] = rng.choice(_REPLACEMENTS)
    return " ".join(words)


def exact_copy(text: str, rng: random.Random) -> str:
    """The same text, or the same up to whitespace, which the exact step normalises away.

    (Not up to case: an upper-cased page is a different input for the language and quality steps
    before dedup, and would often not reach it.)
    """
    return text if rng.random() < 0.5 else "  " + text.replace(" ", "  ", 3) + "\n"


@dataclass(frozen=True)
class ShardPlan:
    """What one shard holds: stories ``story_range`` of the seed, real text, and planted documents."""

    index: int
    path: str
    seed: int
    story_range: tuple[int, int]
    real: list[tuple[str, str]]  # (id, text)
    planted: list[tuple[str, str, str, int]]  # (id, kind, original id, rng seed)
    leaks: list[tuple[str, int, str]]  # (id, story index, evaluation item)
    originals: dict[str, str]  # original id -> text, for planted copies of real text


def story_id(index: int) -> str:
    return f"s{index:08d}"


def build_shard(plan: ShardPlan) -> int:
    docs = [(story_id(i), story(i, seed=plan.seed).text) for i in range(*plan.story_range)]
    docs += plan.real
    for doc_id, kind, original, seed in plan.planted:
        rng = random.Random(seed)
        text = plan.originals.get(original) or story(int(original[1:]), seed=plan.seed).text
        docs.append((doc_id, exact_copy(text, rng) if kind == "exact" else near_copy(text, rng)))
    for doc_id, index, item in plan.leaks:
        docs.append((doc_id, story(index, seed=plan.seed + 1).text + " " + item))
    random.Random(f"shard-order:{plan.seed}:{plan.index}").shuffle(docs)
    payload = "".join(json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n" for doc_id, text in docs).encode()
    data = gzip.compress(payload, compresslevel=3, mtime=0) if plan.path.endswith(".gz") else zstandard.ZstdCompressor(level=3).compress(payload)
    tmp = plan.path + ".tmp"
    Path(tmp).write_bytes(data)
    os.replace(tmp, plan.path)
    return len(docs)


def build_corpus(folder: Path, documents: int, seed: int = 0, workers: int = 2) -> CorpusLayout:
    """Write ``documents`` documents under ``folder`` (reused when ``planted.json`` says the same size and seed)."""
    manifest = folder / "planted.json"
    if manifest.exists():
        planted = json.loads(manifest.read_text())
        if planted["documents"] == documents and planted["seed"] == seed:
            return CorpusLayout(folder, planted["shards"], str(folder / "eval.jsonl"), documents, planted)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"million-corpus:{seed}")
    exact, near = round(documents * EXACT_SHARE), round(documents * NEAR_SHARE)
    leaks = max(1, documents * LEAKS_PER_MILLION // 1_000_000)
    real_all = real_text_chunks()
    real_count = min(len(real_all), int(documents * REAL_TEXT_SHARE))
    real = [(f"r{i:08d}", real_all[j]) for i, j in enumerate(sorted(rng.sample(range(len(real_all)), real_count)))]
    stories = documents - exact - near - leaks - real_count
    items = evaluation_items()
    (folder / "eval.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in items))

    num_shards = max(2, math.ceil(documents / DOCUMENTS_PER_SHARD))
    real_by_id = dict(real)
    # Each planted copy goes into a random shard; its original is any story or real-text document.
    planted_pairs = []
    for n in range(exact + near):
        kind = "exact" if n < exact else "near"
        original = story_id(rng.randrange(stories)) if rng.random() >= REAL_TEXT_SHARE or not real else rng.choice(real)[0]
        # Copies' ids sort after every original's ("x"/"y" after "r"/"s"): each cluster keeps the
        # smallest id, so the copy is the one removed, as with a page crawled again later.
        prefix = "x" if kind == "exact" else "y"
        planted_pairs.append((f"{prefix}{n:08d}", kind, original, rng.randrange(1 << 62), rng.randrange(num_shards)))
    leak_docs = [(f"l{n:08d}", rng.randrange(1 << 30), items[n % len(items)], rng.randrange(num_shards)) for n in range(leaks)]

    plans = []
    bounds = [round(stories * k / num_shards) for k in range(num_shards + 1)]
    for k in range(num_shards):
        ext = ".jsonl.gz" if k % 2 == 0 else ".jsonl.zst"
        mine = [p[:4] for p in planted_pairs if p[4] == k]
        plans.append(ShardPlan(
            k, str(folder / f"part-{k:05d}{ext}"), seed, (bounds[k], bounds[k + 1]), real[k::num_shards],
            mine, [leak[:3] for leak in leak_docs if leak[3] == k],
            {orig: real_by_id[orig] for _, _, orig, _ in mine if orig in real_by_id}))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        written = sum(pool.map(build_shard, plans, chunksize=1))
    assert written == documents, (written, documents)
    planted = {
        "documents": documents, "seed": seed, "shards": [p.path for p in plans],
        "counts": {"stories": stories, "real": real_count, "exact": exact, "near": near, "leaks": leaks},
        "pairs": [{"copy": c, "kind": k, "original": o} for c, k, o, _, _ in planted_pairs],
        "leaks": [doc_id for doc_id, *_ in leak_docs],
    }
    manifest.write_text(json.dumps(planted))
    return CorpusLayout(folder, planted["shards"], str(folder / "eval.jsonl"), documents, planted)
