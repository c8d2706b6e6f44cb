"""Text from a trained model: ``marin generate CHECKPOINT-OR-STEP --prompt "..."``.

CHECKPOINT-OR-STEP is a training step's output folder, the ``hf/`` folder inside it (any
Hugging Face Llama or Mixtral folder works), or a step name such as ``checkpoints/marin-nano-tinystories``,
looked up under the prefix the way ``marin explain`` does (the newest finished run wins). The model
is read from its Hugging Face export and the tokenizer from the same folder, where training saves
it; ``--tokenizer`` names another one. Folders and prefixes may be local or URLs (``s3://...``).
"""

from __future__ import annotations

import argparse
import os
import sys
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rigging import filesystem as fsx
from rigging.config.discovery import discover_config
from rigging.log import get_logger

from marin.errors import MarinError
from marin.execution.artifact import ArtifactError, load_artifact
from marin.execution.records.catalog import find_step_folders
from marin.execution.records.executor_files import STATUS_SUCCESS, read_status

logger = get_logger(__name__)

HF_FOLDER = "hf"  # where train_lm puts the Hugging Face export inside its output folder
MODEL_CONFIG = "config.json"

EXIT_OK = 0
EXIT_USAGE = 2


class ModelNotFoundError(MarinError, FileNotFoundError):
    """CHECKPOINT-OR-STEP names no folder with a model that can be loaded; the message says what to do."""


class TokenizerMismatchError(MarinError, ValueError):
    """The tokenizer has ids the model has no embedding for: it is not the one the model was trained with."""


@dataclass(frozen=True)
class ModelLocation:
    """Where the model to sample from lives: its HF folder, and the step output it came from (if any)."""

    hf_path: str
    step_output: str | None = None


def _has_model(folder: str) -> bool:
    return fsx.exists(fsx.join(folder, MODEL_CONFIG))


def _is_folder(location: str) -> bool:
    fs, path = fsx.filesystem(location)
    return fs.isdir(path)


def _export_of_step(output_path: str) -> str | None:
    """The HF folder of a finished step: ``<output>/hf``, else the artifact's ``hf_path``.

    The folder beside the step's own files comes first: a prefix copied elsewhere (a bucket synced
    to a laptop) keeps its recorded paths pointing at the old place.
    """
    try:
        result = load_artifact(output_path).result
    except ArtifactError:
        result = None
    recorded = result.get("hf_path") if isinstance(result, dict) else None
    for candidate in (fsx.join(output_path, HF_FOLDER), recorded):
        if candidate and _has_model(candidate):
            return candidate
    return None


def _no_model_message(folder: str) -> str:
    status = read_status(folder)
    if status is not None and status.status != STATUS_SUCCESS:
        return (
            f"{folder} holds no model yet: its step is {status.status}"
            + (f" ({status.error})" if status.error else "")
            + ". Run the training step to completion first (`marin status` shows each step's state)."
        )
    weights = sorted(name for name in (entry.rstrip("/").rsplit("/", 1)[-1] for entry in fsx.ls(folder))
                     if name.endswith(".safetensors"))
    if weights:
        return (
            f"{folder} holds weights ({', '.join(weights[:3])}{', ...' if len(weights) > 3 else ''}) but no {MODEL_CONFIG}: "
            "the export is incomplete or damaged. Export or copy the whole folder again."
        )
    if _is_folder(fsx.join(folder, "checkpoints")):
        return (
            f"{folder} has training checkpoints but no Hugging Face export ({HF_FOLDER}/{MODEL_CONFIG}); "
            "only Llama and MoE models are exported, and only when training finishes."
        )
    return (
        f"{folder} holds no model: neither {MODEL_CONFIG} nor {HF_FOLDER}/{MODEL_CONFIG} is in it. Pass the output "
        "folder of a train_lm step, its hf/ folder, or a step name (`marin status` lists them)."
    )


