"""The curation tutorial (experiments/tutorials/curate_tiny_corpus.py): its chain removes exactly what
the raw corpus plants, the tokenize step reads only what was kept, a rerun is cached, and changing
one threshold invalidates only that step and what depends on it. Training is left out here (the
graph's last step); docs/data-curation.md quotes a full run."""

from experiments.tiny_corpus import PLANTED, STORIES, documents, pages


def test_the_raw_corpus_is_deterministic_and_plants_what_it_says():
    docs = documents()
    assert docs == documents() and len(pages()) == PLANTED["pages"]
    kinds = {}
    for doc in docs:
        kind = doc["id"].split("-")[0]
        kinds[kind] = kinds.get(kind, 0) + 1
    assert kinds == {"story": STORIES, "copy": PLANTED["exact_copies"], "near": PLANTED["near_copies"],
                     "lang": PLANTED["other_language"], "spam": PLANTED["spam"], "leak": PLANTED["leaks"]}


def test_the_chain_removes_exactly_the_planted_documents_and_rechecks_only_what_changed(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf"))
    from marin.curation.dedup_steps import FuzzyDedupConfig, fuzzy_deduplicated
    from marin.execution.artifact import load_artifact
    from marin.execution.step_runner import StepRunner

    from experiments.tutorials import curate_tiny_corpus as tutorial

    runner = StepRunner(prefix=str(tmp_path / "prefix"))
    report = runner.run([tutorial.curated_tokenized, tutorial.pages_tokenized])
    assert not report.failed

    def summary(handle):
        return load_artifact(runner.output_path_for(handle)).result["summary"]

    removed = lambda handle: {k: v["documents"] for k, v in summary(handle)["removed"].items()}  # noqa: E731
    assert sum(removed(tutorial.english).values()) == PLANTED["other_language"]
    assert removed(tutorial.quality) == {"c4_too_few_sentences": PLANTED["spam"]}
    assert removed(tutorial.clean) == {"decontaminate": PLANTED["leaks"]}
    assert removed(tutorial.unique) == {"exact-duplicate": PLANTED["exact_copies"]}
    assert removed(tutorial.distinct) == {"near-duplicate": PLANTED["near_copies"]}
    tokens = load_artifact(runner.output_path_for(tutorial.curated_tokenized)).result
    assert tokens["splits"]["train"]["documents"] == STORIES  # the removed duplicates are not tokenized

    # The table the tutorial prints at the end: the counts docs/data-curation.md quotes.
    from marin.curation.counts import curation_table

    table = curation_table(runner, [tutorial.english, tutorial.quality, tutorial.scored, tutorial.clean,
                                    tutorial.unique, tutorial.distinct]).splitlines()
    assert [line.split()[:4] for line in table[1:]] == [
        ["curated/english", "461", "->", "455"], ["curated/quality", "455", "->", "445"],
        ["curated/scored", "445", "->", "445"], ["curated/decontaminated", "445", "->", "440"],
        ["curated/exact-dedup", "440", "->", "420"], ["curated/fuzzy-dedup", "420", "->", "400"]]

    assert runner.run([tutorial.curated_tokenized, tutorial.pages_tokenized]).ran == []  # fully cached
    # A stricter near-duplicate threshold: only that step and the tokenize step after it are to run.
    stricter = fuzzy_deduplicated("curated/fuzzy-dedup", tutorial.unique, config=FuzzyDedupConfig(threshold=0.9))
    from marin.experiment.data import tokenized

    retokenized = tokenized(name="tokenized/curated-stories", source=stricter, tokenizer=tutorial.marin_tokenizer)
    to_run = [p.spec.name for p in runner.plan([retokenized]) if not p.cached]
    assert to_run == ["curated/fuzzy-dedup", "tokenized/curated-stories"]
