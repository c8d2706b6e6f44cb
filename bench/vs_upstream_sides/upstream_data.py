"""Upstream's side of the data comparisons: exact-duplicate keys (dupekit) and its token cache builder.

Runs in the upstream interpreter and imports only upstream's packages (and pyarrow, which dupekit
takes its batches in) and the standard library.

* ``exact-keys TEXTS --work equal``: the work of our key, done with dupekit's hash. Inside the timed
  region each text is normalised by the same definition as ours (NFKC, lower case, whitespace runs
  to one space, stripped; written here with the standard library), the normalised texts of a batch
  of 512 are handed to dupekit as an Arrow batch, and ``Transformation.Hash`` with
  ``HashAlgorithm.Blake2b`` (BLAKE2b with a 512-bit digest, as hex) keys them.
* ``exact-keys TEXTS --work own``: upstream's own exact-document key: ``Transformation.Hash`` with
  ``HashAlgorithm.Xxh3_128`` over the raw text, no normalisation, from Arrow batches built before
  the timed region. Not equal work: the comparison says so.
* ``tokenize DOCS TOKENIZER``: ``marin.processing.tokenize.tokenize`` end to end into a fresh folder.

Each prints one JSON line with the seconds of the timed region and what was done.
"""

import argparse
import json
import tempfile
import time
import unicodedata

BATCH = 512


def normalize(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).lower().split())


def exact_keys(texts_path: str, work: str) -> dict:
    import dupekit
    import pyarrow as pa

    with open(texts_path) as handle:
        texts = json.load(handle)
    chunks = [texts[i:i + BATCH] for i in range(0, len(texts), BATCH)]
    # The first Arrow batch pays a one-time start-up (about 0.3 s): outside the timed region, as our
    # side's first call is.
    dupekit.transform(pa.RecordBatch.from_pydict({"text": chunks[0][:1]}),
                      [dupekit.Transformation.Hash("text", "hash", dupekit.HashAlgorithm.Blake2b)])
    if work == "equal":
        steps = [dupekit.Transformation.Hash("text", "hash", dupekit.HashAlgorithm.Blake2b)]
        started = time.perf_counter()
        found = [dupekit.transform(pa.RecordBatch.from_pydict({"text": [normalize(t) for t in chunk]}), steps)
                 for chunk in chunks]
        seconds = time.perf_counter() - started
        described = ("the same normalisation (NFKC, lower case, whitespace runs to one space) in Python, then "
                     "dupekit Hash BLAKE2b-512 over Arrow batches of the normalised texts")
    else:
        steps = [dupekit.Transformation.Hash("text", "hash", dupekit.HashAlgorithm.Xxh3_128)]
        batches = [pa.RecordBatch.from_pydict({"text": chunk}) for chunk in chunks]
        started = time.perf_counter()
        found = [dupekit.transform(batch, steps) for batch in batches]
        seconds = time.perf_counter() - started
        described = "upstream's exact-document key: dupekit Hash xxh3-128 of the raw text (no normalisation)"
    keys = {key for batch in found for key in batch.column("hash").to_pylist()}
    return {"seconds": seconds, "documents": len(texts), "distinct_keys": len(keys), "work": described}


def tokenize(docs_path: str, tokenizer: str) -> dict:
    from marin.processing.tokenize.tokenize import TokenizeConfig
    from marin.processing.tokenize.tokenize import tokenize as build_cache

    with tempfile.TemporaryDirectory(prefix="upstream-tokenize-") as out:
        config = TokenizeConfig(train_paths=[docs_path], validation_paths=[], cache_path=out, tokenizer=tokenizer)
        started = time.perf_counter()
        build_cache(config)
        seconds = time.perf_counter() - started
        with open(f"{out}/train/.stats.json") as handle:
            stats = json.load(handle)
    return {"seconds": seconds, "documents": stats["total_elements"], "tokens": stats["total_tokens"],
            "work": "marin.processing.tokenize.tokenize: load tokenizer, read jsonl, encode, write token cache"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    keys = commands.add_parser("exact-keys")
    keys.add_argument("texts", help="a JSON list of texts")
    keys.add_argument("--work", choices=("equal", "own"), default="equal")
    tok = commands.add_parser("tokenize")
    tok.add_argument("docs", help="a jsonl file of {'text': ...}")
    tok.add_argument("tokenizer", help="a tokenizer folder")
    args = parser.parse_args()
    record = exact_keys(args.texts, args.work) if args.command == "exact-keys" else tokenize(args.docs, args.tokenizer)
    print(json.dumps(record))


if __name__ == "__main__":
    main()
