"""The engine registry is the one place that knows an engine (`zkl.engines`): no module compares
an engine's name, every conf/engine option is an entry and every entry an option, and
docs/engines.md's list of what adding one takes holds for every engine there is."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

from tests.helpers.doc_lists import adding_steps, step_places, table_rows
from zkl.engines import ENGINES, NATIVE, engine_named, engine_problem, megatron_engines
from zkl.errors import ConfigError
from zkl.models.registry import FAMILIES

ROOT = Path(__file__).resolve().parent.parent
REGISTRY = ROOT / "zkl" / "engines.py"
SOURCES = sorted([*(ROOT / "zkl").rglob("*.py"), *(ROOT / "scripts").glob("*.py")])


def name_decisions(source: str, names: set[str]) -> list[int]:
    """Lines where an engine name (a string in `names`) decides something: an operand of a
    comparison (`x in (...)` included) or a `match` pattern; or a list of engines kept outside
    the registry: a collection literal or dict keys holding two names or more. A default
    (`engine: str = "native"`), a message or a label (`{"native": logits}`) decides nothing."""

    def named(nodes) -> int:
        return sum(isinstance(n, ast.Constant) and n.value in names for n in nodes)

    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            parts = [node.left, *node.comparators]
            flat = [e for p in parts for e in getattr(p, "elts", [p])]
            hit = named(flat) > 0
        elif isinstance(node, ast.MatchValue):
            hit = named([node.value]) > 0
        elif isinstance(node, ast.Tuple | ast.List | ast.Set):
            hit = named(node.elts) > 1
        elif isinstance(node, ast.Dict):
            hit = named([k for k in node.keys if k is not None]) > 1
        else:
            continue
        if hit:
            found.add(node.lineno)
    return sorted(found)


def test_no_module_but_the_registry_decides_by_an_engine_name():
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in SOURCES
        if path != REGISTRY
        for line in name_decisions(path.read_text(), set(ENGINES))
    ]
    assert found == []


def test_the_name_check_sees_what_it_checks():
    """The checker finds each kind of decision, and passes a default and a message."""
    names = {"native", "megatron_local"}
    source = (
        'a = engine == "native"\n'
        'b = engine in ("megatron_local", "x")\n'
        'c = {"native": 1, "megatron_local": 2}\n'
        'NAMES = ("native", "megatron_local")\n'
        "match engine:\n"
        '    case "megatron_local":\n'
        "        pass\n"
        'def f(engine: str = "native"):\n'
        '    return {"native": engine, "peer": f"engine={engine} runs"}\n'
    )
    assert name_decisions(source, names) == [1, 2, 3, 4, 6]


def test_every_engine_option_is_an_entry_and_every_entry_an_option():
    options = {p.stem: yaml.safe_load(p.read_text()) for p in (ROOT / "conf/engine").glob("*.yaml")}
    assert set(options) == set(ENGINES)
    assert all(body == {"name": name} for name, body in options.items()), options


def test_an_unknown_engine_is_one_sentence_naming_the_engines():
    with pytest.raises(ConfigError) as err:
        engine_named("vllm")
    message = str(err.value)
    assert message.startswith("engine.name='vllm' is not an engine")
    assert all(name in message for name in ENGINES) and "\n" not in message


def test_the_native_engine_runs_every_config_here():
    """Nothing the registry says refuses the native engine, on any machine."""
    for family in FAMILIES.values():
        for layout in ("colocated", "dedicated"):
            for quant in ("none", "mxfp8"):
                assert engine_problem(NATIVE.name, layout, False, family, quant) is None


# -- docs/engines.md's "Adding an engine" --------------------------------------------------


def providers() -> set[str]:
    """The spec names zkl.megatron.spec's PROVIDERS maps (read from its source: megatron-core
    is not importable here)."""
    tree = ast.parse((ROOT / "zkl/megatron/spec.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PROVIDERS":
            return {k.value for k in node.value.keys}
    raise AssertionError("zkl/megatron/spec.py has no PROVIDERS table")


ENGINE_DOC = ROOT / "docs" / "engines.md"


def doc_row(e) -> list[str]:
    """The cells after the name of the engine's row in docs/engines.md, from its record."""
    spec = "" if e.spec is None else f"`{e.spec}`"
    if e.moe_spec:
        spec += f" (MoE layers: `{e.moe_spec}`)"
    yes = {True: "yes", False: "no"}
    flags = (e.cuda_only, e.fp16, e.quantized, e.moe_graphs, e.route_replay, e.sharded)
    cells = [spec, ", ".join(p.label for p in e.needs), ", ".join(e.layouts)]
    return cells + [yes[f] for f in (*flags, e.activation_checkpointing)] + [e.about]


# what each step of the list is, checked for every engine: the place a step names first
ENGINE_STEPS = {
    "zkl/engines.py": lambda e: bool(e.about) and e.layouts and e.name.isidentifier(),
    "conf/engine/<name>.yaml": lambda e: (
        yaml.safe_load((ROOT / f"conf/engine/{e.name}.yaml").read_text()) == {"name": e.name}
    ),
    "zkl/megatron/spec.py": lambda e: {e.spec, e.moe_spec} - {None} <= providers(),
    "docs/engines.md": lambda e: table_rows(ENGINE_DOC).get(e.name) == doc_row(e),
}


def test_adding_an_engine_takes_the_steps_its_list_says():
    """Each step of docs/engines.md's list names its place first, and that place holds for
    every engine the registry has; no step goes unchecked."""
    places = step_places(adding_steps(ENGINE_DOC, "Adding an engine"))
    assert places == list(ENGINE_STEPS), places
    for place, holds in ENGINE_STEPS.items():
        for engine in ENGINES.values():
            assert holds(engine), (place, engine.name)
    assert megatron_engines(), "a megatron engine shows the spec step holds"
