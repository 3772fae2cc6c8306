"""The tests' folders are their kinds (tests/conftest.py): each test gets its folder's marker, and
a test under unit/ marked as needing a VM, a model, a browser or the wheel is refused."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def _pytest(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A process: pytest's collection of another tree, with this conftest, is what is tested.
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(root), *args, str(root / "tests")],
                          capture_output=True, text=True, timeout=120, cwd=root)


def _tree(tmp_path: Path, tests: dict[str, str]) -> Path:
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests")
    for name, body in tests.items():
        path = tmp_path / "tests" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("import pytest\n\n\n" + body)
    return tmp_path


def test_each_folder_marks_its_tests(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"unit/test_a.py": "def test_a() -> None:\n    pass\n",
                            "vm/test_b.py": "def test_b() -> None:\n    pass\n",
                            "model/test_c.py": "def test_c() -> None:\n    pass\n"})
    fast = _pytest(root, "-m", "not vm and not model", "--collect-only")
    assert fast.returncode == 0, fast.stdout + fast.stderr
    assert "test_a" in fast.stdout and "test_b" not in fast.stdout and "test_c" not in fast.stdout
    vm = _pytest(root, "-m", "vm", "--collect-only")
    assert "test_b" in vm.stdout and "test_a" not in vm.stdout


def test_a_unit_test_marked_as_needing_a_vm_is_refused(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"unit/test_a.py": "@pytest.mark.vm\ndef test_a() -> None:\n    pass\n"})
    r = _pytest(root, "--collect-only")
    assert r.returncode != 0
    assert "is in tests/unit but marked ['vm']: move it to the folder of its kind" in r.stdout + r.stderr
