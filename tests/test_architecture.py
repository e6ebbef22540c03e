"""The house rules of docs/design.md section 7, checked on the source so they cannot drift.

- Dependencies point down: the import graph of zkl's modules has no cycle, and neither has
  the graph of its parts (`zkl.models`, `zkl.generation`, ...; a module directly in `zkl/`
  is a part of its own), entry points left out. A part's `config` module (its dataclass and
  check) is a leaf of its own that imports only other config leaves and errors. Counting
  every import (entry points, config leaves, `if TYPE_CHECKING:`), no folder imports one
  that imports it back.
- A function-local import of a zkl module keeps an optional dependency lazy and says so
  (a comment with the word "optional" on its line or the line above); in an entry point it
  may keep torch unloaded until the command line and config are checked (the word "lazy").
- The core knows nothing of the certificate and the lab: nothing under `zkl/run` imports
  `zkl.cert` or `zkl.lab`.
- The algorithm sits between: the trainer imports nothing of `zkl.rl` (it is handed the loss),
  and `zkl.rl` nothing of `zkl.run` (an entry point checks the config before the loop starts).
- A package `__init__` is empty (a docstring) but the version's and the op table's.
- No module over 400 lines but the Triton kernels.
- README.md's map of the modules is generated from the tree.
"""

from __future__ import annotations

import ast
import math
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "zkl"
ENTRY_POINTS = {
    "zkl.__main__",
    "zkl.cli",
    "zkl.cert.__main__",
    "zkl.bench",
    "zkl.sweeps",
    "zkl.report.__main__",
    "zkl.lab.warm_start",
    "zkl.lab.import_gguf",
}
MAX_LINES = 400
KERNELS = PACKAGE / "ops" / "triton"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """Nodes under `if TYPE_CHECKING:`: annotations only, never run."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            inside.update(id(n) for n in ast.walk(node))
    return inside


def imported(node: ast.AST) -> list[str]:
    """The zkl modules an import statement loads (a name that is a module counts as one)."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        if not node.module.startswith("zkl"):
            return []
        names = (f"{node.module}.{alias.name}" for alias in node.names)
        return [name if name in MODULES else node.module for name in names]
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names if alias.name.startswith("zkl")]
    return []


def function_local_imports(tree: ast.AST) -> list[ast.AST]:
    local = []
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            local += [n for n in ast.walk(fn) if imported(n)]
    return local


def import_graph(annotations: bool = False) -> dict[str, set[str]]:
    """Module -> the zkl modules it imports; with `annotations`, those imported under
    `if TYPE_CHECKING:` too."""
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        skip = set() if annotations else type_checking_nodes(tree)
        for node in ast.walk(tree):
            if id(node) not in skip:
                graph[name].update(t for t in imported(node) if t != name and t in MODULES)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def is_config(module: str) -> bool:
    """A part's config dataclass and its check: a leaf that the run composes from below."""
    return module.rsplit(".", 1)[-1] == "config"


def part(module: str) -> str:
    """`zkl.generation.scheduler` -> `zkl.generation`; a config leaf is a node of its own."""
    return module if is_config(module) else ".".join(module.split(".")[:2])


def folder(module: str) -> str:
    """`zkl.models.config` -> `zkl.models`: a folder with everything in it, config leaves too."""
    return ".".join(module.split(".")[:2])


def test_no_folder_imports_one_that_imports_it_back():
    """No folder or loose module imports one that imports it back, counting every import:
    entry points, config leaves and `if TYPE_CHECKING:` ones (an annotation naming a type
    from above is an arrow up too; a lower part takes that config duck-typed)."""
    folders: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph(annotations=True).items():
        folders[folder(module)].update(folder(t) for t in targets if folder(t) != folder(module))
    assert cycles(folders) == []


def part_graph() -> dict[str, set[str]]:
    """Part -> the parts it imports; entry points and the root package left out."""
    parts: dict[str, set[str]] = defaultdict(set)
    for module, targets in import_graph().items():
        if module in ENTRY_POINTS or module == "zkl":
            continue
        parts[part(module)].update(part(t) for t in targets if part(t) != part(module))
    for module in MODULES.keys() - ENTRY_POINTS - {"zkl"}:
        parts.setdefault(part(module), set())
    return parts


def depths(graph: dict[str, set[str]]) -> dict[str, int]:
    """A part's floor: 1 for a part that imports none, else one above its highest import."""
    found: dict[str, int] = {}

    def depth(node: str, path: tuple[str, ...] = ()) -> int:
        assert node not in path, f"import cycle: {path}"
        if node not in found:
            found[node] = 1 + max((depth(t, (*path, node)) for t in graph[node]), default=0)
        return found[node]

    for node in graph:
        depth(node)
    return found


