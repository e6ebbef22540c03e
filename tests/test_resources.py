"""conf/ and sweeps/ are found in a checkout and in an installed wheel, by one function.

The wheel itself is built, installed and run from outside the checkout by
scripts/check_wheel.sh (.ci/run); these tests pin the rule it relies on.
"""

from __future__ import annotations

import ast
from pathlib import Path

import zkl.resources
from zkl.resources import PACKAGED, conf_dir, sweeps_dir

REPO = Path(__file__).resolve().parent.parent


def test_a_checkout_uses_its_own_top_level_folders():
    assert conf_dir() == REPO / "conf" and (conf_dir() / "config.yaml").is_file()
    assert sweeps_dir() == REPO / "sweeps" and (sweeps_dir() / "precision_matrix.yaml").is_file()


def test_an_installed_package_uses_the_folders_inside_it(tmp_path, monkeypatch):
    """site-packages/zkl/_conf, never site-packages/conf (what a wheel holds)."""
    package = tmp_path / "site-packages" / "zkl"
    (package / "_conf").mkdir(parents=True)
    (package / "_sweeps").mkdir()
    monkeypatch.setattr(zkl.resources, "files", lambda name: package)
    assert conf_dir() == package / "_conf" and sweeps_dir() == package / "_sweeps"


def test_setup_py_ships_the_folders_where_zkl_looks():
    """setup.py maps conf/ and sweeps/ to the packages zkl/resources.py reads."""
    tree = ast.parse((REPO / "setup.py").read_text())
    (shipped,) = [
        ast.literal_eval(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SHIPPED"
    ]
    assert shipped == {f"zkl.{inside}": folder for folder, inside in PACKAGED.items()}
