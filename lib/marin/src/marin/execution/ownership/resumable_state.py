"""What of an output a step stopped short in may be continued from: state declared resumable and verifiable.

Every execution of a step, and every attempt of one, starts from a clean staging folder
(:mod:`marin.execution.ownership.step_ownership`). What an earlier one left is not continued in: a file
half-written, a line appended after its last checkpoint, a FIFO, a link made by the first try
(which the retry would trip over) would all end up in the committed output, mixed with the new
execution's bytes. Only state that says itself it is whole and checkable is carried over:

* a folder its writer marked complete with the checksums of its files, which its reader verifies
  before using it (:data:`SELF_CHECKED_MARKERS`): a levanter checkpoint's step folder (its
  ``checksums.json``, written once the checkpoint is committed) and a token-cache shard (its
  ``shard.json``, written last);
* what the step's function declared resumable (:func:`declare_resumable`, ``ctx.declare_resumable``),
  state it reconciles itself when it resumes: the trainer's ``metrics.jsonl``, cut back to the
  checkpoint it resumes from.

Everything else stays behind, where nothing reads it, and is deleted once its writers are known
dead. State is carried over only from an execution known to be dead (see
:mod:`marin.execution.ownership.ending_executions`): a writer that still ran could change it after the check.
"""

from __future__ import annotations

import json
import posixpath

from rigging import filesystem as fsx
from zephyr.token_cache.layout import SHARD_SUMMARY_NAME

# Files that mark a folder of an output whose files carry checksums of their own, verified by their own
# reader: a levanter checkpoint's manifest (levanter.trainer.checkpoint_manifest.MANIFEST_NAME, named
# here rather than imported: the engine does not load JAX) and a token-cache shard's summary. The
# commit's manifest leaves them out (zephyr.output_checksums.write_checksums); a later execution may
# continue from them.
SELF_CHECKED_MARKERS = ("checksums.json", SHARD_SUMMARY_NAME)
# In a staging folder: the names the step's function declared resumable.
DECLARATION = ".resumable.json"


def declare_resumable(work_path: str, names: tuple[str, ...] | list[str]) -> None:
    """Record that the entries ``names`` (relative to the staging folder ``work_path``) are state the
    step continues from when it runs again after stopping short, and reconciles itself then."""
    for name in names:
        parts = name.strip("/").split("/")
        if not name or name.startswith("/") or any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"A resumable entry is a path inside the step's output, like 'metrics.jsonl'; got {name!r}.")
    declared = sorted(set(declared_names(work_path)) | {name.strip("/") for name in names})
    fsx.atomic_write(fsx.join(work_path, DECLARATION), json.dumps({"resumable": declared}))


def declared_names(work_path: str) -> list[str]:
    """The names the step declared resumable in ``work_path`` (none when it declared nothing)."""
    text = fsx.read_text(fsx.join(work_path, DECLARATION))
    try:
        names = json.loads(text)["resumable"] if text else []
    except (ValueError, KeyError, TypeError):
        return []  # torn or foreign: declares nothing
    return [name for name in names if isinstance(name, str) and name and ".." not in name.split("/")]


def resumable_entries(work_path: str, files: list[str] | None = None) -> list[str]:
    """The entries of the staging folder ``work_path`` a later attempt may continue from (relative
    paths, none inside another): the folders of :data:`SELF_CHECKED_MARKERS` and the declared names."""
    files = fsx.find_files(work_path) if files is None else files
    present = set(files)
    found = {posixpath.dirname(name) for name in files if posixpath.basename(name) in SELF_CHECKED_MARKERS}
    for name in declared_names(work_path):
        if name in present or any(f.startswith(name + "/") for f in files):
            found.add(name)
    if "" in found:  # the whole folder is one checkpoint or shard: all of it is the state
        return [""]
    return sorted(name for name in found if not any(name.startswith(other + "/") for other in found if other != name))


def carry_over(output_path: str, source: str, target: str) -> list[str]:
    """Move the resumable entries of ``<output_path>/<source>`` (a dead execution's staging folder) to
    the same places under ``<output_path>/<target>``, with the declaration; the entries moved."""
    source_url, target_url = fsx.join(output_path, source), fsx.join(output_path, target)
    files = fsx.find_files(source_url)
    entries = resumable_entries(source_url, files)
    moved = [entry for entry in entries if entry]
    if DECLARATION in files:
        entries = [*entries, DECLARATION]
    _move(source_url, target_url, entries, files)
    return moved or ([source] if entries == [""] else [])


def keep_only_resumable(work_path: str) -> list[str]:
    """Delete every file of the staging folder ``work_path`` that is no resumable state (what a
    failed attempt left before the execution's next attempt starts); the files deleted."""
    files = fsx.find_files(work_path)
    entries = resumable_entries(work_path, files)
    if entries == [""]:
        return []
    kept = tuple(entry + "/" for entry in entries)
    doomed = [name for name in files if name != DECLARATION and name not in entries and not name.startswith(kept)]
    fsx.remove_files(work_path, doomed)
    return doomed


def _move(source_url: str, target_url: str, entries: list[str], files: list[str]) -> None:
    """Move each entry (a file or folder, relative) from one folder to the other: a rename on local
    disk, a server-side copy and then the deletes on object stores."""
    fs, source_root = fsx.filesystem(source_url)
    _, target_root = fsx.filesystem(target_url)
    source_root, target_root = source_root.rstrip("/"), target_root.rstrip("/")
    if fsx.is_local(source_url):
        for entry in entries:
            source = f"{source_root}/{entry}".rstrip("/")
            target = f"{target_root}/{entry}".rstrip("/")
            if entry == "":  # the whole folder: its contents, one by one
                fs.makedirs(target, exist_ok=True)
                for name in fs.ls(source, detail=False):
                    fs.mv(name.rstrip("/"), f"{target}/{name.rstrip('/').rpartition('/')[2]}", recursive=True)
                continue
            fs.makedirs(posixpath.dirname(target), exist_ok=True)
            fs.mv(source, target, recursive=True)
        return
    names = [name for name in files if any(entry == "" or name == entry or name.startswith(entry + "/") for entry in entries)]
    if names:
        fs.copy([f"{source_root}/{name}" for name in names], [f"{target_root}/{name}" for name in names])
        fs.rm([f"{source_root}/{name}" for name in names])
