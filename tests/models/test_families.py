"""The model registry: one entry per family, the only place (with the family's own files)
that names a family, parameter counts from the model itself, one sentence for a checkpoint of
a family zkl does not run, and docs that list every family it reads."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import make_cfg
from tests.helpers.doc_lists import adding_steps, step_places, table_rows
from tests.test_hostile_input import refusal
from zkl.models.causal_lm import CausalLM
from zkl.models.config import SECTIONS, ModelConfig
from zkl.models.family import Family
from zkl.models.hf_checkpoint import model_config_from_hf
from zkl.models.registry import FAMILIES, build_on_meta, family_of_hf, param_count

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = {"zkl/models/registry.py", "zkl/models/family.py"}


def _family_strings() -> dict[str, str]:
    """Every name that identifies a family -> the family."""
    names = {}
    for entry in FAMILIES.values():
        for name in (entry.name, *entry.model_types, *entry.architectures):
            names[name] = entry.name
    return names


def _default_of_family_field(node: ast.AST, path: str) -> bool:
    """ModelConfig's `family: str = "..."`: a default value, not a question about a family."""
    return path == "zkl/models/config.py" and isinstance(node, ast.AnnAssign)


def test_no_family_string_outside_the_registry_and_its_own_files():
    names = _family_strings()
    found = []
    for path in sorted((ROOT / "zkl").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        skip = {
            id(n.value)
            for n in ast.walk(tree)
            if isinstance(n, ast.AnnAssign) and _default_of_family_field(n, rel)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or node.value not in names or id(node) in skip:
                continue
            owner = FAMILIES[names[node.value]]
            if rel not in REGISTRY and rel not in owner.modules:
                found.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not found, "family names outside the registry: " + "; ".join(found)


def listed_families(text: str) -> list[set[str]]:
    """The backquoted names in each parenthesis after "every family zkl reads"."""
    flat = " ".join(text.split())
    lists = re.findall(r"every family zkl reads \(([^)]*)\)", flat)
    return [set(re.findall(r"`([^`]+)`", names)) for names in lists]


@pytest.mark.parametrize("doc", ["README.md", "docs/recipes.md"])
def test_the_docs_list_every_family_zkl_reads(doc):
    """The README and recipe section 1 name every registry entry, and no other."""
    lists = listed_families((ROOT / doc).read_text())
    assert lists and all(names == set(FAMILIES) for names in lists), (lists, set(FAMILIES))


def test_the_family_list_check_sees_a_missing_family():
    text = "reads every family zkl reads (`qwen2`, `qwen3`,\n  `nemotron_h`) from config.json"
    assert listed_families(text) == [{"qwen2", "qwen3", "nemotron_h"}]
    assert listed_families(text)[0] != set(FAMILIES)


def test_every_entry_builds_and_names_existing_files():
    for entry in FAMILIES.values():
        assert entry.modules and all((ROOT / m).is_file() for m in entry.modules), entry.name
        assert entry.model_types and entry.architectures, entry.name


@pytest.mark.parametrize(
    "model, published",
    [
        # the counts their model cards and safetensors indexes give
        ("qwen2_5_1_5b", 1_543_714_304),
        ("qwen3_30b_a3b", 30_532_122_624),
        ("llama3_1_8b", 8_030_261_248),
        ("mistral_7b", 7_241_732_096),
    ],
)
def test_parameter_count_from_the_meta_model_matches_the_published_one(model, published):
    cfg = make_cfg(f"model={model}").model
    assert param_count(cfg) == published


def test_parameter_count_is_the_models_own():
    for name in (
        "tiny_dense",
        "tiny_moe",
        "tiny_hybrid",
        "tiny_llama",
        "tiny_mistral",
        "tiny_gpt_oss",
    ):
        cfg = make_cfg(f"model={name}").model
        model = build_on_meta(cfg)
        assert param_count(cfg) == sum(p.numel() for p in model.parameters())


def test_an_unsupported_family_names_the_supported_ones(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]})
    )
    with pytest.raises(ValueError) as err:
        model_config_from_hf(tmp_path)
    message = str(err.value)
    assert "gpt2" in message and all(name in message for name in FAMILIES)
    assert message.count(".") <= 2 + message.count("model_type") and "\n" not in message


