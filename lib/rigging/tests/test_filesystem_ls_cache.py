"""``rigging.filesystem.ls(detail=True)`` leaves the filesystem's own listing cache as it was."""

from __future__ import annotations

from rigging import filesystem as fsx


def test_listing_with_detail_keeps_files_findable_on_s3(s3_prefix):
    folder = fsx.join(s3_prefix, "step")
    fsx.atomic_write(fsx.join(folder, "record.json"), "{}")
    fsx.ls(folder)  # fills s3fs's listing cache for the folder
    entries = fsx.ls(folder, detail=True)
    assert [entry["name"] for entry in entries] == [fsx.join(folder, "record.json")]
    assert fsx.exists(fsx.join(folder, "record.json"))  # answered from that cache
    assert fsx.ls(folder) == [fsx.join(folder, "record.json")]
