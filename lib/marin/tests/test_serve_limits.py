"""``marin serve`` stays inside its prefix and reads bounded amounts, whatever the prefix holds."""

from __future__ import annotations

import json
import os
import tracemalloc

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient
from marin.serve import data as data_module
from marin.serve.app import create_app
from marin.serve.data import read_page


@pytest.fixture
def prefix(tmp_path):
    root = tmp_path / "prefix"
    (root / "inside").mkdir(parents=True)
    (root / "inside" / "notes.txt").write_text("kept inside\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("the secret outside the prefix\n")
    return root, outside


def test_symlinks_that_leave_the_prefix_are_refused(prefix):
    root, outside = prefix
    os.symlink(outside, root / "link")  # a folder link, as `ln -s /etc PREFIX/link`
    os.symlink(outside / "secret.txt", root / "inside" / "leak.txt")  # a file link
    os.symlink(root / "inside" / "notes.txt", root / "alias.txt")  # a link that stays inside
    client = TestClient(create_app(str(root)), raise_server_exceptions=False)
    for path in ("link/secret.txt", "link", "inside/leak.txt"):
        for route in ("/api/data", "/data", "/api/step", "/step"):
            response = client.get(route, params={"path": path})
            assert response.status_code == 400, (route, path, response.status_code)
            assert "secret" not in response.text.replace("secret.txt", "")
    served = client.get("/api/data", params={"path": "alias.txt"})
    assert served.status_code == 200 and served.json()["rows"] == ["kept inside\n"]


def test_step_folders_reached_through_a_link_out_of_the_prefix_are_not_listed(prefix):
    root, outside = prefix
    for parent in (root / "mine", outside / "theirs"):
        (parent / "step-0123abcd").mkdir(parents=True)
        (parent / "step-0123abcd" / ".executor_status").write_text(json.dumps({"status": "SUCCESS", "time": 1.0e9}))
    os.symlink(outside / "theirs", root / "linked")
    # The walk (marin.execution.records.catalog) descends only into real folders: fsspec lists a link as "other".
    client = TestClient(create_app(str(root)), raise_server_exceptions=False)
    assert [row["path"] for row in client.get("/api/steps").json()["steps"]] == ["mine/step-0123abcd"]


def test_a_record_longer_than_the_limit_is_shown_cut_with_its_size(tmp_path):
    huge = json.dumps({"text": "x" * (3 << 20)})
    path = tmp_path / "rows.jsonl"
    path.write_text(huge + "\n" + json.dumps({"id": 1}) + "\n")
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    response = client.get("/api/data", params={"path": "rows.jsonl", "count": 2})
    first, second = response.json()["rows"]
    assert first["(record cut)"] == huge[: data_module.MAX_RECORD_BYTES]
    assert first["bytes"] == len(huge)
    assert second == {"id": 1}
    assert len(response.content) < 2 * data_module.MAX_RECORD_BYTES
    page = client.get("/data", params={"path": "rows.jsonl"}).text
    assert f"(cut: {len(huge):,} bytes)" in page and len(page) < 2 * data_module.MAX_RECORD_BYTES


def test_paging_a_one_line_file_holds_only_the_shown_bytes_in_memory(tmp_path):
    size = 16 << 20
    path = tmp_path / "one-line.jsonl"
    with open(path, "w") as handle:
        handle.write('{"text": "' + "y" * size + '"}\n')
    tracemalloc.start()
    try:
        page = read_page(str(path), 0, 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert page.rows[0]["bytes"] == size + len('{"text": ""}')
    # The shown prefix plus one read buffer, far below the 16 MiB line (read whole it would be >= 16 MiB).
    assert peak < 4 * data_module.MAX_RECORD_BYTES + 2 * data_module.READ_CHUNK_BYTES


def test_count_is_capped_and_a_page_holds_at_most_the_page_budget(tmp_path):
    row_text = "z" * 10_000
    with open(tmp_path / "rows.jsonl", "w") as handle:
        handle.writelines(json.dumps({"id": i, "text": row_text}) + "\n" for i in range(400))
    client = TestClient(create_app(str(tmp_path)), raise_server_exceptions=False)
    page = client.get("/api/data", params={"path": "rows.jsonl", "count": 100000}).json()
    assert 0 < len(page["rows"]) <= data_module.MAX_PAGE and page["has_more"]
    assert sum(len(json.dumps(row)) for row in page["rows"]) <= data_module.MAX_PAGE_BYTES + 10_100
    assert [row["id"] for row in page["rows"]] == list(range(len(page["rows"])))
    following = client.get("/api/data", params={"path": "rows.jsonl", "start": len(page["rows"]), "count": 5}).json()
    assert [row["id"] for row in following["rows"]] == list(range(len(page["rows"]), len(page["rows"]) + 5))


def test_skipping_to_a_far_page_stops_at_the_scan_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "MAX_SCAN_BYTES", 64 * 1024)
    with open(tmp_path / "rows.jsonl", "w") as handle:
        handle.writelines(json.dumps({"id": i, "pad": "p" * 1000}) + "\n" for i in range(1000))
    page = read_page(str(tmp_path / "rows.jsonl"), 900, 10)
    assert page.rows == [] and not page.has_more
    assert "stopped after reading 64 KiB" in page.note and "not row 900" in page.note


def test_a_parquet_row_longer_than_the_limit_is_shown_cut(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    long_text = "w" * (2 * data_module.MAX_RECORD_BYTES)
    pq.write_table(pa.table({"id": [0, 1], "text": [long_text, "short"]}), tmp_path / "rows.parquet")
    page = read_page(str(tmp_path / "rows.parquet"), 0, 5)
    first, second = page.rows
    assert first["bytes"] == len(json.dumps({"id": 0, "text": long_text}))
    assert len(first["(record cut)"]) == data_module.MAX_RECORD_BYTES
    assert second == {"id": 1, "text": "short"} and page.total == 2 and not page.has_more
