"""The table of what each curation step kept and removed, and how a training summary names a
dataset made from a step's output (in words, not as the raw identity dict)."""

from marin.curation.counts import curation_table, removal_line
from marin.execution.artifact import save_artifact
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.train import _describe


def test_a_removal_line_shows_documents_in_and_out_and_each_reason():
    summary = {"documents_in": 1461, "documents_out": 1455, "marked": {},
               "removed": {"language_not_wanted:de": {"documents": 2, "bytes": 10},
                           "language_not_wanted:fr": {"documents": 4, "bytes": 20}}}
    assert removal_line("curated/english", summary, width=16) == (
        "curated/english   1,461 -> 1,455  language_not_wanted:de 2, language_not_wanted:fr 4")
    assert removal_line("x", {"documents_in": 3, "documents_out": 3, "removed": {}, "marked": {}}).endswith(
        "3 -> 3  nothing removed")


def test_the_table_reads_each_steps_result_and_says_which_have_not_run(tmp_path):
    runner = StepRunner(prefix=str(tmp_path))
    done = lazy_step("curated/done", lambda ctx: None, hash_attrs={"a": 1})
    pending = lazy_step("curated/pending", lambda ctx: None, hash_attrs={"a": 2})
    summary = {"documents_in": 10, "documents_out": 7, "removed": {"spam": {"documents": 3, "bytes": 9}}, "marked": {}}
    save_artifact(runner.output_path_for(done), {"summary": summary})
    lines = curation_table(runner, [done, pending]).splitlines()
    assert lines[1].split() == ["curated/done", "10", "->", "7", "spam", "3"]
    assert lines[2].split() == ["curated/pending", "not", "run"]


def test_a_dataset_tokenized_from_a_step_is_described_by_that_steps_name():
    source = lazy_step("curated/fuzzy-dedup", lambda ctx: None)
    tokenizer = lazy_step("tokenizers/builtin-bpe", lambda ctx: None)
    tokenized = lazy_step("tokenized/stories", lambda ctx: None, deps=[source, tokenizer])
    assert _describe({"kind": "step"}, tokenized) == "the output of step curated/fuzzy-dedup"
    assert _describe({"kind": "custom", "id": 3}, tokenized) == "kind custom, id 3"  # never a raw dict
