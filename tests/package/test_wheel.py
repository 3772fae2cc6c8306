"""The wheel: ``pip install .`` gives a ``rootbench`` that works from any folder.

The wheel is built (pip, the backend pyproject.toml names) from a copy of the
files it is made from, then installed without its dependencies into a fresh
venv that borrows the project venv's site-packages for them through a .pth
line (installing scipy and the rest again would take minutes). The installed
``rootbench`` then runs from an empty folder, where no checkout is on
``sys.path``: validate, list, an offline replay of a committed cassette,
report, and the user's own scenarios and image recipes through
``$ROOTBENCH_SPECS`` and ``$ROOTBENCH_IMAGES``.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from runner.core.paths import (
    IMAGES_ENV,
    SPECS_ENV,
    Bundled,
    bundled,
    default_spec_dirs,
    find_recipe,
    repo_root,
)

pytestmark = pytest.mark.wheel

ROOT = repo_root()
# What the wheel is built from (pyproject.toml maps schema/, images/ and specs/ into the package).
SOURCES = ("pyproject.toml", "README.md", "runner", "schema", "images", "specs")
CASSETTE = ROOT / "recordings" / "oracle" / "nginx-stopped.jsonl"


@dataclass(frozen=True)
class Install:
    wheel: Path
    venv: Path
    rootbench: Path  # the installed console script
    work: Path  # an empty folder: the working directory of every run

    def run(self, *args: str, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.rootbench), *args], cwd=self.work, env=env or clean_env(),
                              capture_output=True, text=True, timeout=timeout, check=False)


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would point Python or rootbench at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", SPECS_ENV, IMAGES_ENV)}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return {**env, **extra}


def _pip(*args: str, timeout: float) -> None:
    r = subprocess.run([sys.executable, "-m", "pip", *args], env=clean_env(), capture_output=True,
                       text=True, timeout=timeout, check=False)
    assert r.returncode == 0, f"pip {args[0]} failed:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Install:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:  # a copy: an in-tree build would leave build/ and stale files in ROOT
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "build"))
        else:
            shutil.copy2(ROOT / name, src / name)
    _pip("wheel", "--no-deps", "--no-input", "-q", "-w", str(tmp / "dist"), str(src), timeout=300)
    [wheel] = (tmp / "dist").glob("rootbench-*.whl")

    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    _pip("--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel),
         timeout=300)
    # The dependencies: the project venv's site-packages, after the fresh venv's own (so its
    # `runner` is the wheel's). A path listed in a .pth is not itself scanned for .pth files,
    # so the editable install's finder there stays out.
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "_rootbench_test_deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    work = tmp / "work"
    work.mkdir()
    return Install(wheel=wheel, venv=venv, rootbench=venv / "bin" / "rootbench", work=work)


def _names(folder: Path, pattern: str) -> set[str]:
    return {p.name for p in folder.glob(pattern)}


def test_the_wheel_carries_every_module_and_the_package_data(installed: Install) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "runner").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set()  # a new subpackage missing from pyproject's list shows here
    assert {"runner/py.typed", "runner/app/templates/report.html.j2"} <= names
    for kind, pattern in ((Bundled.SCHEMA, "*.json"), (Bundled.IMAGES, "*.yaml"),
                          (Bundled.SPECS, "*.yaml")):
        packed = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"runner/_data/{kind.value}/")}
        # specs/ also carries the measured tiers the default bench and `list` read
        extra = {"measured.json"} if kind is Bundled.SPECS else set()
        assert packed == _names(ROOT / kind.value, pattern) | extra, kind


def test_installed_rootbench_reads_its_bundled_specs_from_an_empty_folder(installed: Install) -> None:
    r = subprocess.run([str(installed.venv / "bin" / "python"), "-c",
                        "import runner; print(runner.__file__)"], cwd=installed.work,
                       env=clean_env(), capture_output=True, text=True, timeout=60, check=True)
    assert Path(r.stdout.strip()).is_relative_to(installed.venv), r.stdout  # not the checkout

    r = installed.run("validate")
    assert r.returncode == 0, r.stdout + r.stderr
    specs = _names(ROOT / "specs", "*.yaml")
    assert f"{len(specs)} valid, 0 invalid" in r.stdout
    ok = [line.split(":", 1)[0] for line in r.stdout.splitlines() if ": ok (" in line]
    assert {Path(p).name for p in ok} == specs
    assert all(Path(p).is_relative_to(installed.venv) for p in ok), ok  # the wheel's copies

    r = installed.run("list", "--format", "json")
    assert r.returncode == 0, r.stderr
    ids = {s["id"] for s in json.loads(r.stdout)}
    assert len(ids) == len(specs) and "nginx-stopped" in ids
    assert list(installed.work.iterdir()) == []  # nothing written where it ran


def test_installed_rootbench_replays_a_committed_cassette_offline(installed: Install) -> None:
    folder = installed.work / "cassettes"
    folder.mkdir()
    shutil.copy2(CASSETTE, folder)
    # the spec the cassette is checked against is the wheel's bundled one (the copy stands alone)
    r = installed.run("replay", "--offline", "--format", "json", "cassettes")
    assert r.returncode == 0, r.stdout + r.stderr
    [row] = json.loads(r.stdout)
    assert (row["scenario"], row["outcome"], row["replayed"]) == ("nginx-stopped", "same", "pass")


def test_installed_rootbench_reports_a_run_directory_and_a_cassette(installed: Install) -> None:
    run = installed.work / "runs" / "tiny"
    run.mkdir(parents=True)
    episode = {"agent": "oracle", "model": "oracle", "protocol": "json", "turns": 1}
    (run / "results.json").write_text(json.dumps({"episodes": [
        {**episode, "scenario": "nginx-stopped", "verdict": "pass", "seconds": 12.5},
        {**episode, "scenario": "disk-full", "verdict": "fail", "seconds": 20}]}))
    r = installed.run("report", "runs/tiny")  # read against the wheel's results schema
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nginx-stopped" in r.stdout and "2 runs: 1 pass, 1 fail" in r.stdout

    (run / "results.json").write_text(json.dumps({"episodes": [{**episode, "verdict": "pass"}]}))
    r = installed.run("report", "runs/tiny")
    assert r.returncode == 2 and "scenario" in r.stderr and "Traceback" not in r.stderr

    shutil.copy2(CASSETTE, installed.work / "one.jsonl")
    r = installed.run("report", "--html", "--out", "report.html", "one.jsonl")  # the wheel's template
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nginx-stopped" in (installed.work / "report.html").read_text()


def test_installed_rootbench_reads_the_users_specs_and_images_from_the_environment(
        installed: Install, tmp_path: Path) -> None:
    specs, images = tmp_path / "my-specs", tmp_path / "my-images"
    specs.mkdir()
    images.mkdir()
    recipe = (ROOT / "images" / "debian-12-nginx.yaml").read_text()
    (images / "my-image.yaml").write_text(recipe.replace("name: debian-12-nginx", "name: my-image"))
    spec = (ROOT / "specs" / "nginx-stopped.yaml").read_text()
    (specs / "mine.yaml").write_text(spec.replace("id: nginx-stopped", "id: my-scenario")
                                     .replace("image: debian-12-nginx", "image: my-image"))

    r = installed.run("list", "--format", "json",
                      env=clean_env(**{SPECS_ENV: str(specs), IMAGES_ENV: str(images)}))
    assert r.returncode == 0, r.stderr
    assert [s["id"] for s in json.loads(r.stdout)] == ["my-scenario"]  # the user's, not bundled

    r = installed.run("validate", env=clean_env(**{SPECS_ENV: str(specs)}))
    assert r.returncode == 2 and "no image recipe 'my-image'" in r.stdout

    for var in (SPECS_ENV, IMAGES_ENV):
        r = installed.run("validate", env=clean_env(**{var: str(tmp_path / "nowhere")}))
        assert r.returncode == 2, r.stdout + r.stderr
        assert r.stderr.strip().splitlines() == [
            f"rootbench: {tmp_path / 'nowhere'}: {var}: no such directory"]


def test_a_checkout_reads_its_own_top_level_folders() -> None:
    """Editable installs and `python -m runner` read the checkout in place, as before the wheel."""
    assert not (ROOT / "runner" / "_data").exists()
    for kind in Bundled:
        assert bundled(kind) == ROOT / kind.value


def test_the_users_recipe_wins_over_the_bundled_one_of_the_same_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.backends.images import load_recipe

    bundled_recipe = load_recipe("debian-12-nginx")
    text = (ROOT / "images" / "debian-12-nginx.yaml").read_text()
    assert "\nmemory_mib: 256\n" in text
    (tmp_path / "debian-12-nginx.yaml").write_text(text.replace("memory_mib: 256", "memory_mib: 384"))
    monkeypatch.setenv(IMAGES_ENV, str(tmp_path))
    mine = load_recipe("debian-12-nginx")
    assert mine.path == tmp_path / "debian-12-nginx.yaml" and mine.memory_mib == 384
    assert mine.key != bundled_recipe.key  # its own cache entry, never the bundled image's
    assert find_recipe("../specs/nginx-stopped") is None  # a spec's image never names a path


def test_rootbench_specs_lists_folders_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv(SPECS_ENV, f"{a}{os.pathsep}{os.pathsep}{b}")
    assert default_spec_dirs() == [a, b]
    monkeypatch.setenv(SPECS_ENV, "")
    assert default_spec_dirs() == [ROOT / "specs"]
