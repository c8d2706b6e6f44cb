"""How one of our decoder model classes maps to its Hugging Face counterpart: an :class:`HfFamily`.

A family names the classes on both sides, how each weight of a decoder layer becomes HF tensors
and back (:class:`LayerWeight`), and how our config becomes ``config.json`` and back. Given one,
:func:`write_checkpoint` and :func:`read_checkpoint` convert a whole model; the files themselves
are :mod:`levanter.compat.hf_format`'s business. The attention, norm, embedding and head weights
and the ``config.json`` fields they imply are the same for every family here, so they are
defined once below.

Our weights differ from the Hugging Face ones only by layout: HF stores ``nn.Linear`` weights as
``[out, in]`` with heads flattened, we store ``[in, out]`` with heads as their own dimension. Both
use the "rotate halves" RoPE layout, so no permutation of query/key rows is needed. (Gemma's norms
are the exception: HF stores ``w`` and multiplies by ``1 + w``; a family's ``norm_offset`` says so.)

A ``config.json`` value that would change the logits and that our models cannot express is refused
with an :class:`UnsupportedConfigError` naming the field and its value, never silently dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Callable, Iterator

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from haliax import Stacked
from haliax.nn import RopeScaling
from levanter.compat.hf_format import (
    CONFIG_FILE,
    DEFAULT_MAX_SHARD_BYTES,
    CorruptCheckpointError,
    HfFormatError,
    create_folder,
    read_model_config,
    read_tensors,
    write_json,
    write_weights,
)
from levanter.compat.hf_tokenizer_files import write_tokenizer_files
from levanter.models.transformer import LAYER_TYPES
from rigging import filesystem as fsx

# One logger for the Hugging Face checkpoint modules: their lines name the public module.
logger = logging.getLogger("levanter.compat.hf_checkpoints")


class UnsupportedConfigError(HfFormatError):
    """A ``config.json`` field (or a config of ours) whose value the other side cannot express."""


def unsupported(field: str, value: Any, why: str) -> UnsupportedConfigError:
    """The error for ``config.json``'s ``field`` holding ``value``; ``why`` completes the sentence."""
    return UnsupportedConfigError(f"config.json {field}={value!r} is not supported: {why}.")

def layer_types_from_hf(hf: dict, period: int) -> tuple[str, ...]:
    """A config's ``layer_types`` (one of ``LAYER_TYPES`` per layer), or, where it has none, every
    ``period``-th layer full and the rest sliding (transformers' default for Gemma 2/3 and OLMo 3)."""
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types") or ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(layers)]
    if not isinstance(kinds, list) or len(kinds) != layers or any(k not in LAYER_TYPES for k in kinds):
        raise unsupported("layer_types", kinds, f"it must name one of {LAYER_TYPES} for each of the {layers} layers")
    return tuple(kinds)



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


def norm_weight(ours: str, theirs: str, offset: float = 0.0) -> LayerWeight:
    """An RMSNorm scale; HF stores ``scale - offset`` (Gemma's norms multiply by ``1 + w``: offset 1)."""
    if not offset:
        return renamed(ours, theirs)
    # Added in float32, as the reference implementation does, also when the file holds bfloat16.
    return renamed(ours, theirs, lambda w: w - offset, lambda t: t.astype(np.float32) + offset)


def attention_bias_weights(config: Any) -> list[LayerWeight]:
    """Biases of the q/k/v projections: ours ``[heads, d]`` <-> theirs ``[heads * d]``."""
    d = config.head_dim
    return [
        renamed(f"attention.{p}_bias.weight", f"self_attn.{p}_proj.bias", lambda w: w.reshape(-1), lambda t, n=n: t.reshape(n, d))
        for p, n in (("q", config.num_heads), ("k", config.num_kv_heads), ("v", config.num_kv_heads))
    ]


