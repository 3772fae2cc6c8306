"""``rootbench rejudge`` on real VMs: a recorded result is confirmed, a forged one is not (#49 item 10).

Two committed model runs (the 0.5B's fail of ssh-stopped, the 1.5B's pass of
site-config-renamed, both short) and a forgery: another of the 0.5B's failing runs with its verdict line rewritten
to ``pass``, as someone would to claim a result. Rejudging replays each run's
recorded replies on a fresh VM and judges the machine: the two genuine verdicts
are confirmed, the forged one is not, the command exits 1, and the record
names each cassette by its sha256 and says what was confirmed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
from conftest import Cli

from runner.app.rejudge import RECORD_NAME, read_record
from runner.core.paths import repo_root

LIVE = repo_root() / "recordings" / "live"


@pytest.mark.vm
def test_rejudge_confirms_recorded_verdicts_and_refuses_a_forged_one(cli: Cli, tmp_path: Path) -> None:
    shutil.copyfile(LIVE / "qwen2.5-coder-0.5b-json" / "ssh-stopped.r0.jsonl", tmp_path / "a-fail.jsonl")
    shutil.copyfile(LIVE / "qwen2.5-coder-1.5b-json" / "site-config-renamed.r0.h3.jsonl",
                    tmp_path / "b-pass.jsonl")
    lines = (LIVE / "qwen2.5-coder-0.5b-json" / "ssh-stopped.r0.h1.jsonl").read_text().splitlines()
    verdict = json.loads(lines[-1])
    assert verdict["verdict"] == "fail"
    verdict.update(verdict="pass", reason="all probes passed")
    (tmp_path / "c-forged.jsonl").write_text("\n".join([*lines[:-1], json.dumps(verdict)]) + "\n")
    record = tmp_path / "record.json"

    r = cli("rejudge", str(tmp_path), "--out", str(record), "--format", "json", timeout=2400)
    assert r.returncode == 1, r.stdout + r.stderr[-3000:]  # one verdict not confirmed
    rows = {Path(row["cassette"]).name: row for row in json.loads(r.stdout)}
    assert (rows["a-fail.jsonl"]["rejudged"], rows["a-fail.jsonl"]["confirmed"]) == ("fail", True)
    assert (rows["b-pass.jsonl"]["rejudged"], rows["b-pass.jsonl"]["confirmed"]) == ("pass", True)
    forged = rows["c-forged.jsonl"]
    assert (forged["recorded"], forged["rejudged"], forged["confirmed"]) == ("pass", "fail", False)
    assert "ssh" in forged["note"]  # the probe that failed, named

    doc = json.loads(record.read_text())
    assert read_record(record) == (2, 3) and doc["episodes"] == 3
    by_name = {Path(c["cassette"]).name: c for c in doc["cassettes"]}
    for name in rows:
        assert by_name[name]["sha256"] == hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
    assert not (tmp_path / RECORD_NAME).exists()  # --out said where
