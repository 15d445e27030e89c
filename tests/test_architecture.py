"""The import contract: lower layers never import higher ones, and no package has an import circle.

The contract lives in ``pyproject.toml`` (``[tool.importlinter]``) so that ``lint-imports`` and this
test read the same rules. The negative tests add one forbidden import to the real import graph and
check the same rules then report it: a contract that cannot fail would prove nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # import-linter depends on tomli where the standard library has no tomllib
    import tomli as tomllib
from importlinter.application.use_cases import lint_imports
from importlinter.configuration import configure

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "pyproject.toml"


def _contracts() -> dict[str, dict]:
    config = tomllib.loads(CONFIG.read_text())["tool"]["importlinter"]
    return {c["id"]: c for c in config["contracts"]}


def _layers(contract: dict) -> list[grimp.Layer]:
    # import-linter's syntax: "a | b" are independent siblings, "a : b" may import each other.
    layers = []
    for spec in contract["layers"]:
        independent = ":" not in spec
        names = [n.strip() for n in spec.replace(":", "|").split("|")]
        layers.append(grimp.Layer(*names, independent=independent))
    return layers


@pytest.fixture
def graph() -> grimp.ImportGraph:
    # A fresh graph per test: the negative tests add imports to it.
    return grimp.build_graph("tensortune", cache_dir=None)


def _layer_violations(graph: grimp.ImportGraph) -> set:
    contract = _contracts()["layers"]
    return graph.find_illegal_dependencies_for_layers(
        layers=_layers(contract), containers=set(contract["containers"])
    )


def _packages(graph: grimp.ImportGraph) -> list[str]:
    return sorted(m for m in graph.modules if graph.find_children(m))


def test_lint_imports_keeps_every_contract() -> None:
    configure()  # what the lint-imports command does before it reads the contracts
    assert lint_imports(config_filename=str(CONFIG), cache_dir=None, no_logo=True) is True


def test_every_top_level_package_is_in_a_layer(graph: grimp.ImportGraph) -> None:
    # exhaustive = true makes lint-imports fail on an unlisted package; check it here as well so
    # that a new package gets a place in the data flow on purpose.
    listed = {n for layer in _layers(_contracts()["layers"]) for n in layer.module_tails}
    children = {m.split(".", 1)[1].split(".")[0] for m in graph.find_children("tensortune")}
    assert children - {"__main__"} <= listed, children - listed


def test_layers_hold_and_an_upward_import_breaks_them(graph: grimp.ImportGraph) -> None:
    assert _layer_violations(graph) == set()
    upward = graph
    upward.add_import(importer="tensortune.records.schema", imported="tensortune.cli.app")
    found = _layer_violations(upward)
    assert {(d.importer, d.imported) for d in found} == {("tensortune.records", "tensortune.cli")}


def test_siblings_in_one_layer_stay_independent(graph: grimp.ImportGraph) -> None:
    sideways = graph
    sideways.add_import(importer="tensortune.train.trainer", imported="tensortune.tuning.tune")
    found = _layer_violations(sideways)
    assert {(d.importer, d.imported) for d in found} == {("tensortune.train", "tensortune.tuning")}


def test_no_package_has_an_import_circle(graph: grimp.ImportGraph) -> None:
    for package in _packages(graph):
        assert graph.nominate_cycle_breakers(package) == set(), package


def test_a_circle_inside_a_package_is_found(graph: grimp.ImportGraph) -> None:
    circled = graph
    # registry imports every model module, each of which imports base: base -> registry closes it.
    circled.add_import(
        importer="tensortune.costmodel.base", imported="tensortune.costmodel.registry"
    )
    assert circled.nominate_cycle_breakers("tensortune.costmodel") != set()


def test_the_functions_named_like_subpackages_stay_functions() -> None:
    # Importing tensortune.train (evaluate does) once made tt.train the subpackage.
    code = ("import tensortune as tt\n"
            "from tensortune.train import trainer\n"
            "import tensortune.collect, tensortune.transfer.run\n"
            "tt.evaluate\n"
            "assert all(callable(f) and type(f).__name__ == 'function'\n"
            "           for f in (tt.train, tt.transfer, tt.collect)), tt.train\n")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