def layer_norm_weights(config: Any, norm_offset: float = 0.0) -> list[LayerWeight]:
    """A decoder layer's RMSNorms by where they sit (``norm_placement``; MoE layers: inputs only).

    transformers' names follow the position: ``post_attention_layernorm`` is the MLP's input norm
    in Llama but the attention output's norm when outputs are normed (OLMo 2, Gemma 2), where the
    MLP's output norm is ``post_feedforward_layernorm`` and its input norm ``pre_feedforward_layernorm``.
    """
    placement = getattr(config, "norm_placement", "pre")
    if placement == "pre":
        return [
            norm_weight("input_norm.weight", "input_layernorm.weight", norm_offset),
            norm_weight("post_attention_norm.weight", "post_attention_layernorm.weight", norm_offset),
        ]
    outputs = [
        norm_weight("attention_output_norm.weight", "post_attention_layernorm.weight", norm_offset),
        norm_weight("mlp_output_norm.weight", "post_feedforward_layernorm.weight", norm_offset),
    ]
    if placement == "post":
        return outputs
    return [
        norm_weight("input_norm.weight", "input_layernorm.weight", norm_offset),
        norm_weight("post_attention_norm.weight", "pre_feedforward_layernorm.weight", norm_offset),
        *outputs,
    ]


def attention_weights(config: Any, norm_offset: float = 0.0) -> list[LayerWeight]:
    """The norms and attention weights every decoder layer of ours has (Llama and MoE alike)."""
    h, d = config.hidden_dim, config.head_dim

    def heads_in(ours: str, theirs: str, num_heads: int) -> LayerWeight:  # ours [h, heads, d] <-> theirs [heads * d, h]
        return renamed(ours, theirs, lambda w: w.reshape(h, num_heads * d).T, lambda t: t.T.reshape(h, num_heads, d))

    return [
        *layer_norm_weights(config, norm_offset),
        heads_in("attention.q_proj.weight", "self_attn.q_proj.weight", config.num_heads),
        heads_in("attention.k_proj.weight", "self_attn.k_proj.weight", config.num_kv_heads),
        heads_in("attention.v_proj.weight", "self_attn.v_proj.weight", config.num_kv_heads),
        # ours [heads, d, h] <-> theirs [h, heads * d]
        renamed("attention.o_proj.weight", "self_attn.o_proj.weight",
                lambda w: w.reshape(-1, h).T, lambda t: t.T.reshape(config.num_heads, d, h)),
    ]


# -- config.json fields every family shares -------------------------------------------------------

# transformers' names for the MLP activations we have (levanter.models.transformer.ACTIVATIONS).
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}
ACTIVATION_TO_HF = {"silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh"}


def rope_parameters(config: Any) -> dict:
    """transformers' ``rope_parameters`` for our ``rope_theta`` and ``rope_scaling``."""
    scaling: RopeScaling | None = config.rope_scaling
    if scaling is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    params = {"rope_type": scaling.rope_type, "rope_theta": config.rope_theta, "factor": scaling.factor}
    if scaling.rope_type == "llama3":
        params.update(
            low_freq_factor=scaling.low_freq_factor,
            high_freq_factor=scaling.high_freq_factor,
            original_max_position_embeddings=scaling.original_max_position_embeddings,
        )
    return params


def decoder_config_dict(config: Any, vocab_size: int, dtype: Any) -> dict:
    """The ``config.json`` fields of the attention/embedding part, common to Llama and Mixtral."""
    rope = rope_parameters(config)
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
        "rope_parameters": rope,
        # transformers 4 reads the scaling from here (5 from rope_parameters).
        **({"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"}} if config.rope_scaling else {}),
        "tie_word_embeddings": config.tie_word_embeddings,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "initializer_range": config.initializer_range,
        "torch_dtype": jnp.dtype(dtype).name,
    }


def shape_fields_from_hf(hf: dict, *, tie_default: bool = False) -> dict:
    """Our config's shape fields (sizes, norm epsilon, tying) from a ``config.json`` dict."""
    num_heads = hf["num_attention_heads"]
    return dict(
        hidden_dim=hf["hidden_size"],
        intermediate_dim=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=num_heads,
        num_kv_heads=hf.get("num_key_value_heads") or num_heads,
        max_seq_len=hf.get("max_position_embeddings", 2048),
        norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", tie_default)),
        initializer_range=float(hf.get("initializer_range", 0.02)),
    )


