"""LoRA training through the trainer: only the adapters change, the base weights stay frozen arrays
(no optimizer state), a run resumes, and the merged export loads as a plain model."""

from __future__ import annotations

import json

import equinox as eqx
import jax
import numpy as np
from levanter.compat.hf_checkpoints import export_to_hf, import_from_hf
from levanter.lora import LoraConfig, merge_lora
from levanter.main.train_lm import InitialWeights, TrainLmConfig, train_lm
from levanter.models.llama import LlamaConfig
from levanter.optim import AdamConfig
from levanter.trainer import TrainerConfig
from levanter.trainer.sources import InMemoryWindows

VOCAB = 64
SEQ = 16
TINY = LlamaConfig(hidden_dim=32, intermediate_dim=64, num_layers=2, num_heads=2, num_kv_heads=2, max_seq_len=SEQ)
LORA = LoraConfig(r=4, alpha=8, target_modules=("q_proj", "v_proj"))


def _source():
    return InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=8, seed=0)


def _flat(tree):
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def test_lora_run_trains_only_the_adapters_and_exports_a_loadable_merged_model(tmp_path, caplog):
    base = TINY.build(VOCAB, key=jax.random.PRNGKey(3))
    export_to_hf(base, str(tmp_path / "base"))
    config = TrainLmConfig(model=TINY, optimizer=AdamConfig(learning_rate=1e-2), vocab_size=VOCAB,
                           trainer=TrainerConfig(num_train_steps=3, batch_size=8, log_every=1),
                           output_path=str(tmp_path / "run"), lora=LORA,
                           initialize_from=InitialWeights(str(tmp_path / "base"), "hf"))
    with caplog.at_level("INFO", logger="levanter"):
        result = train_lm(config, _source())
    assert any("trainable parameters: 1,024 of 25,760" in r.getMessage() for r in caplog.records)  # 2 layers x 2 x (32x4 + 4x32)

    # The trained model: base weights bit-identical to the initial ones, adapters moved.
    merged = import_from_hf(result.hf_path)
    before = _flat(eqx.filter(base, eqx.is_inexact_array))
    after = _flat(eqx.filter(merged, eqx.is_inexact_array))
    changed = {name for name in before if not np.array_equal(before[name], after[name])}
    assert changed and all("q_proj" in name or "v_proj" in name for name in changed), changed
    adapter = json.loads((tmp_path / "run" / "hf-adapter" / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["target_modules"] == ["q_proj", "v_proj"]

    # Resuming reads the frozen base back from the checkpoint; a longer run continues from step 3.
    longer = TrainLmConfig(**{**config.__dict__, "trainer": TrainerConfig(num_train_steps=4, batch_size=8)})
    resumed = train_lm(longer, _source())
    assert resumed.final_step == 4


def test_frozen_base_has_no_optimizer_state_and_never_changes(tmp_path):
    from levanter.lora import apply_lora, lora_trainable_filter
    from levanter.trainer import Trainer

    trainer = Trainer(TrainerConfig(num_train_steps=2, batch_size=8), AdamConfig(learning_rate=1e-2),
                      output_dir=str(tmp_path / "run"), trainable=lora_trainable_filter, asynchronous_checkpoints=False)
    build = lambda key: apply_lora(TINY.build(VOCAB, key=key), LORA, key=jax.random.fold_in(key, 1))
    state, _, _ = trainer.init_state(build)
    frozen_before = _flat(state.frozen.model)
    adapters_before = _flat(state.params)
    opt_sizes = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim)
    assert opt_sizes == 2 * sum(x.size for x in adapters_before.values())  # Adam's two moments, adapters only
    result = trainer.train(build, _source())
    assert all(np.array_equal(frozen_before[k], v) for k, v in _flat(result.state.frozen.model).items())
    assert any(not np.array_equal(adapters_before[k], v) for k, v in _flat(result.state.params).items())
    merge_lora(result.model)  # the whole model is there to merge


def test_lora_dropout_acts_in_training_only_and_keeps_the_base_frozen(tmp_path):
    import dataclasses

    def run(dropout: float, name: str, microbatch: int | None = None):
        batch = 8 if microbatch is None else 16  # every microbatch must give each of the 8 test devices a row
        config = TrainLmConfig(model=TINY, optimizer=AdamConfig(learning_rate=1e-2), vocab_size=VOCAB,
                               trainer=TrainerConfig(num_train_steps=2, batch_size=batch, microbatch_size=microbatch,
                                                     log_every=1),
                               output_path=str(tmp_path / name), lora=dataclasses.replace(LORA, dropout=dropout))
        source = InMemoryWindows(np.tile(np.arange(VOCAB), 64), seq_len=SEQ, batch_size=batch, seed=0)
        result = train_lm(config, source)
        losses = [json.loads(line)["loss"] for line in open(result.metrics_path) if '"loss"' in line]
        return result, losses

    plain, plain_losses = run(0.0, "plain")
    dropped, dropped_losses = run(0.5, "dropped")
    # Same seed, same initial adapters (B starts at zero, so step 1's loss is the base model's either way);
    # from step 2 the adapters differ, trained through dropped-out inputs.
    assert plain_losses[0] == dropped_losses[0] and plain_losses[1] != dropped_losses[1]
    again, again_losses = run(0.5, "again")
    assert again_losses == dropped_losses  # the dropout keys come from the run's seed: reproducible
    _, micro_losses = run(0.5, "micro", microbatch=8)  # with microbatches too (a key per microbatch)
    assert len(micro_losses) == 2
    # The exported model holds no dropout: two imports of it give the same logits as each other, and
    # the adapters it merged differ from the run without dropout.
    tokens = jax.numpy.arange(SEQ)[None, :] % VOCAB
    merged, again_merged = import_from_hf(dropped.hf_path), import_from_hf(again.hf_path)
    assert np.array_equal(np.asarray(merged(tokens)), np.asarray(again_merged(tokens)))
    assert not np.array_equal(np.asarray(merged(tokens)), np.asarray(import_from_hf(plain.hf_path)(tokens)))
