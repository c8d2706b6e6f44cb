"""Our side of the data comparisons: exact-duplicate keys and tokenizing into a token cache.

* ``exact-keys TEXTS``: the exact dedup pass's key function
  (:class:`marin.curation.dedup.passes.ContentKeys`: ``normalize_text``, then the 128-bit BLAKE2b
  digest of its UTF-8 bytes) over batches of 512 documents already in memory. ``--work`` is accepted
  for symmetry with upstream's side: our own key already is the equal-work one.
* ``tokenize DOCS TOKENIZER``: :func:`marin.processing.tokenize.run_tokenize` end to end into a
  fresh folder (loading the tokenizer, reading the jsonl, encoding, writing the cache and ledger).

Each prints one JSON line with the seconds of the timed region and what was done.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np

from marin.curation.dedup.passes import ContentKeys
from marin.curation.dedup.records import Doc
from marin.processing.tokenize import TokenizeConfig, TokenizeInputs, run_tokenize

BATCH = 512


def exact_keys(texts_path: str) -> dict:
    with open(texts_path) as handle:
        texts = json.load(handle)
    batches = [[Doc(0, i + k, str(i + k), text, {}) for k, text in enumerate(texts[i:i + BATCH])]
               for i in range(0, len(texts), BATCH)]
    keys = ContentKeys().open()
    keys(batches[0][:1])  # a warm-up call, as upstream's side makes one
    started = time.perf_counter()
    found = [keys(batch) for batch in batches]
    seconds = time.perf_counter() - started
    pairs = np.concatenate([np.stack([k.key, k.key2], axis=1) for k in found])
    return {"seconds": seconds, "documents": len(texts), "distinct_keys": len(np.unique(pairs, axis=0)),
            "work": "normalize_text (NFKC, lower case, whitespace runs to one space) then BLAKE2b-128 (hashlib), "
                    "per document, in Python"}


def tokenize(docs_path: str, tokenizer: str) -> dict:
    config = TokenizeConfig(source={"kind": "bench"}, tokenizer=None, splits=("train",))
    inputs = TokenizeInputs(split_files={"train": [docs_path]}, tokenizer=tokenizer)
    with tempfile.TemporaryDirectory(prefix="ours-tokenize-") as out:
        started = time.perf_counter()
        result = run_tokenize(config, inputs, out)
        seconds = time.perf_counter() - started
    split = result.splits["train"]
    return {"seconds": seconds, "documents": split.documents, "tokens": split.tokens,
            "work": "run_tokenize: load tokenizer, read jsonl, encode (EOS appended), write token cache"}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("exact-keys")
    keys.add_argument("texts", help="a JSON list of texts")
    # Our own key is the equal-work key (normalise, then BLAKE2b): both choices time the same work.
    keys.add_argument("--work", choices=("equal", "own"), default="equal", help="accepted for the driver; the same on this side")
    tok = commands.add_parser("tokenize")
    tok.add_argument("docs", help="a jsonl file of {'text': ...}")
    tok.add_argument("tokenizer", help="a tokenizer folder or tokenizer.json")
    args = parser.parse_args(argv)
    record = exact_keys(args.texts) if args.command == "exact-keys" else tokenize(args.docs, args.tokenizer)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