def rope_from_hf(hf: dict, *, default_theta: float = 10000.0) -> tuple[float, RopeScaling | None]:
    """``rope_theta`` and the RoPE scaling from ``rope_parameters`` (transformers 5) or
    ``rope_scaling`` + ``rope_theta`` (transformers 4); refuses rules we do not implement."""
    field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = hf.get(field) or {}
    if not isinstance(rope, dict) or (rope and not {"rope_type", "type", "rope_theta"} & rope.keys()):
        # e.g. one entry per attention kind ({"full_attention": {...}, "sliding_attention": {...}})
        raise unsupported(field, rope, "only one RoPE for all layers, as an object with rope_type, can be expressed")
    theta = float(rope.get("rope_theta", hf.get("rope_theta", default_theta)))
    partial = rope.get("partial_rotary_factor") or hf.get("partial_rotary_factor") or 1.0
    if partial != 1.0:
        raise unsupported("partial_rotary_factor", partial, "our RoPE rotates every dimension of each head (1.0)")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type not in ("linear", "llama3"):
        raise unsupported(f"{field}.rope_type", rope_type, "the RoPE types we implement are 'default', 'linear' and 'llama3'")
    needed = ("factor", "low_freq_factor", "high_freq_factor") if rope_type == "llama3" else ("factor",)
    missing = [name for name in needed if rope.get(name) is None]
    if missing:
        raise unsupported(f"{field}.rope_type", rope_type, f"{field} lacks {', '.join(missing)}, which this type needs")
    extra = {}
    if rope_type == "llama3":
        extra = dict(
            low_freq_factor=float(rope["low_freq_factor"]),
            high_freq_factor=float(rope["high_freq_factor"]),
            # transformers falls back to max_position_embeddings when this is absent.
            original_max_position_embeddings=int(rope.get("original_max_position_embeddings") or hf["max_position_embeddings"]),
        )
    try:
        return theta, RopeScaling(rope_type, float(rope["factor"]), **extra)
    except ValueError as e:
        raise unsupported(field, rope, str(e).rstrip(".")) from None


def head_dim_from_hf(hf: dict) -> int | None:
    """``head_dim`` when it differs from ``hidden_size / num_attention_heads``, else None."""
    head_dim = hf.get("head_dim")
    num_heads = hf["num_attention_heads"]
    if head_dim is None or head_dim * num_heads == hf["hidden_size"]:
        return None
    return int(head_dim)


def activation_from_hf(hf: dict, field: str = "hidden_act", default: str = "silu") -> str:
    """Our name for the MLP activation ``config.json`` names in ``field``."""
    name = hf.get(field) or default
    if name not in HF_ACTIVATIONS:
        raise unsupported(field, name, f"the MLP activations we implement are {sorted(HF_ACTIVATIONS)}")
    return HF_ACTIVATIONS[name]


def decoder_fields_from_hf(hf: dict, *, default_rope_theta: float = 10000.0) -> dict:
    """The fields of a plain decoder config (Mixtral's: no head size of its own, plain RoPE, SiLU,
    no biases) from a ``config.json`` dict; refuses what would change the logits."""
    theta, scaling = rope_from_hf(hf, default_theta=default_rope_theta)
    if scaling is not None:
        field = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
        raise unsupported(f"{field}.rope_type", scaling.rope_type, f"{hf.get('model_type')} checkpoints are read with plain RoPE only")
    for field in ("attention_bias", "mlp_bias"):
        if hf.get(field):
            raise unsupported(field, hf[field], f"{hf.get('model_type')} checkpoints are read without biases")
    if head_dim_from_hf(hf) is not None:
        raise unsupported("head_dim", hf["head_dim"], "it must equal hidden_size / num_attention_heads for this model type")
    if activation_from_hf(hf) != "silu":
        raise unsupported("hidden_act", hf["hidden_act"], "this model type is read with SiLU (SwiGLU) experts only")
    return dict(**shape_fields_from_hf(hf), rope_theta=theta)


# -- a family: one of our model classes and its Hugging Face counterpart ----------------------------