def locate_model(checkpoint_or_step: str, prefix: str | None = None) -> ModelLocation:
    """Resolve CHECKPOINT-OR-STEP (see the module docstring) to a loadable HF folder.

    Folders may be local paths or URLs (``s3://``, ``gs://``, ...). Raises
    :class:`ModelNotFoundError` with what to do when nothing loadable is found.
    """
    what = os.path.expanduser(checkpoint_or_step)
    if _is_folder(what):
        folder = fsx.absolute(what)
        if _has_model(folder):
            return ModelLocation(folder)
        export = _export_of_step(folder)
        if export is not None:
            return ModelLocation(export, step_output=folder)
        raise ModelNotFoundError(_no_model_message(folder))
    if fsx.exists(what):
        raise ModelNotFoundError(f"{what} is a file; pass the folder holding the model (its hf/ folder or the step's output folder).")
    if "://" in what:
        raise ModelNotFoundError(f"{what} does not exist. Pass the output folder of a train_lm step, its hf/ folder, "
                                 "or a step name (`marin status --prefix URL` lists them).")

    prefix = discover_config(prefix=prefix).prefix
    folders = find_step_folders(prefix, what.rstrip("/"))
    if not folders:
        raise ModelNotFoundError(
            f"{checkpoint_or_step!r} is neither a folder nor a step under the prefix {prefix}. "
            "`marin status` lists the steps there; pass --prefix if your outputs are elsewhere."
        )
    # Newest first; a run still in progress (or failed) may hold a half-written export, so only
    # finished runs are candidates when the user named a step rather than a folder.
    finished = [f for f in folders if (status := read_status(f)) is not None and status.status == STATUS_SUCCESS]
    for folder in finished:
        export = _export_of_step(folder)
        if export is not None:
            if len(folders) > 1:
                logger.info("%d runs of %s exist; using the newest finished one, %s (pass a folder to choose another)",
                            len(folders), what, folder)
            return ModelLocation(export, step_output=folder)
    raise ModelNotFoundError(_no_model_message(folders[0]))


def load_model_and_tokenizer(checkpoint_or_step: str, *, prefix: str | None = None,
                             tokenizer: str | None = None) -> tuple[Any, Any, ModelLocation]:
    """The model CHECKPOINT-OR-STEP names, its tokenizer (``tokenizer``, else the one saved beside
    it) and where it was found; :class:`ModelNotFoundError` or :class:`TokenizerMismatchError` if unusable."""
    # Imported here so that `marin status` and friends do not pay for JAX at start-up.
    from levanter.compat.hf_checkpoints import import_from_hf
    from levanter.tokenization import load_tokenizer
    from levanter.tokenization.loading import TokenizerNotFoundError

    location = locate_model(checkpoint_or_step, prefix)
    tokenizer_location = tokenizer or location.hf_path
    try:
        loaded_tokenizer = load_tokenizer(tokenizer_location)
    except TokenizerNotFoundError as exc:
        raise ModelNotFoundError(
            f"No tokenizer for the model in {location.hf_path}: {exc} Pass --tokenizer with the tokenizer it was trained with."
        ) from exc
    logger.info("Loading the model from %s", location.hf_path)
    model = import_from_hf(location.hf_path)
    if loaded_tokenizer.vocab_size > model.vocab_size:
        raise TokenizerMismatchError(
            f"The tokenizer at {tokenizer_location} has {loaded_tokenizer.vocab_size:,} tokens but the model only "
            f"{model.vocab_size:,}: it is not the tokenizer this model was trained with."
        )
    return model, loaded_tokenizer, location


