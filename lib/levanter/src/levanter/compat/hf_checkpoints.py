"""Decoder checkpoints in the Hugging Face format: ``config.json`` + safetensors (+ tokenizer files).

This module holds what every family shares (the folder layout, sharded writing and reading, the
attention and norm weights, the embedding and head) and the Llama family; ``hf_mixtral`` adds the
Mixtral (MoE) family on the same machinery. ``export_to_hf`` / ``import_from_hf`` pick the family
from the model or from ``config.json``'s ``model_type``, so callers need not know it.

Our weights differ from the Hugging Face ones only by layout: HF stores ``nn.Linear`` weights as
``[out, in]`` with heads flattened, we store ``[in, out]`` with heads as their own dimension. Both
use the "rotate halves" RoPE layout, so no permutation of query/key rows is needed.

Folders are local paths or any fsspec URL (``s3://``, ``gs://``, ``memory://``...): files are written
and read through :mod:`rigging.filesystem`, each one appearing whole or not at all.

Reading refuses a damaged folder with :class:`CorruptCheckpointError` naming the file at fault (a
truncated or missing safetensors file, a ``config.json`` that is not JSON or lacks a field) and the
tensors holding NaN or infinite values: a model loaded from them would only produce garbage.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load, load_file, save, save_file

from haliax import Stacked
from levanter.models.llama import LlamaConfig, LlamaDecoderLayer, LlamaLMHeadModel
from rigging import filesystem as fsx

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")
DEFAULT_MAX_SHARD_BYTES = 5 * 2**30


class HfFormatError(ValueError):
    """A checkpoint folder (or a model) that this module cannot read (or write) faithfully."""


class CorruptCheckpointError(HfFormatError):
    """A file of a checkpoint folder is damaged: truncated, missing, unparsable, or holds NaN/inf weights."""


# The config.json fields every supported family needs, with no default we could assume.
REQUIRED_CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")


# -- how one weight of our decoder layer maps to Hugging Face tensors ---------------------------------


@dataclass(frozen=True)
class LayerWeight:
    """One weight of our decoder layer and the HF tensor(s) of that layer it corresponds to.

    HF names are relative to ``model.layers.{i}.``. One of our weights may be several HF tensors
    (stacked experts are one HF tensor per expert), hence the iterator and the ``take`` callback.
    """

    ours: str  # attribute path inside our layer
    to_hf: Callable[[np.ndarray], Iterator[tuple[str, np.ndarray]]]
    from_hf: Callable[[Callable[[str], np.ndarray]], np.ndarray]


def _same(w: np.ndarray) -> np.ndarray:
    return w


def _transpose(w: np.ndarray) -> np.ndarray:
    return w.T


def renamed(ours: str, theirs: str, to_hf: Callable = _same, from_hf: Callable = _same) -> LayerWeight:
    """A weight that is exactly one HF tensor, up to a layout change."""
    return LayerWeight(ours, lambda w: iter([(theirs, to_hf(w))]), lambda take: from_hf(take(theirs)))


def transposed(ours: str, theirs: str) -> LayerWeight:
    """A linear map: ours ``[in, out]``, theirs ``[out, in]``."""
    return renamed(ours, theirs, _transpose, _transpose)


def attention_weights(config: Any) -> list[LayerWeight]:
    """The norms and attention weights every decoder layer of ours has (Llama and MoE alike)."""
    h, d = config.hidden_dim, config.head_dim

    def heads_in(ours: str, theirs: str, num_heads: int) -> LayerWeight:  # ours [h, heads, d] <-> theirs [heads * d, h]
        return renamed(ours, theirs, lambda w: w.reshape(h, num_heads * d).T, lambda t: t.T.reshape(h, num_heads, d))

    return [
        renamed("input_norm.weight", "input_layernorm.weight"),
        renamed("post_attention_norm.weight", "post_attention_layernorm.weight"),
        heads_in("attention.q_proj.weight", "self_attn.q_proj.weight", config.num_heads),
        heads_in("attention.k_proj.weight", "self_attn.k_proj.weight", config.num_kv_heads),
        heads_in("attention.v_proj.weight", "self_attn.v_proj.weight", config.num_kv_heads),
        # ours [heads, d, h] <-> theirs [h, heads * d]
        renamed("attention.o_proj.weight", "self_attn.o_proj.weight",
                lambda w: w.reshape(-1, h).T, lambda t: t.T.reshape(config.num_heads, d, h)),
    ]


# -- config.json fields every family shares -------------------------------------------------------


def decoder_config_dict(config: Any, vocab_size: int, dtype: Any) -> dict:
    """The ``config.json`` fields of the attention/embedding part, common to Llama and Mixtral."""
    return {
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
        "initializer_range": config.initializer_range,
        "torch_dtype": jnp.dtype(dtype).name,
    }


def decoder_fields_from_hf(hf: dict, *, default_rope_theta: float = 10000.0) -> dict:
    """Our config's shared fields from a ``config.json`` dict; refuses what would change the logits."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise HfFormatError(f"RoPE scaling {rope_type!r} is not supported; only plain RoPE ('default') is.")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        raise HfFormatError("Checkpoints with attention or MLP biases are not supported.")
    num_heads = hf["num_attention_heads"]
    if hf.get("head_dim") not in (None, hf["hidden_size"] // num_heads):
        raise HfFormatError(f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads is not supported.")
    if hf.get("hidden_act", "silu") != "silu":
        raise HfFormatError(f"Only the SiLU (SwiGLU) activation is supported, got {hf['hidden_act']!r}.")
    return dict(
        hidden_dim=hf["hidden_size"],
        intermediate_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", default_rope_theta))),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )


# -- a family: one of our model classes and its Hugging Face counterpart ----------------------------


def _no_renaming(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return tensors


@dataclass(frozen=True)
class HfFamily:
    """What it takes to write and read one model class as a Hugging Face checkpoint."""

    model_type: str  # config.json's model_type
    model_class: type
    layer_class: type
    layer_weights: Callable[[Any], list[LayerWeight]]
    config_to_hf: Callable[[Any, int, Any], dict]
    config_from_hf: Callable[[dict], tuple[Any, int]]
    # Maps other spellings of the same weights (e.g. fused expert tensors) to the names layer_weights reads.
    canonical_names: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = _no_renaming


def _layers_of(model: Any) -> list[Any]:
    return model.layers.unstack() if isinstance(model.layers, Stacked) else list(model.layers)


def iter_family_tensors(family: HfFamily, model: Any) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight under its HF state-dict name, one at a time (host numpy)."""
    weights = family.layer_weights(model.config)
    yield "model.embed_tokens.weight", np.asarray(model.embed.weight)
    for i, layer in enumerate(_layers_of(model)):
        for weight in weights:
            for suffix, tensor in weight.to_hf(np.asarray(attrgetter(weight.ours)(layer))):
                yield f"model.layers.{i}.{suffix}", np.ascontiguousarray(tensor)
    yield "model.norm.weight", np.asarray(model.final_norm.weight)
    if model.lm_head is not None:
        yield "lm_head.weight", np.ascontiguousarray(np.asarray(model.lm_head.weight).T)


def _save_atomically(tensors: dict[str, np.ndarray], url: str) -> None:
    # A crash never leaves a truncated file under the real name.
    if fsx.is_local(url):
        path = fsx.absolute(url)
        save_file(tensors, path + ".tmp", metadata={"format": "pt"})  # streamed to disk, no copy in memory
        os.replace(path + ".tmp", path)
    else:  # an object store publishes an object only when its upload completes
        fsx.atomic_write(url, save(tensors, metadata={"format": "pt"}))


def _write_json(url: str, value: Any) -> None:
    fsx.atomic_write(url, json.dumps(value, indent=2))


def write_checkpoint(family: HfFamily, model: Any, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                     max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` as ``family``'s checkpoint folder (see ``export_to_hf``); returns the folder."""
    if not isinstance(model, family.model_class):
        raise TypeError(f"A {family.model_type} checkpoint needs a {family.model_class.__name__}, got {type(model).__name__}.")
    dtype = model.embed.weight.dtype
    if dtype == jnp.bfloat16:
        raise HfFormatError("Export float32 parameters (safetensors.numpy cannot write bfloat16); cast with jax.tree.map first.")
    out_dir = os.fspath(out_dir)
    if fsx.is_local(out_dir):
        os.makedirs(fsx.absolute(out_dir), exist_ok=True)

    shards: list[dict[str, np.ndarray]] = [{}]
    shard_bytes = 0
    for name, tensor in iter_family_tensors(family, model):
        if shards[-1] and shard_bytes + tensor.nbytes > max_shard_bytes:
            shards.append({})
            shard_bytes = 0
        shards[-1][name] = tensor
        shard_bytes += tensor.nbytes
    total = sum(t.nbytes for shard in shards for t in shard.values())
    if len(shards) == 1:
        _save_atomically(shards[0], fsx.join(out_dir, WEIGHTS_FILE))
    else:
        weight_map = {}
        started = time.monotonic()
        for i, shard in enumerate(shards):
            file_name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            _save_atomically(shard, fsx.join(out_dir, file_name))
            weight_map.update({name: file_name for name in shard})
            logger.info("Exported shard %d/%d (%.1fs elapsed)", i + 1, len(shards), time.monotonic() - started)
        _write_json(fsx.join(out_dir, INDEX_FILE), {"metadata": {"total_size": total}, "weight_map": weight_map})
    _write_json(fsx.join(out_dir, "config.json"), family.config_to_hf(model.config, model.vocab_size, dtype))
    if tokenizer_dir_or_obj is not None:
        _write_tokenizer(tokenizer_dir_or_obj, out_dir)
    logger.info("Exported %d parameters (%.1f MB) in %d file(s) to %s", model.config.num_parameters(model.vocab_size), total / 1e6, len(shards), out_dir)
    return out_dir


def _write_tokenizer(tokenizer: Any, out_dir: str) -> None:
    if isinstance(tokenizer, (str, os.PathLike)):
        src = os.fspath(tokenizer)
        found = [name for name in TOKENIZER_FILES if fsx.exists(fsx.join(src, name))]
        if not found:
            raise HfFormatError(f"No tokenizer files ({', '.join(TOKENIZER_FILES)}) in {src}.")
        for name in found:
            with fsx.open_url(fsx.join(src, name), "rb") as f:
                fsx.atomic_write(fsx.join(out_dir, name), f.read())
    elif hasattr(tokenizer, "to_str"):  # a tokenizers.Tokenizer
        fsx.atomic_write(fsx.join(out_dir, "tokenizer.json"), tokenizer.to_str(pretty=True))  # as Tokenizer.save writes it
    else:
        raise TypeError(f"tokenizer_dir_or_obj must be a folder or a tokenizers.Tokenizer, got {type(tokenizer).__name__}.")
    config_path = fsx.join(out_dir, "tokenizer_config.json")
    if not fsx.exists(config_path):
        # Lets transformers.AutoTokenizer open a bare tokenizer.json.
        _write_json(config_path, {"tokenizer_class": "PreTrainedTokenizerFast"})


def _read_json_object(file_path: str) -> dict:
    """A JSON file holding one object; :class:`CorruptCheckpointError` naming the file otherwise."""
    try:
        with fsx.open_url(file_path, "rb") as f:
            value = json.loads(f.read().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
        raise CorruptCheckpointError(
            f"{file_path} is not valid JSON ({e}); the checkpoint folder is damaged. Export or download it again."
        ) from e
    if not isinstance(value, dict):
        raise CorruptCheckpointError(
            f"{file_path} is not a JSON object (it holds a {type(value).__name__}); the checkpoint folder is damaged. "
            "Export or download it again."
        )
    return value


def read_hf_config(path: str | os.PathLike) -> dict:
    """The ``config.json`` of a checkpoint folder (a local path or any fsspec URL), as a dict."""
    config_path = fsx.join(os.fspath(path), "config.json")
    if not fsx.exists(config_path):
        raise HfFormatError(f"No config.json in {os.fspath(path)}: not a Hugging Face checkpoint folder.")
    return _read_json_object(config_path)


def _config_of_family(family: HfFamily, path: str) -> tuple[Any, int]:
    """Our config from the folder's ``config.json``; a missing or ill-typed field names the file."""
    config_path = fsx.join(path, "config.json")
    hf = read_hf_config(path)
    missing = [name for name in REQUIRED_CONFIG_FIELDS if name not in hf]
    if missing:
        raise CorruptCheckpointError(
            f"{config_path} lacks {', '.join(repr(m) for m in missing)}: the file is incomplete or not a model config. "
            "Export or download the checkpoint again."
        )
    wrong = [f"{name}={hf[name]!r}" for name in REQUIRED_CONFIG_FIELDS
             if isinstance(hf[name], bool) or not isinstance(hf[name], int) or hf[name] < 1]
    if wrong:
        raise CorruptCheckpointError(f"{config_path} has {', '.join(wrong)}; these fields must be positive integers.")
    try:
        return family.config_from_hf(hf)
    except HfFormatError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a family-specific field missing or of the wrong kind
        raise CorruptCheckpointError(
            f"{config_path} does not describe a valid {family.model_type} model ({type(e).__name__}: {e})."
        ) from e


def _non_finite(tensor: np.ndarray) -> bool:
    if not jnp.issubdtype(tensor.dtype, jnp.floating):
        return False
    # One pass and no temporary array: NaN and inf survive a sum, and a float64 sum of finite
    # values of 32 bits or fewer cannot overflow. Only a non-finite sum needs the exact check.
    with np.errstate(over="ignore"):  # float64 weights near their limit: the exact check decides
        if np.isfinite(tensor.sum(dtype=np.float64)):
            return False
    return not bool(np.isfinite(tensor).all())


def _load_weights_file(file_path: str, *, named_by: str | None = None) -> dict[str, np.ndarray]:
    """The tensors of one safetensors file, refusing a missing, unreadable or non-finite one."""
    if not fsx.exists(file_path):
        raise CorruptCheckpointError(
            f"{file_path} is missing" + (f" (named by {named_by})" if named_by else "")
            + "; the checkpoint folder is incomplete. Copy or export it again."
        )
    try:
        if fsx.is_local(file_path):
            tensors = load_file(fsx.absolute(file_path))  # memory-mapped
        else:
            with fsx.open_url(file_path, "rb") as f:
                tensors = load(f.read())
    except (SafetensorError, OSError) as e:
        raise CorruptCheckpointError(
            f"{file_path} is truncated or corrupt and cannot be read ({e}). Copy or export the checkpoint again."
        ) from e
    bad = sorted(name for name, tensor in tensors.items() if _non_finite(tensor))
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise CorruptCheckpointError(
            f"{file_path} holds NaN or infinite values in {shown}; a model with these weights only produces "
            "garbage. Use an earlier checkpoint of the run (training diverged, or the file was damaged)."
        )
    return tensors


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    single = fsx.join(path, WEIGHTS_FILE)
    if fsx.exists(single):
        return _load_weights_file(single)
    index = fsx.join(path, INDEX_FILE)
    if fsx.exists(index):
        weight_map = _read_json_object(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise CorruptCheckpointError(f"{index} has no 'weight_map' object; the checkpoint folder is damaged.")
        tensors: dict[str, np.ndarray] = {}
        for name in sorted(set(weight_map.values())):
            tensors.update(_load_weights_file(fsx.join(path, name), named_by=index))
        return tensors
    raise HfFormatError(f"No {WEIGHTS_FILE} or {INDEX_FILE} in {path}; save the Hugging Face model with safe_serialization.")


def _shapes_disagree(path: str, detail: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"The tensors in {path} do not have the shapes its config.json describes ({detail}): one of the files is "
        "damaged, or they come from different models."
    )


def _check_shapes(model: Any, skeleton: Any, path: str) -> None:
    # Weights whose layout needs no reshape would otherwise load at any size and fail only later.
    loaded = jax.tree_util.tree_flatten_with_path(model)[0]
    for (where, leaf), expected in zip(loaded, jax.tree.leaves(skeleton), strict=True):
        if getattr(leaf, "shape", None) != getattr(expected, "shape", None):
            detail = f"our {jax.tree_util.keystr(where)} has shape {tuple(leaf.shape)}, config.json implies {tuple(expected.shape)}"
            raise _shapes_disagree(path, detail)


def read_checkpoint(family: HfFamily, path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False,
                    dtype: Any = jnp.float32) -> Any:
    """Load a checkpoint folder of ``family`` (config.json + safetensors; a local path or any URL) as our model."""
    path = os.fspath(path)
    config, vocab_size = _config_of_family(family, path)
    config = dataclasses.replace(config, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing)
    tensors = family.canonical_names(_read_tensors(path))

    def take(name: str) -> np.ndarray:
        if name not in tensors:
            raise HfFormatError(f"Checkpoint in {path} lacks tensor {name!r}.")
        return tensors.pop(name)

    def as_array(x: np.ndarray) -> jax.Array:
        return jnp.asarray(x, dtype=dtype)

    # Shapes only: no random initialisation of weights we are about to overwrite.
    skeleton = eqx.filter_eval_shape(lambda: family.model_class(config, vocab_size, key=jax.random.PRNGKey(0)))
    layer_skeleton = eqx.filter_eval_shape(lambda: family.layer_class(config, key=jax.random.PRNGKey(0)))
    weights = family.layer_weights(config)
    try:
        layers = []
        for i in range(config.num_layers):
            prefix = f"model.layers.{i}."
            values = [as_array(w.from_hf(lambda suffix: take(prefix + suffix))) for w in weights]
            layers.append(eqx.tree_at(lambda l: [attrgetter(w.ours)(l) for w in weights], layer_skeleton, values))
        if use_scan:
            stacked_layers: Any = Stacked(jax.tree.map(lambda *xs: jnp.stack(xs), *layers), config.num_layers)
        else:
            stacked_layers = tuple(layers)

        model = eqx.tree_at(lambda m: m.embed.weight, skeleton, as_array(take("model.embed_tokens.weight")))
        model = eqx.tree_at(lambda m: m.final_norm.weight, model, as_array(take("model.norm.weight")))
        model = eqx.tree_at(lambda m: m.layers, model, stacked_layers)
        if model.lm_head is not None:
            # Some tied checkpoints still store lm_head.weight; untied ones must.
            model = eqx.tree_at(lambda m: m.lm_head.weight, model, as_array(take("lm_head.weight").T))
    except HfFormatError:
        raise
    except (ValueError, TypeError) as e:  # a head reshape or layer stack of tensors config.json did not predict
        raise _shapes_disagree(path, str(e)) from e
    _check_shapes(model, skeleton, path)
    tensors.pop("lm_head.weight", None)
    leftover = sorted(k for k in tensors if "rotary_emb" not in k)
    if leftover:
        raise HfFormatError(f"Checkpoint in {path} has tensors this {family.model_type} model does not use: {leftover[:5]}...")
    return model


# -- Llama ------------------------------------------------------------------------------------------


def _llama_layer_weights(config: LlamaConfig) -> list[LayerWeight]:
    return attention_weights(config) + [
        transposed("mlp.gate_proj.weight", "mlp.gate_proj.weight"),
        transposed("mlp.up_proj.weight", "mlp.up_proj.weight"),
        transposed("mlp.down_proj.weight", "mlp.down_proj.weight"),
    ]


def hf_config_dict(config: LlamaConfig, vocab_size: int, dtype: Any = jnp.float32) -> dict:
    """The ``config.json`` of ``LlamaForCausalLM`` for ``config``."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **decoder_config_dict(config, vocab_size, dtype), "mlp_bias": False}


def llama_config_from_hf(hf: dict) -> tuple[LlamaConfig, int]:
    """Our config and the vocabulary size from a ``LlamaForCausalLM`` ``config.json`` dict."""
    if hf.get("model_type") not in (None, "llama"):
        raise HfFormatError(f"Expected a Llama checkpoint (model_type 'llama'), got model_type {hf.get('model_type')!r}.")
    return LlamaConfig(**decoder_fields_from_hf(hf)), int(hf["vocab_size"])


LLAMA = HfFamily("llama", LlamaLMHeadModel, LlamaDecoderLayer, _llama_layer_weights, hf_config_dict, llama_config_from_hf)


def iter_hf_tensors(model: LlamaLMHeadModel) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight under its ``LlamaForCausalLM`` state-dict name, one at a time (host numpy)."""
    return iter_family_tensors(LLAMA, model)


def llama_to_hf_tensors(model: LlamaLMHeadModel) -> dict[str, np.ndarray]:
    return dict(iter_hf_tensors(model))


def export_llama_to_hf(model: LlamaLMHeadModel, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                       max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` as a ``LlamaForCausalLM`` checkpoint folder; returns the folder (see ``export_to_hf``)."""
    if not isinstance(model, LlamaLMHeadModel):
        raise TypeError(f"export_llama_to_hf needs a LlamaLMHeadModel, got {type(model).__name__}.")
    return write_checkpoint(LLAMA, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def import_llama_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> LlamaLMHeadModel:
    """Load a ``LlamaForCausalLM`` checkpoint folder (config.json + safetensors; a local path or any URL) as our model."""
    return read_checkpoint(LLAMA, path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)


# -- any supported family ---------------------------------------------------------------------------


def supported_families() -> tuple[HfFamily, ...]:
    # Imported here, not at the top: hf_mixtral builds on this module.
    from levanter.compat.hf_mixtral import MIXTRAL

    return (LLAMA, MIXTRAL)


def family_of_model(model: Any) -> HfFamily | None:
    """The family that can export ``model``, or None when none can."""
    return next((f for f in supported_families() if isinstance(model, f.model_class)), None)


def export_to_hf(model: Any, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                 max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` (Llama or MoE) as a Hugging Face checkpoint folder; returns the folder.

    ``LlamaLMHeadModel`` becomes ``LlamaForCausalLM``, ``MoeLMHeadModel`` ``MixtralForCausalLM``.
    ``tokenizer_dir_or_obj``: a ``tokenizers.Tokenizer`` (saved as ``tokenizer.json``) or a folder
    whose tokenizer files are copied. Weights are written in the model's (float32) parameter
    dtype: one ``model.safetensors``, or shards plus ``model.safetensors.index.json`` when they
    exceed ``max_shard_bytes``, the layout ``from_pretrained`` expects.
    """
    family = family_of_model(model)
    if family is None:
        names = ", ".join(f.model_class.__name__ for f in supported_families())
        raise TypeError(f"No Hugging Face export for {type(model).__name__}; supported: {names}.")
    return write_checkpoint(family, model, out_dir, tokenizer_dir_or_obj=tokenizer_dir_or_obj, max_shard_bytes=max_shard_bytes)


def import_from_hf(path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False, dtype: Any = jnp.float32) -> Any:
    """Load a checkpoint folder (a local path or any URL) as our model of the family its ``config.json`` names.

    ``model_type`` ``llama`` (or none) gives a ``LlamaLMHeadModel``, ``mixtral`` a ``MoeLMHeadModel``.
    """
    model_type = read_hf_config(path).get("model_type") or LLAMA.model_type
    families = {f.model_type: f for f in supported_families()}
    if model_type not in families:
        raise HfFormatError(f"{os.fspath(path)} holds a {model_type!r} model; supported model_types: {', '.join(families)}.")
    return read_checkpoint(families[model_type], path, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing, dtype=dtype)
