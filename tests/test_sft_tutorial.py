"""The fine-tuning tutorial (experiments/tutorials/sft_tiny_model.py): its chat set and its graph.

Running it end to end takes a minute on two cores beyond the tutorial itself; the chat path it
uses is trained end to end in lib/marin/tests/test_chat_dataset.py, and the numbers it prints are in
docs/post-training.md. Here: the data is what the tutorial says, and the graph reuses the tutorial's
own steps rather than training anew.
"""

import json

from experiments.tiny_chats import ANIMAL_SOUNDS, CHILD_PETS, TOY_COLOURS, as_jsonl, conversations


def test_the_chat_set_is_deterministic_and_every_answer_is_a_fact_of_its_world():
    assert as_jsonl(50, seed=3) == as_jsonl(50, seed=3) != as_jsonl(50, seed=4)
    records = [json.loads(line) for line in as_jsonl(200).splitlines()]
    assert len(records) == 200 and any(len(r["messages"]) == 4 for r in records)
    for record in records:
        roles = [m["role"] for m in record["messages"]]
        assert roles == ["user", "assistant"] * (len(roles) // 2)
        for question, answer in zip(record["messages"][::2], record["messages"][1::2]):
            q, a = question["content"], answer["content"]
            facts = [f"The {toy} is {colour}." for toy, colour in TOY_COLOURS.items() if f"the {toy}?" in q]
            facts += [f"The {animal} says {sound}." for animal, sound in ANIMAL_SOUNDS.items() if f"the {animal} say" in q]
            facts += [f"{child} has a {pet}." for child, pet in CHILD_PETS.items() if f"{child} " in q or f"{child}'s" in q]
            assert facts and all(fact in a for fact in facts), (q, a)
    assert sum(1 for _ in conversations(7)) == 7


def test_fine_tuning_starts_from_the_tutorials_model_and_reuses_its_steps(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    from marin.execution.lazy import lower

    from experiments.tutorials.sft_tiny_model import nano_chat_model
    from experiments.tutorials.train_tiny_model import nano_tinystories_model

    steps = {step.name: step for step in lower(nano_chat_model)}
    # The tutorial's training step, with the hash the tutorial's own run has: a rerun finds it cached.
    assert steps["checkpoints/marin-nano-tinystories"].short_hash == nano_tinystories_model.short_hash == "72472b56"
    assert nano_tinystories_model in nano_chat_model.deps
    assert set(steps) == {
        "datasets/tiny-chats", "datasets/builtin-tinystories", "tokenizers/builtin-bpe", "chat/tiny-chats",
        "tokenized/tinystories", "checkpoints/marin-nano-tinystories", "checkpoints/marin-nano-tinystories-chat",
    }