def _no_renaming(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return tensors


def _writes_any(config: Any) -> str | None:
    return None


@dataclass(frozen=True)
class HfFamily:
    """What it takes to write and read one model class as a Hugging Face checkpoint.

    Several families may share a model class (Llama, Mistral, Qwen and Gemma are all our Llama);
    ``cannot_write`` says which configs a family's ``config.json`` can express, and export picks
    the first family of :data:`~levanter.compat.hf_registry.FAMILIES` that can.
    """

    model_type: str  # config.json's model_type
    model_class: type
    layer_class: type
    layer_weights: Callable[[Any], list[LayerWeight]]
    config_to_hf: Callable[[Any, int, Any], dict]
    config_from_hf: Callable[[dict], tuple[Any, int]]
    # Maps other spellings of the same weights (e.g. fused expert tensors) to the names layer_weights reads.
    canonical_names: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = _no_renaming
    # Why this family's checkpoints cannot hold a config of ours, or None when they can.
    cannot_write: Callable[[Any], str | None] = _writes_any
    # HF stores every RMSNorm scale minus this (Gemma: 1.0); see norm_weight.
    norm_offset: float = 0.0
    # Where layer i's tensors are: "{layer_prefix}.{i}.<name>" (GPT-2: transformer.h).
    layer_prefix: str = "model.layers"
    # The weights outside the layers, paths relative to the model; None: the embedding and the
    # final RMSNorm under Llama's names. (The untied output projection is lm_head.weight for all.)
    outer_weights: Callable[[Any], list[LayerWeight]] | None = None
    # One layer's tensors as the checkpoint stores them, from the names layer_weights writes: the
    # inverse of canonical_names, for formats that fuse several of our weights into one tensor.
    stored_layer_tensors: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] = _no_renaming
    # config.json with the shape fields under the names most families use (hidden_size, ...), for
    # a format that spells them its own way (GPT-2: n_embd, n_layer, n_head, n_inner).
    standard_config_names: Callable[[dict], dict] | None = None

    def model_weights(self, config: Any) -> list[LayerWeight]:
        if self.outer_weights is not None:
            return self.outer_weights(config)
        return [renamed("embed.weight", "model.embed_tokens.weight"),
                norm_weight("final_norm.weight", "model.norm.weight", self.norm_offset)]


def _layers_of(model: Any) -> list[Any]:
    return model.layers.unstack() if isinstance(model.layers, Stacked) else list(model.layers)


def iter_family_tensors(family: HfFamily, model: Any) -> Iterator[tuple[str, np.ndarray]]:
    """Every weight under its HF state-dict name, one at a time (host numpy)."""
    weights = family.layer_weights(model.config)
    for weight in family.model_weights(model.config):
        for name, tensor in weight.to_hf(np.asarray(attrgetter(weight.ours)(model))):
            yield name, np.ascontiguousarray(tensor)
    for i, layer in enumerate(_layers_of(model)):
        tensors = {suffix: tensor for weight in weights for suffix, tensor in weight.to_hf(np.asarray(attrgetter(weight.ours)(layer)))}
        for suffix, tensor in family.stored_layer_tensors(tensors).items():
            yield f"{family.layer_prefix}.{i}.{suffix}", np.ascontiguousarray(tensor)
    if model.lm_head is not None:
        yield "lm_head.weight", np.ascontiguousarray(np.asarray(model.lm_head.weight).T)


# -- whole models -----------------------------------------------------------------------------------