def generate(
    checkpoint_or_step: str,
    prompts: Sequence[str],
    sampling: Any = None,
    *,
    prefix: str | None = None,
    tokenizer: str | None = None,
    chat: bool = False,
    chat_template: str | None = None,
) -> list[str]:
    """Each prompt followed by its sampled continuation, from the model CHECKPOINT-OR-STEP names.

    ``sampling`` is a :class:`levanter.inference.SamplingConfig` (default: its defaults).
    ``chat``: each prompt is a user's message; it is rendered with the chat template (the
    tokenizer's own, else ``chat_template``'s, else ChatML, as ``chat_dataset`` chose when the
    model was fine-tuned) with the assistant's turn opened, and the result is the reply alone, up
    to the template's end of turn.
    """
    from levanter.inference import SamplingConfig, generate_text

    model, loaded_tokenizer, _ = load_model_and_tokenizer(checkpoint_or_step, prefix=prefix, tokenizer=tokenizer)
    if not chat:
        return generate_text(model, loaded_tokenizer, list(prompts), sampling or SamplingConfig())
    from levanter.tokenization.chat import ChatRenderer, reply_end_marker, resolve_chat_template

    renderer = ChatRenderer.for_tokenizer(loaded_tokenizer, resolve_chat_template(loaded_tokenizer, chat_template))
    rendered = [renderer.render([{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
    # The rendered prompt is the text training saw before a reply: no BOS of ours goes before it.
    return generate_text(model, loaded_tokenizer, rendered, sampling or SamplingConfig(), add_bos=False,
                         stop_text=reply_end_marker(renderer) or None, include_prompt=False)


# -- the command ------------------------------------------------------------------------------------


def register(subparsers: argparse._SubParsersAction) -> None:
    # Defaults stay None here and come from SamplingConfig when the command runs: importing it
    # would load JAX for every `marin` command. The numbers in the help are SamplingConfig's
    # (a test keeps them in step).
    parser = subparsers.add_parser(
        "generate",
        help="sample text from a trained model (a train step's output folder, its hf/ folder, or a step name)",
        description=__doc__.split("\n\n", 1)[1],
    )
    parser.add_argument("model", metavar="CHECKPOINT-OR-STEP", help="a train step's output folder, its hf/ folder, or a step name")
    parser.add_argument("--prompt", action="append", required=True, help="text to continue (repeat for several prompts)")
    parser.add_argument("--max-new-tokens", type=int, metavar="N", help="at most N new tokens (default 128); generation also stops at end of text")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 is greedy (default 0.8)")
    parser.add_argument("--top-k", type=int, metavar="K", help="sample among the K likeliest tokens; 0 turns it off (default 50)")
    parser.add_argument("--top-p", type=float, metavar="P", help="nucleus sampling; 1 turns it off (default 0.95)")
    parser.add_argument("--seed", type=int, metavar="S", help="random seed; the same seed gives the same text (default 0)")
    parser.add_argument("--tokenizer", help="a tokenizer.json, folder or hub id (default: the one saved beside the model)")
    parser.add_argument("--chat", action="store_true",
                        help="each --prompt is a user's message to a chat fine-tuned model; prints the reply alone")
    parser.add_argument("--chat-template", metavar="NAME",
                        help="with --chat: the template the model was fine-tuned with when its tokenizer has none "
                             "(default: the tokenizer's own, else chatml)")
    parser.add_argument("--prefix", help="where to look up step names (default: the discovered prefix)")
    parser.set_defaults(handler=generate_command)


def sampling_from_args(args: argparse.Namespace) -> Any:
    """The SamplingConfig the options ask for (0 turns top-k off, 1 turns top-p off); ValueError if impossible."""
    from levanter.inference import SamplingConfig

    defaults = SamplingConfig()

    def given(name: str, default: Any) -> Any:
        value = getattr(args, name, None)
        return default if value is None else value

    max_new_tokens = given("max_new_tokens", defaults.max_new_tokens)
    temperature = given("temperature", defaults.temperature)
    top_k = given("top_k", defaults.top_k or 0)
    top_p = given("top_p", defaults.top_p or 1.0)
    if max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"--temperature must be 0 (greedy) or more, got {temperature}")
    if top_k < 0:
        raise ValueError(f"--top-k must be 0 (off) or more, got {top_k}")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    return SamplingConfig(
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k or None,
        top_p=None if top_p == 1 else top_p,
        seed=given("seed", defaults.seed),
    )


def _usage_error(message: str) -> int:
    print(f"marin generate: {message}", file=sys.stderr)
    return EXIT_USAGE


def generate_command(args: argparse.Namespace) -> int:
    # HfFormatError covers CorruptCheckpointError (a damaged file, named in the message).
    from levanter.compat.hf_checkpoints import HfFormatError
    from levanter.inference.sampling import NonFiniteLogitsError, SamplingError
    from levanter.tokenization.chat import ChatTemplateError
    from levanter.tokenization.loading import TokenizerFormatError, TokenizerNotFoundError

    try:
        sampling = sampling_from_args(args)
    except ValueError as exc:
        return _usage_error(str(exc))
    try:
        texts = generate(args.model, args.prompt, sampling, prefix=args.prefix, tokenizer=args.tokenizer,
                         chat=args.chat, chat_template=args.chat_template)
    except (ModelNotFoundError, TokenizerMismatchError, HfFormatError, TokenizerNotFoundError, TokenizerFormatError,
            SamplingError, NonFiniteLogitsError, ChatTemplateError, fsx.FilesystemUnavailableError) as exc:
        return _usage_error(str(exc))
    unreadable = False
    for i, text in enumerate(texts):
        if i:
            print()
        shown = readable(text)
        unreadable = unreadable or shown != text or REPLACEMENT in text
        print(shown, flush=True)
    if unreadable:
        print(f"marin generate: \\xNN marks a control byte and {REPLACEMENT} bytes that are not UTF-8 text: the model "
              "emitted raw byte tokens (a byte-level tokenizer's), as a model trained this little still does",
              file=sys.stderr)
    return EXIT_OK


REPLACEMENT = "\ufffd"  # what decoding puts where byte tokens do not form UTF-8 text


def readable(text: str) -> str:
    """``text`` with control characters other than newlines and tabs written as ``\\xNN``: a sampled
    byte token such as BEL or ESC would otherwise ring the terminal or garble what follows."""
    return "".join(f"\\x{ord(c):02x}" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c for c in text)


__all__ = ["ModelLocation", "ModelNotFoundError", "TokenizerMismatchError", "generate", "generate_command", "load_model_and_tokenizer",
           "locate_model", "readable", "register", "sampling_from_args"]
