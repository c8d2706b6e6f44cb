"""From a raw, messy corpus to a trained model, as one graph of cached steps.

The raw corpus (experiments/tiny_corpus.py: web pages, stories with exact and near copies, other
languages, spam, leaked evaluation items) is written by steps of its own, offline. The chain keeps
English, applies the Gopher and C4 quality rules, scores with a classifier trained on clean stories
against spam, removes documents that contain the evaluation items, drops exact then near
duplicates, tokenizes the result (and the text extracted from the web pages) and trains the
tutorial's nano model on both. Rerunning is fully cached; changing one threshold reruns only that
step and what depends on it.

    source .venv/bin/activate   # once per shell, from the repository root
    marin run experiments/tutorials/curate_tiny_corpus.py
    marin run experiments/tutorials/curate_tiny_corpus.py --set curate.fuzzy.threshold=0.9

The thresholds (``curate``) and the training settings (``train``) are read with ``script_config``,
so ``marin run --set NAME.KEY=VALUE`` changes them; the defaults are the tutorial's. At the end the
script prints what each curation step kept and removed.
"""

from dataclasses import dataclass, field

from levanter.optim import AdamConfig
from marin.curation.classifier import classifier_filtered, quality_classifier
from marin.curation.counts import curation_table
from marin.curation.decontaminate import decontaminated
from marin.curation.dedup_steps import FuzzyDedupConfig, exact_deduplicated, fuzzy_deduplicated
from marin.curation.extract import extracted
from marin.curation.language import language_filtered
from marin.curation.quality import quality_filtered
from marin.execution.lazy import lazy_step
from marin.execution.step_runner import StepRunner
from marin.experiment.config import script_config
from marin.experiment.data import tokenized
from marin.experiment.train import train_lm
from rigging import filesystem as fsx
from storygen import generate_stories

from experiments.llama import llama_nano
from experiments.marin_tokenizer import marin_tokenizer
from experiments.tiny_corpus import EVAL_ITEMS, as_jsonl, documents, pages


@dataclass(frozen=True)
class CurateSettings:
    language_threshold: float = 0.65
    classifier_threshold: float = 0.5
    fuzzy: FuzzyDedupConfig = field(default_factory=FuzzyDedupConfig)


@dataclass(frozen=True)
class TrainSettings:
    optimizer: AdamConfig = field(default_factory=lambda: AdamConfig(learning_rate=3e-3, weight_decay=0.1))
    batch_size: int = 8
    seq_len: int = 256
    num_train_steps: int = 60


curate = script_config(CurateSettings, "curate")
train = script_config(TrainSettings, "train")


def write_documents(ctx) -> dict:
    url = fsx.join(ctx.output_path, "documents.jsonl")
    fsx.atomic_write(url, as_jsonl(documents()))
    return {"files": [url]}


def write_pages(ctx) -> dict:
    urls = []
    for name, html in pages():
        urls.append(fsx.join(ctx.output_path, name))
        fsx.atomic_write(urls[-1], html)
    return {"files": urls}


def write_eval_items(ctx) -> dict:
    url = fsx.join(ctx.output_path, "eval.jsonl")
    fsx.atomic_write(url, as_jsonl([{"text": item} for item in EVAL_ITEMS]))
    return {"files": [url]}


def write_examples(ctx) -> dict:
    """Examples for the quality classifier: clean stories, and spam."""
    good, spam = fsx.join(ctx.output_path, "good.jsonl"), fsx.join(ctx.output_path, "spam.jsonl")
    fsx.atomic_write(good, as_jsonl([{"text": t} for t in generate_stories(200, seed=99)]))
    fsx.atomic_write(spam, as_jsonl([{"text": f"win cash now {i} click here buy cheap deal offer today only"}
                                     for i in range(200)]))
    return {"files": [good], "spam": [spam]}


raw_documents = lazy_step("raw/documents", write_documents, hash_attrs={"corpus": "tiny-corpus/1"})
raw_pages = lazy_step("raw/pages", write_pages, hash_attrs={"corpus": "tiny-corpus/1"})
eval_items = lazy_step("raw/eval-items", write_eval_items, hash_attrs={"corpus": "tiny-corpus/1"})
good_examples = lazy_step("raw/good-examples", write_examples, hash_attrs={"examples": "stories-vs-spam/1"})
spam_examples = lazy_step("raw/spam-examples", lambda ctx: {"files": ctx.load_artifact(good_examples).result["spam"]},
                          deps=[good_examples], hash_attrs={"examples": "stories-vs-spam/1"})

english = language_filtered("curated/english", raw_documents, languages=("en",), threshold=curate.language_threshold)
quality = quality_filtered("curated/quality", english)
spam_scorer = quality_classifier("classifiers/spam", good_examples, spam_examples)
scored = classifier_filtered("curated/scored", quality, spam_scorer, threshold=curate.classifier_threshold)
clean = decontaminated("curated/decontaminated", scored, eval_items)
unique = exact_deduplicated("curated/exact-dedup", clean)
distinct = fuzzy_deduplicated("curated/fuzzy-dedup", unique, config=curate.fuzzy)
page_text = extracted("curated/pages", raw_pages)

curated_tokenized = tokenized(name="tokenized/curated-stories", source=distinct, tokenizer=marin_tokenizer)
pages_tokenized = tokenized(name="tokenized/curated-pages", source=page_text, tokenizer=marin_tokenizer)

nano_curated_model = train_lm(
    name="checkpoints/marin-nano-curated",
    model=llama_nano,
    optimizer=train.optimizer,
    datasets={curated_tokenized: 0.9, pages_tokenized: 0.1},
    batch_size=train.batch_size,
    seq_len=train.seq_len,
    num_train_steps=train.num_train_steps,
    num_samples=1,
)

if __name__ == "__main__":
    runner = StepRunner()
    runner.run([nano_curated_model])
    print("\nWhat each curation step kept and removed:")
    print(curation_table(runner, [english, quality, scored, clean, unique, distinct, page_text]))
