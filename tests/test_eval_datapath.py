"""The evaluations find the real traces from the main checkout and from a git worktree kept
elsewhere (``eval/datapath.py``), and ``$GPUSCOPE_DATA`` overrides both."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

EVAL = Path(__file__).resolve().parent.parent / "eval"


def datapath() -> ModuleType:
    spec = importlib.util.spec_from_file_location("datapath", EVAL / "datapath.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_worktree_kept_apart_finds_the_data_beside_its_main_checkout(
    tmp_path: Path,
) -> None:
    mod = datapath()
    main = tmp_path / "project" / "main"
    (main / ".git" / "worktrees" / "h1").mkdir(parents=True)
    data = tmp_path / "project" / "shared" / "data"
    data.mkdir(parents=True)
    tree = tmp_path / "elsewhere" / "wt" / "h1"
    tree.mkdir(parents=True)
    (tree / ".git").write_text(f"gitdir: {main / '.git' / 'worktrees' / 'h1'}\n")
    assert mod.data_dir(main, {}) == data
    assert mod.data_dir(tree, {}) == data  # the old default, beside the worktree, does not exist
    assert mod.data_dir(tree, {"GPUSCOPE_DATA": str(tmp_path / "mine")}) == tmp_path / "mine"


def test_a_worktree_under_the_main_checkouts_parent_finds_the_data_above_it(tmp_path: Path) -> None:
    data = tmp_path / "shared" / "data"
    data.mkdir(parents=True)
    tree = tmp_path / "wt" / "h2"
    tree.mkdir(parents=True)
    assert datapath().data_dir(tree, {}) == data


def test_without_data_the_path_named_is_beside_the_repository(tmp_path: Path) -> None:
    tree = tmp_path / "repo"
    tree.mkdir()
    (tree / ".git").mkdir()
    assert datapath().data_dir(tree, {}) == tmp_path / "shared" / "data"
