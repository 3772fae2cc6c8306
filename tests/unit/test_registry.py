"""One registry per extension point (issue #48 item 3): one refusal, and docs held to the code."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Cli

from runner.app.extensions import EXTENSION_POINTS
from runner.core.errors import InvalidInput
from runner.core.paths import repo_root
from runner.core.protocol import PROTOCOLS, get_protocol
from runner.core.registry import Registry

DOCS = repo_root() / "docs"


def test_every_extension_point_refuses_an_unknown_name_in_one_shape() -> None:
    for label, get in EXTENSION_POINTS.items():
        registry = get()
        assert isinstance(registry, Registry) and len(registry) > 0, label
        first = next(iter(registry))
        typo = first[:-1] + ("x" if first[-1] != "x" else "y")
        err = registry.unknown(typo)
        text = str(err)
        assert text.startswith(f"{registry.field}: unknown {registry.what} {typo!r}"), text
        assert f"did you mean {first!r}" in text and "known: " + ", ".join(registry.names()) in text
        assert registry.get_or_refuse(first) is registry[first]


def test_get_protocol_names_the_nearest_and_every_choice() -> None:
    with pytest.raises(InvalidInput) as caught:
        get_protocol("jsno")
    assert str(caught.value) == ("--protocol: unknown protocol 'jsno' (did you mean 'json'?); "
                                 "known: tools, json, text, auto")
    assert PROTOCOLS.names()[-1] == "auto" and "auto" not in PROTOCOLS


def test_an_unknown_model_is_refused_in_the_same_words_by_bench_and_by_model_fetch(
        cli: Cli, tmp_path: Path) -> None:
    fetch = cli("model", "fetch", "qwen2.5-coder-15b")
    bench = cli("bench", "--model", "qwen2.5-coder-15b", "--only", "ssh-stopped",
                "--runs-dir", str(tmp_path))
    for r in (fetch, bench):
        assert r.returncode == 2 and len(r.stderr.splitlines()) == 1, r.stderr
        assert "--model: unknown model 'qwen2.5-coder-15b' (did you mean 'qwen2.5-coder-1.5b'" \
            in r.stderr and "--model-file" in r.stderr
    assert fetch.stderr == bench.stderr


def test_the_docs_name_every_entry_of_every_extension_point() -> None:
    scenarios = (DOCS / "scenarios.md").read_text()
    cli_doc = (DOCS / "cli.md").read_text() + (DOCS / "running.md").read_text()
    for kind in EXTENSION_POINTS["probe kinds"]():
        assert f"`{kind}`" in scenarios or f"{kind}:" in scenarios, kind
    for label in ("protocols", "models", "executors"):
        for name in EXTENSION_POINTS[label]():
            assert name in cli_doc, (label, name)
