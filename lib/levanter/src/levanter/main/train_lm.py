"""Train a language model end to end: the entry point the experiment layer calls.

Output folder (a local path or any fsspec URL, e.g. ``s3://bucket/run``)::

    <output_path>/
      checkpoints/<step>/   Orbax checkpoints (resume from the newest automatically)
      metrics.jsonl         one line per step, plus eval lines at eval steps
      eval.json             final step, train loss and validation losses
      hf/                   the final model in Hugging Face format (Llama or Mixtral)
      profile/              a jax.profiler trace, when TrainerConfig.profile asks for one
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx

from levanter.optim import OptimizerConfig
from levanter.trainer import EvalSources, Trainer, TrainerConfig
from levanter.trainer.compilation_cache import enable_compilation_cache
from levanter.trainer.stopping import StopSource
from levanter.trainer.trainer import DataSource

logger = logging.getLogger("levanter.train_lm")


@dataclass(frozen=True)
class TrainLmConfig:
    model: Any  # LlamaConfig, MoeConfig, or any config with build(vocab_size, key=) and flops_per_token()
    optimizer: OptimizerConfig
    trainer: TrainerConfig
    vocab_size: int
    output_path: str
    # Tokenizer files to put beside the HF export (a folder or a tokenizers.Tokenizer json file).
    tokenizer: str | None = None
    export_hf: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable description (model type included) for hashing and provenance."""
        return {
            "model": {"type": type(self.model).__name__, **dataclasses.asdict(self.model)},
            "optimizer": self.optimizer.to_dict(),
            "trainer": self.trainer.to_dict(),
            "vocab_size": self.vocab_size,
            "output_path": self.output_path,
            "tokenizer": self.tokenizer,
            "export_hf": self.export_hf,
        }


@dataclass(frozen=True)
class TrainLmResult:
    final_step: int
    final_train_loss: float | None
    eval_losses: dict[str, float]
    output_path: str
    checkpoint_dir: str
    checkpoint_paths: list[str]
    metrics_path: str
    eval_path: str
    hf_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _ensure_logging() -> None:
    """Make the progress lines visible when the caller has not configured logging.

    absl (imported by Orbax) puts its own handler on the root logger, so "root has handlers" does
    not mean the user configured anything; look at whether INFO from levanter would be emitted.
    """
    levanter_logger = logging.getLogger("levanter")
    user_handlers = [h for h in logging.getLogger().handlers if "absl" not in type(h).__module__]
    if levanter_logger.getEffectiveLevel() > logging.INFO or not user_handlers:
        if not levanter_logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
            levanter_logger.addHandler(handler)
            levanter_logger.propagate = False
        levanter_logger.setLevel(logging.INFO)
    # Orbax logs every phase of every save at INFO through absl; keep progress lines readable.
    logging.getLogger("absl").setLevel(logging.WARNING)


def _write_json_atomically(path: str, record: dict[str, Any]) -> None:
    fsx.atomic_write(path, json.dumps(record, indent=2))


def _export_hf(model, out_dir: str, tokenizer: str | None) -> str | None:
    try:
        from levanter.compat.hf_checkpoints import export_to_hf, family_of_model
    except ImportError:
        logger.warning("Hugging Face export unavailable (levanter.compat.hf_checkpoints missing); skipped.")
        return None
    if family_of_model(model) is None:
        logger.info("No Hugging Face export for %s models; skipped.", type(model).__name__)
        return None
    tokenizer_arg: Any = tokenizer
    if tokenizer is not None and _is_file(tokenizer):
        from tokenizers import Tokenizer

        with fsx.open_url(tokenizer, "rb") as f:
            tokenizer_arg = Tokenizer.from_str(f.read().decode("utf-8"))
    return export_to_hf(model, out_dir, tokenizer_dir_or_obj=tokenizer_arg)


def _is_file(url: str) -> bool:
    fs, path = fsx.filesystem(url)
    return fs.isfile(path)


def train_lm(
    config: TrainLmConfig,
    train_source: DataSource,
    eval_sources: EvalSources | None = None,
    *,
    stop_sources: Iterable[StopSource] = (),
) -> TrainLmResult:
    """Train ``config.model`` on ``train_source`` (resuming from ``output_path/checkpoints`` if a
    checkpoint is there), evaluate on ``eval_sources``, and write the output folder.

    ``stop_sources`` are polled between steps (:mod:`levanter.trainer.stopping`); an ABANDON
    request also keeps ``eval.json`` and the Hugging Face export from being written. Compiled
    programs go to the persistent compilation cache (:mod:`levanter.trainer.compilation_cache`).
    """
    _ensure_logging()
    enable_compilation_cache()
    out = fsx.absolute(config.output_path)
    if fsx.is_local(out):
        os.makedirs(out, exist_ok=True)
    model_config = config.model
    flops = None
    if hasattr(model_config, "flops_per_token"):
        flops = lambda seq_len: model_config.flops_per_token(config.vocab_size, seq_len)  # noqa: E731
    trainer = Trainer(
        config.trainer,
        config.optimizer,
        output_dir=out,
        flops_per_token=flops,
        run_config=config.to_dict(),
        stop_sources=stop_sources,
    )
    result = trainer.train(lambda key: model_config.build(config.vocab_size, key=key), train_source, eval_sources)

    eval_path = fsx.join(out, "eval.json")
    trainer.raise_if_abandoned(result.final_step)
    _write_json_atomically(
        eval_path,
        {"step": result.final_step, "train_loss": result.final_train_loss, "eval": result.eval_losses},
    )
    trainer.raise_if_abandoned(result.final_step)
    hf_path = _export_hf(result.model, fsx.join(out, "hf"), config.tokenizer) if config.export_hf else None
    trainer.checkpointer.close()
    return TrainLmResult(
        final_step=result.final_step,
        final_train_loss=result.final_train_loss,
        eval_losses=result.eval_losses,
        output_path=out,
        checkpoint_dir=result.checkpoint_dir,
        checkpoint_paths=[trainer.checkpointer.path_of(s) for s in result.checkpoint_steps],
        metrics_path=result.metrics_path,
        eval_path=eval_path,
        hf_path=hf_path,
    )
