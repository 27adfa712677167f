"""astra_sglang.files.write_whole: the whole-file write bench's report, the exported patch plan, the profile's metadata
and the ceiling cache go through."""
from __future__ import annotations

import os
import threading

import pytest

from astra_sglang.files import write_whole


def test_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    p = tmp_path / "sub" / "report.json"
    assert write_whole(p, "one\n") == p and p.read_text() == "one\n"   # the folder is made
    write_whole(str(p), "two\n")
    assert p.read_text() == "two\n"
    assert [f.name for f in p.parent.iterdir()] == ["report.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path, monkeypatch):
    p = tmp_path / "plan.json"
    write_whole(p, "old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        write_whole(p, "new")
    assert p.read_text() == "old"
    assert [f.name for f in tmp_path.iterdir()] == ["plan.json"]


def test_concurrent_writers_never_share_a_temporary(tmp_path):
    p = tmp_path / "ceilings.json"
    texts = [f"writer {i}\n" * 2000 for i in range(8)]
    threads = [threading.Thread(target=write_whole, args=(p, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert p.read_text() in texts   # one writer's text, whole
    assert [f.name for f in tmp_path.iterdir()] == ["ceilings.json"]
