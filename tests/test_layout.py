"""The package's layout: no import circles between modules nor between the packages
directly under ``leaf_plugins/`` (type-only imports included), sampling
(``leaf_plugins/rollout/``) never depends on training (``leaf_plugins/training/``), and
sampling settings travel as one object, not as long parameter lists."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "leaf_plugins"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its file (in functions and
    under ``TYPE_CHECKING`` too: a circle of type-only imports is still a circle)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
            else:
                continue
            for target in targets:
                while target and target not in modules:  # a name imported from a module: the module
                    target = target.rpartition(".")[0]
                if target and target not in (name, "leaf_plugins"):
                    graph[name].add(target)
    return graph


def package_of(module: str) -> str:
    """The package directly under ``leaf_plugins/`` that holds ``module``
    (``leaf_plugins.training.trainer`` -> ``training``); a top-level module (``leaf_plugins.cli``)
    is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else module


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The module graph collapsed onto packages: package -> the other packages whose
    modules its modules import."""
    packages: dict[str, set[str]] = {package_of(name): set() for name in graph}
    for name, targets in graph.items():
        packages[package_of(name)] |= {package_of(target) for target in targets} - {package_of(name)}
    return packages


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_a_circle_of_three():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_package_graph_joins_the_modules_of_a_package():
    graph = {"leaf_plugins.a.x": {"leaf_plugins.b.y"}, "leaf_plugins.b.y": {"leaf_plugins.a.z"},
             "leaf_plugins.a.z": {"leaf_plugins.a.x"}, "leaf_plugins.cli": {"leaf_plugins.a.z"}}
    assert package_graph(graph) == {"a": {"b"}, "b": {"a"}, "cli": {"a"}}
    assert circles(package_graph(graph)) == [["a", "b"]]


def test_no_module_imports_another_that_imports_it_back():
    assert circles(import_graph()) == []


def test_no_package_imports_another_that_imports_it_back():
    graph = import_graph()
    found = circles(package_graph(graph))
    imports = [f"{name} imports {target}" for circle in found
               for name in sorted(graph) for target in sorted(graph[name])
               if package_of(name) != package_of(target) and {package_of(name), package_of(target)} <= set(circle)]
    assert found == [], "packages in a circle: " + "; ".join(map(", ".join, found)) + "\n" + "\n".join(imports)


def test_sampling_does_not_depend_on_training():
    graph = import_graph()
    sampling = {name for name in graph if name.startswith("leaf_plugins.rollout")}
    assert sampling, "leaf_plugins/rollout/ holds the sampling code"
    reaches = {(name, target) for name in sampling for target in graph[name]
               if target.startswith("leaf_plugins.training")}
    assert reaches == set()
    training = {module_name(path) for path in (PACKAGE / "training").rglob("*.py")}
    assert not {name for name in training if any(word in name for word in ("rollout", "decoding", "token_stats"))}


PARAMETER_LIMITS = {"rollout": 8, "evaluation": 8}
"""Most parameters (``self`` and ``cls`` not counted) of a function or method in each of
these packages: sampling settings travel as one ``RolloutRequest`` or ``Sampling``, an LLM
judge's as one ``JudgeDecoding``."""


def parameter_counts(package: str) -> dict[str, int]:
    """``module.function`` (``module.Class.method``) -> its parameter count, ``*args`` and
    ``**kwargs`` included, ``self`` and ``cls`` not, for every function of ``package``."""
    counts: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = child.args
                names = [a.arg for a in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                                          *filter(None, (arguments.vararg, arguments.kwarg)))]
                counts[f"{prefix}.{child.name}"] = len([name for name in names if name not in ("self", "cls")])
                visit(child, f"{prefix}.{child.name}")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}.{child.name}")
            else:
                visit(child, prefix)

    for path in (PACKAGE / package).rglob("*.py"):
        visit(ast.parse(path.read_text(), str(path)), module_name(path))
    return counts


def test_sampling_settings_are_not_passed_one_by_one():
    over = {name: count for package, limit in PARAMETER_LIMITS.items()
            for name, count in parameter_counts(package).items() if count > limit}
    assert over == {}
    assert parameter_counts("training")["leaf_plugins.training.update.update_policy"] <= 6