def documented_floors() -> dict[str, int]:
    """docs/design.md section 7's block of floors: part -> floor (`*/config`: the config
    leaves). A floor's number opens its first line; a name starts at column 3; a line
    indented further carries the description of the line above."""
    text = (ROOT / "docs" / "design.md").read_text()
    block = text.split("Floors by import depth", 1)[1].split("```", 2)[1]
    floors: dict[str, int] = {}
    floor = 0
    for line in block.strip("\n").splitlines():
        if line[3:4] == " ":
            continue
        floor = int(line[:3]) if line[:3].strip() else floor
        names = re.sub(r"\([^)]*\)", "", line[3:].split("  ")[0])
        for name in (n.strip().rstrip("/") for n in names.split(",")):
            floors[name if name == "*/config" else f"zkl.{name}"] = floor
    return floors


def test_the_floors_in_the_design_are_the_import_depths():
    """docs/design.md's house is the code's: every part listed once, on its import depth."""
    depth = depths(part_graph())
    documented = documented_floors()
    assert documented.pop("*/config", None) == max(d for p, d in depth.items() if is_config(p))
    assert documented == {p: d for p, d in depth.items() if not is_config(p)}


def test_module_imports_have_no_cycle():
    assert cycles(import_graph()) == []


def test_parts_depend_downward_only():
    assert cycles(part_graph()) == []


def explained(lines: list[str], lineno: int, words: tuple[str, ...] = ("optional",)) -> bool:
    """A comment on the import's line or the line above says why the import is local."""
    context = lines[max(0, lineno - 2) : lineno]
    comments = [line.split("#", 1)[1] for line in context if "#" in line]
    return any(word in comment for comment in comments for word in words)


def test_config_leaves_import_only_leaves():
    """Importing the schema pulls in no model, kernel or engine: only configs and errors."""
    graph = import_graph()
    # and the torch-free registries whose names the configs check: the fixes, the engines
    below = {"zkl.errors", "zkl.invariance", "zkl.engines"}
    for module in filter(is_config, MODULES):
        assert {t for t in graph[module] if not is_config(t)} <= below, module


# the package's version; `zkl.ops.<op>`, the one dispatch every model and kernel caller uses
INIT_WITH_CODE = {"zkl", "zkl.ops"}


def test_package_inits_are_empty():
    """A package `__init__` holds a docstring at most, so importing a part's config leaf (or any
    module) loads that module and not its package's heavy neighbours."""
    for name, path in MODULES.items():
        if path.name != "__init__.py" or name in INIT_WITH_CODE:
            continue
        body = ast.parse(path.read_text()).body
        assert all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body), (
            name
        )


def test_function_local_imports_keep_an_optional_dependency_lazy():
    unexplained = []
    for name, path in MODULES.items():
        lines = path.read_text().splitlines()
        words = ("optional", "lazy") if name in ENTRY_POINTS else ("optional",)
        for node in function_local_imports(ast.parse("\n".join(lines))):
            if not explained(lines, node.lineno, words):
                unexplained.append(f"{name}:{node.lineno}")
    assert unexplained == []


def test_the_core_run_imports_neither_the_certificate_nor_the_lab():
    """`python -m zkl` composes, checks and runs a config that holds no cert.* or bench.*."""
    graph = import_graph()
    for module in MODULES:
        if module == "zkl.run" or module.startswith("zkl.run."):
            above = {t for t in graph[module] if part(t) in ("zkl.cert", "zkl.lab")}
            assert not above, module


def test_the_trainer_is_handed_the_algorithm_and_the_loop_a_checked_config():
    graph = import_graph(annotations=True)
    for module, targets in graph.items():
        above = {"zkl.trainer": "zkl.rl", "zkl.rl": "zkl.run"}.get(part(module))
        assert above is None or above not in {part(t) for t in targets}, module


def test_no_module_rebinds_a_global():
    """docs/design.md section 4: a process-wide value is a `zkl.switch.Switch` set in a `with`
    block; no function rebinds a module's global (`global`) behind its callers' backs."""
    found = [
        f"{name}:{node.lineno}"
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Global)
    ]
    assert found == []


def test_each_fix_outside_the_op_table_is_read_at_one_site():
    """docs/design.md section 3: a fix the op table does not hold is decided where it happens,
    at one site; the table's own fixes are read only through it (`ops.dispatch`,
    `ops.runs_invariant`), megatron's slots included."""
    sites = defaultdict(list)
    for name, path in MODULES.items():
        if name.startswith("zkl.ops") or name == "zkl.invariance":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
            if called == "is_enabled" and node.args and isinstance(node.args[0], ast.Constant):
                sites[node.args[0].value].append(f"{name}:{node.lineno}")
    from zkl.ops import TABLE

    assert not {op.fix for op in TABLE.values()} & set(sites), dict(sites)
    assert {fix: where for fix, where in sites.items() if len(where) > 1} == {}
    assert len(sites) >= 5, dict(sites)  # the rule sees the sites it checks


