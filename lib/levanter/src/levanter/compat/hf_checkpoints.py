"""Llama checkpoints in the Hugging Face format: ``config.json`` + safetensors (+ tokenizer files).

Our weights differ from ``LlamaForCausalLM``'s only by layout: HF stores ``nn.Linear`` weights as
``[out, in]`` with heads flattened, we store ``[in, out]`` with heads as their own dimension. Both
use the "rotate halves" RoPE layout, so no permutation of query/key rows is needed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors.numpy import load_file, save_file

from haliax import Stacked
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")


class HfFormatError(ValueError):
    """A checkpoint folder that is not a Llama checkpoint we can read."""


@dataclass(frozen=True)
class _Tensor:
    """One per-layer weight: where it lives in our layer, its HF name, and the two layout maps."""

    ours: str
    theirs: str
    to_hf: Callable[[np.ndarray], np.ndarray]
    from_hf: Callable[[np.ndarray], np.ndarray]


def _layer_tensors(config: LlamaConfig) -> list[_Tensor]:
    h, d = config.hidden_dim, config.head_dim

    def heads_in(num_heads):  # ours [h, heads, d] <-> theirs [heads * d, h]
        return (lambda w: w.reshape(h, num_heads * d).T, lambda t: t.T.reshape(h, num_heads, d))

    def transpose():
        return (lambda w: w.T, lambda t: t.T)

    def same():
        return (lambda w: w, lambda t: t)

    return [
        _Tensor("input_norm.weight", "input_layernorm.weight", *same()),
        _Tensor("post_attention_norm.weight", "post_attention_layernorm.weight", *same()),
        _Tensor("attention.q_proj.weight", "self_attn.q_proj.weight", *heads_in(config.num_heads)),
        _Tensor("attention.k_proj.weight", "self_attn.k_proj.weight", *heads_in(config.num_kv_heads)),
        _Tensor("attention.v_proj.weight", "self_attn.v_proj.weight", *heads_in(config.num_kv_heads)),
        # ours [heads, d, h] <-> theirs [h, heads * d]
        _Tensor("attention.o_proj.weight", "self_attn.o_proj.weight", lambda w: w.reshape(-1, h).T, lambda t: t.T.reshape(config.num_heads, d, h)),
        _Tensor("mlp.gate_proj.weight", "mlp.gate_proj.weight", *transpose()),
        _Tensor("mlp.up_proj.weight", "mlp.up_proj.weight", *transpose()),
        _Tensor("mlp.down_proj.weight", "mlp.down_proj.weight", *transpose()),
    ]


def hf_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``LlamaForCausalLM`` for ``config``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_word_embeddings,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": config.initializer_range,
        "torch_dtype": jnp.dtype(dtype).name,
    }


def llama_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``LlamaForCausalLM`` ``config.json`` dict."""
    if hf.get("model_type") not in (None, "llama"):
        raise HfFormatError(f"Expected a Llama checkpoint (model_type 'llama'), got model_type {hf.get('model_type')!r}.")
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise HfFormatError(f"RoPE scaling {rope_type!r} is not supported; only plain RoPE ('default') is.")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise HfFormatError("Llama checkpoints with attention or MLP biases are not supported.")
    num_heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // num_heads):
        raise HfFormatError(f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads is not supported.")
    if hf.get("hidden_act", "silu") != "silu":
        raise HfFormatError(f"Only the SiLU (SwiGLU) activation is supported, got {hf['hidden_act']!r}.")
    config = LlamaConfig(
        hidden_dim=hf["hidden_size"],
        intermediate_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )
    return config, int(hf["vocab_size"])


def _layers_of(model: LlamaLMHeadModel) -> list[LlamaDecoderLayer]:
    return model.layers.unstack() if isinstance(model.layers, Stacked) else list(model.layers)


def iter_hf_tensors(model: LlamaLMHeadModel) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight under its ``LlamaForCausalLM`` state-dict name, one at a time (host numpy)."""
    specs = _layer_tensors(model.config)
    yield "model.embed_tokens.weight", np.asarray(model.embed.weight)
    for i, layer in enumerate(_layers_of(model)):
        for spec in specs:
            yield f"model.layers.{i}.{spec.theirs}", np.ascontiguousarray(spec.to_hf(np.asarray(attrgetter(spec.ours)(layer))))
    yield "model.norm.weight", np.asarray(model.final_norm.weight)
    if model.lm_head is not None:
        yield "lm_head.weight", np.ascontiguousarray(np.asarray(model.lm_head.weight).T)


def llama_to_hf_tensors(model: LlamaLMHeadModel) -> dict[str, np.ndarray]:
    return dict(iter_hf_tensors(model))


def _save_atomically(tensors: dict[str, np.ndarray], path: str) -> None:
    # A crash never leaves a truncated file under the real name.
    save_file(tensors, path + ".tmp", metadata={"format": "pt"})
    os.replace(path + ".tmp", path)


def export_llama_to_hf(
    model: LlamaLMHeadModel,
    out_dir: str | os.PathLike,
    *,
    tokenizer_dir_or_obj: Any = None,
    max_shard_bytes: int = 5 * 2**30,
) -> str:
    """Write ``model`` as a ``LlamaForCausalLM`` checkpoint folder; returns the folder.

    ``tokenizer_dir_or_obj``: a ``tokenizers.Tokenizer`` (saved as ``tokenizer.json``) or a folder
    whose tokenizer files are copied. Weights are written in the model's (float32) parameter
    dtype: one ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when they
    exceed ``max_shard_bytes``, the layout ``from_pretrained`` expects.
    """
    if not isinstance(model, LlamaLMHeadModel):
        raise TypeError(f"export_llama_to_hf needs a LlamaLMHeadModel, got {type(model).__name__}.")
    dtype = model.embed.weight.dtype
    if dtype == jnp.bfloat16:
        raise HfFormatError("Export float32 parameters (safetensors.numpy cannot write bfloat16); cast with jax.tree.map first.")
    out_dir = os.fspath(out_dir)
    os.makedirs(out_dir, exist_ok=True)

    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, tensor in iter_hf_tensors(model):
        if shards[-1] and shard_bytes + tensor.nbytes > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += tensor.nbytes
    total = sum(t.nbytes for shard in shards for t in shard.values())
    if len(shards) == 1:
        _save_atomically(shards[0], os.path.join(out_dir, WEIGHTS_FILE))
    else:
        weight_map = {}
        started = time.monotonic()
        for i, shard in enumerate(shards):
            file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _save_atomically(shard, os.path.join(out_dir, file_name))
            weight_map.update({name: file_name for name in shard})
            logger.info("Exported shard %d/%d (%.1fs elapsed)", i + 1, len(shards), time.monotonic() - started)
        with open(os.path.join(out_dir, INDEX_FILE), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(hf_config_dict(model.config, model.vocab_size, dtype), f, indent=2)
    if tokenizer_dir_or_obj is not None:
        _write_tokenizer(tokenizer_dir_or_obj, out_dir)
    logger.info("Exported %d parameters (%.1f MB) in %d file(s) to %s", model.config.num_parameters(model.vocab_size), total / 1e6, len(shards), out_dir)
    return out_dir


def _write_tokenizer(tokenizer: Any, out_dir: str) -> None:
    if isinstance(tokenizer, (str, os.PathLike)):
        src = os.fspath(tokenizer)
        found = [name for name in TOKENIZER_FILES if os.path.exists(os.path.join(src, name))]
        if not found:
            raise HfFormatError(f"No tokenizer files ({', '.join(TOKENIZER_FILES)}) in {src}.")
        for name in found:
            shutil.copyfile(os.path.join(src, name), os.path.join(out_dir, name))
    elif hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
        tokenizer.save(os.path.join(out_dir, "tokenizer.json"))
    else:
        raise TypeError(f"tokenizer_dir_or_obj must be a folder or a tokenizers.Tokenizer, got {type(tokenizer).__name__}.")
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    if not os.path.exists(config_path):
        # Lets transformers.AutoTokenizer open a bare tokenizer.json.
        with open(config_path, "w") as f:
            json.dump({"tokenizer_class": "PreTrainedTokenizerFast"}, f, indent=2)


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    single = os.path.join(path, WEIGHTS_FILE)
    if os.path.exists(single):
        return load_file(single)
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        tensors: dict[str, np.ndarray] = {}
        for name in files:
            tensors.update(load_file(os.path.join(path, name)))
        return tensors
    raise HfFormatError(f"No {WEIGHTS_FILE} or {INDEX_FILE} in {path}; save the Hugging Face model with safe_serialization.")


def import_llama_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> LlamaLMHeadModel:
    """Load a local ``LlamaForCausalLM`` checkpoint folder (config.json + safetensors) as our model."""
    path = os.fspath(path)
    config_path = os.path.join(path, "config.json")
    if not os.path.exists(config_path):
        raise HfFormatError(f"No config.json in {path}: not a Hugging Face checkpoint folder.")
    with open(config_path) as f:
        config, vocab_size = llama_config_from_hf(json.load(f))
    config = LlamaConfig(**{**config.to_dict(), "use_scan": use_scan, "gradient_checkpointing": gradient_checkpointing})
    tensors = _read_tensors(path)

    def take(name: str) -> np.ndarray:
        if name not in tensors:
            raise HfFormatError(f"Checkpoint in {path} lacks tensor {name!r}.")
        return tensors.pop(name)

    def as_array(x: np.ndarray) -> jax.Array:
        return jnp.asarray(x, dtype=dtype)

    # Shapes only: no random initialisation of weights we are about to overwrite.
    skeleton = eqx.filter_eval_shape(lambda: LlamaLMHeadModel(config, vocab_size, key=jax.random.PRNGKey(0)))
    layer_skeleton = eqx.filter_eval_shape(lambda: LlamaDecoderLayer(config, key=jax.random.PRNGKey(0)))
    specs = _layer_tensors(config)
    layers = []
    for i in range(config.num_layers):
        weights = [as_array(spec.from_hf(take(f"model.layers.{i}.{spec.theirs}"))) for spec in specs]
        layers.append(eqx.tree_at(lambda l: [attrgetter(s.ours)(l) for s in specs], layer_skeleton, weights))
    if use_scan:
        stacked_layers: Any = Stacked(jax.tree.map(lambda *xs: jnp.stack(xs), *layers), config.num_layers)
    else:
        stacked_layers = tuple(layers)

    embed = as_array(take("model.embed_tokens.weight"))
    model = eqx.tree_at(lambda m: m.embed.weight, skeleton, embed)
    model = eqx.tree_at(lambda m: m.final_norm.weight, model, as_array(take("model.norm.weight")))
    model = eqx.tree_at(lambda m: m.layers, model, stacked_layers)
    if model.lm_head is not None:
        # Some tied checkpoints still store lm_head.weight; untied ones must.
        model = eqx.tree_at(lambda m: m.lm_head.weight, model, as_array(take("lm_head.weight").T))
    tensors.pop("lm_head.weight", None)
    leftover = sorted(k for k in tensors if "rotary_emb" not in k)
    if leftover:
        raise HfFormatError(f"Checkpoint in {path} has tensors this Llama does not use: {leftover[:5]}...")
    return model