def test_a_family_is_found_by_architecture_when_model_type_is_absent():
    for entry in FAMILIES.values():
        assert family_of_hf({"architectures": list(entry.architectures)}) is entry


def test_an_unknown_model_family_names_the_supported_ones():
    from zkl.models.registry import validate_model

    with pytest.raises(ValueError, match="is not one of") as err:
        validate_model(ModelConfig(family="gpt2"))
    assert all(name in str(err.value) for name in FAMILIES)


def test_a_window_wider_than_the_context_is_one_sentence():
    """W >= every position is full attention; a W past model.max_position_embeddings is a slip
    (a checkpoint's config.json with such a window reads as full attention instead)."""
    message = refusal(["model=tiny_mistral", "model.sliding_window=500"])
    assert "model.sliding_window=500" in message and "max_position_embeddings=128" in message
    assert "model.sliding_window must be 0" in refusal(
        ["model=tiny_llama", "model.sliding_window=8"]
    )
    assert "model.rope.type='dynamic'" in refusal(["model=tiny_llama", "model.rope.type=dynamic"])
    assert "qwen2" in refusal(["model.family=gpt2"]) and "mistral" in refusal(["model.family=gpt2"])


# -- docs/families.md's "Adding a family" ---------------------------------------------------

FAMILY_DOC = ROOT / "docs" / "families.md"
SHARED_MODELS = {"zkl/models/transformer.py"}  # a model class more than one family reuses


def _module_file(obj: object) -> str:
    return str(Path(inspect.getsourcefile(obj)).relative_to(ROOT))


def _entries_defined_in_family_files() -> set[int]:
    """Every `Family` a `zkl/models/*_family.py` module defines (ids: entries do not hash)."""
    found = set()
    for path in (ROOT / "zkl" / "models").glob("*_family.py"):
        module = importlib.import_module(f"zkl.models.{path.stem}")
        found |= {id(v) for v in vars(module).values() if isinstance(v, Family)}
    return found


def _configs_of(family: str) -> list[str]:
    confs = (ROOT / "conf" / "model").glob("*.yaml")
    return sorted(p.stem for p in confs if yaml.safe_load(p.read_text())["family"] == family)


def _doc_row(entry: Family) -> list[str]:
    """The cells after the name of the family's row in docs/families.md, from its entry."""
    return [
        f"{' '.join(entry.model_types)} / {' '.join(entry.architectures)}",
        entry.model_class.__name__,
        entry.cache,
        ", ".join(sorted(entry.capabilities)),
        ", ".join(sorted(entry.sections)),
        "yes" if entry.megatron else "no",
        ", ".join(f"`{c}`" for c in _configs_of(entry.name)),
    ]


FAMILY_STEPS = {
    "zkl/models/<model>.py": lambda e: (
        issubclass(e.model_class, CausalLM)
        and _module_file(e.model_class) in {*e.modules, *SHARED_MODELS}
    ),
    "zkl/models/<family>_family.py": lambda e: (
        any(re.fullmatch(r"zkl/models/\w+_family\.py", m) for m in e.modules)
        and e.sections <= set(SECTIONS)
    ),
    "zkl/models/registry.py": lambda e: (
        id(e) in _entries_defined_in_family_files() and FAMILIES[e.name] is e
    ),
    "conf/model/<name>.yaml": lambda e: bool(_configs_of(e.name)),
    "docs/families.md": lambda e: table_rows(FAMILY_DOC).get(e.name) == _doc_row(e),
    "README.md": lambda e: all(
        e.name in names
        for doc in ("README.md", "docs/recipes.md")
        for names in listed_families((ROOT / doc).read_text())
    ),
}


def test_adding_a_family_takes_the_steps_its_list_says():
    """Each step of docs/families.md's list names its place first, and that place holds for
    every family the registry has (and every entry a family file defines is registered); no
    step goes unchecked."""
    places = step_places(adding_steps(FAMILY_DOC, "Adding a family"))
    assert places == list(FAMILY_STEPS), places
    for place, holds in FAMILY_STEPS.items():
        for entry in FAMILIES.values():
            assert holds(entry), (place, entry.name)
    assert len(_entries_defined_in_family_files()) == len(FAMILIES)