def write_checkpoint(family: HfFamily, model: Any, out_dir: str | os.PathLike, *, tokenizer_dir_or_obj: Any = None,
                     max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> str:
    """Write ``model`` as ``family``'s checkpoint folder (see ``export_to_hf``); returns the folder."""
    if not isinstance(model, family.model_class):
        raise TypeError(f"A {family.model_type} checkpoint needs a {family.model_class.__name__}, got {type(model).__name__}.")
    why_not = family.cannot_write(model.config)
    if why_not is not None:
        raise UnsupportedConfigError(
            f"A {family.model_type} checkpoint cannot express this model's config: {why_not}. "
            "export_to_hf picks a family that can."
        )
    dtype = model.embed.weight.dtype
    if dtype == jnp.bfloat16:
        raise HfFormatError("Export float32 parameters (safetensors.numpy cannot write bfloat16); cast with jax.tree.map first.")
    out_dir = os.fspath(out_dir)
    create_folder(out_dir)
    total, files = write_weights(iter_family_tensors(family, model), out_dir, max_shard_bytes)
    special_ids = {} if tokenizer_dir_or_obj is None else write_tokenizer_files(tokenizer_dir_or_obj, out_dir, max_length=model.config.max_seq_len)
    write_json(fsx.join(out_dir, CONFIG_FILE), {**family.config_to_hf(model.config, model.vocab_size, dtype), **special_ids})
    logger.info("Exported %d parameters (%.1f MB) in %d file(s) to %s", model.config.num_parameters(model.vocab_size), total / 1e6, files, out_dir)
    return out_dir


def read_checkpoint(family: HfFamily, path: str | os.PathLike, *, use_scan: bool = False, gradient_checkpointing: bool = False,
                    dtype: Any = jnp.float32) -> Any:
    """Load a checkpoint folder of ``family`` (config.json + safetensors; a local path or any URL) as our model."""
    path = os.fspath(path)
    config, vocab_size = _config_of_family(family, path)
    config = dataclasses.replace(config, use_scan=use_scan, gradient_checkpointing=gradient_checkpointing)
    tensors = family.canonical_names(read_tensors(path))
    _refuse_counts_the_tensors_contradict(family, config, tensors, path)

    def take(name: str) -> np.ndarray:
        if name not in tensors:
            raise HfFormatError(f"Checkpoint in {path} lacks tensor {name!r}.")
        return tensors.pop(name)

    def as_array(x: np.ndarray) -> jax.Array:
        return jnp.asarray(x, dtype=dtype)

    # Shapes only: no random initialisation of weights we are about to overwrite.
    skeleton = eqx.filter_eval_shape(lambda: family.model_class(config, vocab_size, key=jax.random.PRNGKey(0)))
    layer_skeleton = eqx.filter_eval_shape(lambda: family.layer_class(config, key=jax.random.PRNGKey(0)))
    # Unrolled layers may differ in static options (each its own attention window): fill each one's own.
    layer_skeletons = skeleton.layers if isinstance(skeleton.layers, tuple) else [layer_skeleton] * config.num_layers
    weights = family.layer_weights(config)
    try:
        layers = []
        for i in range(config.num_layers):
            prefix = f"{family.layer_prefix}.{i}."
            values = [as_array(w.from_hf(lambda suffix: take(prefix + suffix))) for w in weights]
            layers.append(eqx.tree_at(lambda l: [attrgetter(w.ours)(l) for w in weights], layer_skeletons[i], values))
        if use_scan:
            stacked_layers: Any = Stacked(jax.tree.map(lambda *xs: jnp.stack(xs), *layers), config.num_layers)
        else:
            stacked_layers = tuple(layers)

        outer = family.model_weights(config)
        model = eqx.tree_at(lambda m: [attrgetter(w.ours)(m) for w in outer], skeleton, [as_array(w.from_hf(take)) for w in outer])
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


def _refuse_counts_the_tensors_contradict(family: HfFamily, config: Any, tensors: dict[str, np.ndarray], path: str) -> None:
    """Refuse, naming both, a config.json whose layer or expert count the tensors contradict.

    Checked before any weight is read: a count the tensors do not hold would otherwise fail on the
    first tensor missing (after reading a billion names of experts that are not there), or, where
    config.json spells the count twice (``num_experts`` and ``num_local_experts``), load whichever
    one is read without a word about the other.
    """
    layers: dict[int, str] = {}  # index -> a tensor of it, to name
    experts: dict[int, str] = {}
    pattern = re.compile(rf"^{re.escape(family.layer_prefix)}\.(\d+)\.(?:.*\.experts\.(\d+)\.)?")
    for name in sorted(tensors):
        match = pattern.match(name)
        if match:
            layers.setdefault(int(match.group(1)), name)
            if match.group(2) is not None:
                experts.setdefault(int(match.group(2)), name)
    problem = None
    if layers and len(layers) != config.num_layers:
        problem = f"{config.num_layers} layers, but the tensors in {path} hold {_counted(layers, 'layers')}"
    elif experts and getattr(config, "num_experts", None) not in (None, len(experts)):
        problem = f"{config.num_experts} experts per layer, but the tensors in {path} hold {_counted(experts, 'experts')}"
    if problem:
        raise CorruptCheckpointError(f"{fsx.join(path, CONFIG_FILE)} describes {problem}: the config and the weights "
                                     "contradict each other (one of them belongs to another model).")


def _counted(found: dict[int, str], what: str) -> str:
    last = max(found)
    return f"{len(found)} ({what} {min(found)} to {last}; the last: {found[last]})"


def _config_of_family(family: HfFamily, path: str) -> tuple[Any, int]:
    """Our config from the folder's ``config.json``; a missing or ill-typed field names the file."""
    hf = read_model_config(path, family.standard_config_names)
    try:
        return family.config_from_hf(hf)
    except HfFormatError:
        raise
    except (KeyError, TypeError, ValueError) as e:  # a family-specific field missing or of the wrong kind
        raise CorruptCheckpointError(
            f"{fsx.join(path, CONFIG_FILE)} does not describe a valid {family.model_type} model ({type(e).__name__}: {e})."
        ) from e


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
