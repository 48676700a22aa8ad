"""The wheel a user installs: built from the tracked files, it holds the package with its
``py.typed`` marker (PEP 561: our annotations reach users' type checkers), the native module,
and the ``trio-ha`` entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_wheel_ships_py_typed_the_native_module_and_the_command(tmp_path):
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                             check=True).stdout.decode().split("\0")
    source = tmp_path / "source"
    for name in filter(None, tracked):
        if (ROOT / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
         str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("trio_ha-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith("entry_points.txt"))
        assert "trio-ha = trio_ha.cli:main" in archive.read(entry_points).decode()
    assert "trio_ha/py.typed" in names
    assert any(n.startswith("trio_ha/_native") and n.endswith(".so") for n in names), names
    assert "trio_ha/cli/__main__.py" in names
    assert {f"trio_ha/store/offline/{module}.py"
            for module in ("__init__", "_directory", "verify", "inspect", "truncate")} <= names, sorted(n for n in names if "/offline" in n)
