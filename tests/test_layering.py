"""The import contracts of pyproject.toml (`[tool.importlinter]`): one direction of dependencies.

`lint-imports` runs on a copy of the installed layout (``passes/`` lives at the top of the
repository and installs as ``tcmlir.passes``; an editable install leaves it outside
``src/tcmlir``, where import-linter would not see it), so the contracts cover every module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _installed_layout(tmp_path: Path) -> Path:
    if not _has_importlinter():
        pytest.skip("import-linter is not installed (pip install -e .[test] installs it)")
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "src" / "tcmlir", tree / "tcmlir", ignore=ignore)
    shutil.copytree(ROOT / "passes", tree / "tcmlir" / "passes", ignore=ignore)
    return tree


def _lint_imports(tmp_path: Path, plant: str | None = None) -> subprocess.CompletedProcess[str]:
    tree = _installed_layout(tmp_path)
    if plant is not None:
        module, text = plant.split(":", 1)
        (tree / Path(*module.split(".")).with_suffix(".py")).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    code = ("import sys; from importlinter.cli import lint_imports_command; "
            "sys.exit(lint_imports_command())")
    return subprocess.run([sys.executable, "-c", code, str(ROOT / "pyproject.toml"), "--no-cache"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=120)


def _has_importlinter() -> bool:
    try:
        import importlinter  # noqa: F401
    except ImportError:
        return False
    return True


def test_import_contracts_are_kept(tmp_path):
    result = _lint_imports(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 2 kept, 0 broken." in result.stdout
    # every module of the installed layout was read, passes/ included
    files = len(list((tmp_path / "tree").rglob("*.py")))
    assert f"Analyzed {files} files" in result.stdout, result.stdout


def test_an_import_of_api_from_a_lower_layer_breaks_them(tmp_path):
    plant = "tcmlir.poly.planted:from tcmlir.api import TCFunction\n"
    result = _lint_imports(tmp_path, plant)
    assert result.returncode != 0
    assert "tcmlir.poly is not allowed to import tcmlir.api" in result.stdout
    assert "tcmlir.poly.planted -> tcmlir.api" in result.stdout


# every import of a module (function-level and TYPE_CHECKING ones included: grimp reads them
# all) whose target imports it back, directly or through others: an import circle
_CIRCLES = """
import grimp
graph = grimp.build_graph("tcmlir", cache_dir=None)
for module in sorted(graph.modules):
    for imported in sorted(graph.find_modules_directly_imported_by(module)):
        if graph.chain_exists(importer=imported, imported=module):
            print(module, "->", imported)
"""


def test_no_import_circle_between_modules(tmp_path):
    tree = _installed_layout(tmp_path)
    result = subprocess.run([sys.executable, "-c", _CIRCLES], cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "", "imports that close a circle:\n" + result.stdout


def test_a_planted_circle_is_found(tmp_path):
    tree = _installed_layout(tmp_path)
    (tree / "tcmlir" / "poly" / "planted.py").write_text("from . import planted_back\n")
    (tree / "tcmlir" / "poly" / "planted_back.py").write_text("def f():\n    from . import planted\n")
    result = subprocess.run([sys.executable, "-c", _CIRCLES], cwd=tree,
                            env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.split("\n")[:2] == ["tcmlir.poly.planted -> tcmlir.poly.planted_back",
                                             "tcmlir.poly.planted_back -> tcmlir.poly.planted"]