# docs/design.md section 3: the Triton kernels launched with contraction allowed, none of them
# with a multiply that feeds an add outside `tl.dot`
CONTRACTION_FREE = {
    "gemm_tma_kernel",
    "_gemm_kernel",
    "_silu_mul_kernel",
    "_gumbel_argmax_kernel",
    "_commit_kernel",
    "_logprob_grad_kernel",
}


def test_every_other_kernel_launch_turns_contraction_off():
    """A Triton launch (`kernel[grid](...)`) passes `enable_fp_fusion`, or is one of the
    kernels the design names as having nothing to contract."""
    default = set()
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            launch = isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)
            if launch and not any(k.arg == "enable_fp_fusion" for k in node.keywords):
                default.add(ast.unparse(node.func.value))
    assert default == CONTRACTION_FREE


SIZED = {name: p for name, p in MODULES.items() if KERNELS not in p.parents}


@pytest.mark.parametrize("name", sorted(SIZED))
def test_modules_stay_small(name):
    assert len(SIZED[name].read_text().splitlines()) <= MAX_LINES


def sweep_points(sweep: Path) -> list[list[str]]:
    """Each swept key's values (`[a,b],[c]` is two values), from the sweep's own file."""
    params = yaml.safe_load(sweep.read_text())["hydra"]["sweeper"]["params"]
    return [re.split(r",(?![^\[]*\])", str(values)) for values in params.values()]


def sweep_texts(sweep: Path) -> list[str]:
    """What describes a sweep: its file's opening comment and its row in README.md's table."""
    header = "".join(line for line in sweep.read_text().splitlines(True) if line[:1] == "#")
    rows = (ROOT / "README.md").read_text().splitlines()
    return [header, *(row for row in rows if row.startswith(f"| `{sweep.stem}` |"))]


@pytest.mark.parametrize("sweep", sorted((ROOT / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_sweep_descriptions_count_what_the_sweep_runs(sweep):
    """The jobs a sweep's comment or README row counts, and the tiny models it names ("every
    tiny model" is each of conf/model/tiny_*), are the sweep's."""
    points = sweep_points(sweep)
    covered = set(re.findall(r"tiny_\w+", str(points)))
    every = {p.stem for p in (ROOT / "conf" / "model").glob("tiny_*.yaml")}
    for text in sweep_texts(sweep):
        for jobs in re.findall(r"(\d+) jobs", text):
            assert int(jobs) == math.prod(map(len, points)), text
        named = every if "every tiny model" in text else set(re.findall(r"tiny_\w+", text))
        assert not covered or not named or named == covered, text


def own_names(tree: ast.AST) -> set[str]:
    """The names a module gives: its functions, classes, parameters, variables and the
    attributes it sets (a keyword in a call is the callee's, an attribute read another's)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name | ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.id if isinstance(node, ast.Name) else node.attr)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_backend_names_nothing_of_zkls():
    """One word per meaning (docs/engines.md): the engine builds the model (`engine.name`), a
    dedicated refit has a `transport`, the trainer ranks a `process_group`; `backend` names
    nothing zkl gives a name to, only torch's and megatron-core's own calls say it."""
    found = [
        f"{name}: {word}"
        for name, path in MODULES.items()
        for word in own_names(ast.parse(path.read_text()))
        if "backend" in word.lower()
    ]
    assert found == []
    source = "def build_backend(backend):\n    self.backend = backend\nx = f(backend=1)\n"
    assert own_names(ast.parse(source)) >= {"build_backend", "backend"}  # the rule sees them


def test_no_two_config_keys_are_one_word_and_its_plural():
    """A count of groups and a group count were two keys once (n_group, n_groups): no two
    keys of the schema differ by a trailing s alone."""
    from zkl.run.keys import schema_keys
    from zkl.run.schema import ZklConfig

    keys = {key.rpartition(".")[2] for key in schema_keys(ZklConfig)}
    assert sorted(k for k in keys if k + "s" in keys) == []


def test_readme_map_is_generated_from_the_tree():
    """README.md's module map is `scripts/readme_map.py`'s output for this tree."""
    check = [sys.executable, str(ROOT / "scripts" / "readme_map.py"), "--check"]
    result = subprocess.run(check, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_rules_see_what_they_check():
    """The checker finds a cycle, an unexplained local import and an explained one."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    source = (
        "def f():\n    from zkl import ops\n"
        "def g():\n    # megatron-core is optional\n    from zkl.megatron import model\n"
    )
    found = function_local_imports(ast.parse(source))
    assert [n.lineno for n in found] == [2, 5]
    lines = source.splitlines()
    assert [explained(lines, n.lineno) for n in found] == [False, True]
