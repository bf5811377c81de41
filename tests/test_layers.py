"""The package's shape: one installed namespace, and modules in layers without import cycles.

The import graph is read from the source with `ast`, counting every `import` statement,
function-level ones included (a lazy import still ties two modules into one unit)."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# repository folder -> the installed package it becomes (pyproject.toml's package-dir)
PACKAGES = {"polyft": "polyft", "deps": "polyft.deps", "schedule": "polyft.schedule", "emit": "polyft.emit",
            "experiments": "polyft.experiments"}


def project_modules() -> dict:
    """Installed module name -> source file, for every module of the project."""
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def imports_of(name: str, path: Path, modules: dict) -> set:
    """The project modules that `name` imports anywhere in its source."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = ".".join(filter(None, [base, node.module]))
            else:
                base = node.module
            for alias in node.names:  # `from pkg import submodule` imports the submodule
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules}


def import_graph() -> dict:
    modules = project_modules()
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict) -> list:
    """The strongly connected components with more than one module, or a module importing itself
    (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_lazy_import_cycle(tmp_path):
    """The checker itself: a function-level import that closes a loop is a cycle."""
    (tmp_path / "a.py").write_text("from b import f\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import g\n")
    modules = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    graph = {n: imports_of(n, p, modules) for n, p in modules.items()}
    assert graph == {"a": {"b"}, "b": {"a"}}
    assert cycles(graph) == [["a", "b"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert len(graph) > 50 and "polyft.deps.model" in graph and "polyft.emit.c_target" in graph
    found = cycles(graph)
    assert not found, "import cycles (function-level imports count):\n" + "\n".join(" <-> ".join(c) for c in found)


# the data flow, left to right: a stage imports only the stages to its left
STAGES = ["polyft", "polyft.deps", "polyft.schedule", "polyft.emit", "polyft.experiments"]
TOP = {"polyft", "polyft.program", "polyft.calls", "polyft.cli"}  # the driver (and its call path): over every stage


def stage(module: str) -> int:
    parts = module.split(".")
    return STAGES.index(".".join(parts[:2])) if len(parts) > 1 and ".".join(parts[:2]) in STAGES else 0


def test_stages_import_only_to_their_left():
    graph = import_graph()
    wrong = [f"{m} -> {d}" for m, deps in graph.items() if m not in TOP and not m.startswith("polyft.workloads")
             for d in deps if stage(d) > stage(m)]
    assert not wrong, "imports against the data flow:\n" + "\n".join(sorted(wrong))


def test_installed_names_follow_the_repository_folders():
    """The editable install maps every folder into the one namespace."""
    for folder, package in PACKAGES.items():
        spec = importlib.util.find_spec(package)
        assert spec is not None and Path(spec.origin).parent == ROOT / folder, (package, spec)


def _setuptools_major() -> int:
    try:
        return int(importlib.metadata.version("setuptools").split(".")[0])
    except importlib.metadata.PackageNotFoundError:
        return 0


def _copy_source(dest: Path) -> Path:
    """What a wheel is built from: the tracked packaging files and the package folders."""
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, dest / name)
    for folder in PACKAGES:
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


@pytest.mark.slow
def test_wheel_has_one_top_level_name_and_survives_a_package_called_schedule(tmp_path):
    """A built wheel installs only `polyft` at the top of site-packages (package data included),
    and a different top-level `schedule` package beside it (what `pip install schedule` puts
    there) changes nothing for polyft."""
    (tmp_path / "src").mkdir()
    src = _copy_source(tmp_path / "src")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = pip + ["wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(src)]
    if _setuptools_major() >= 64:  # pyproject.toml's build requirement: build offline with it
        build.insert(len(pip) + 1, "--no-build-isolation")  # else pip fetches setuptools
    subprocess.run(build, check=True)
    (wheel,) = (tmp_path / "dist").glob("polyft-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"polyft", wheel.name.split("-py")[0] + ".dist-info"}
    assert {"polyft/emit/tiles.cuh", "polyft/emit/emulate.hpp", "polyft/deps/model.py",
            "polyft/experiments/reproduce.py"} <= set(names)

    site = tmp_path / "site"
    subprocess.run(pip + ["install", "--no-deps", "--target", str(site), str(wheel)], check=True)
    (site / "schedule").mkdir()
    (site / "schedule" / "__init__.py").write_text("THIRD_PARTY = True\n")
    probe = ("import schedule, polyft as ft, polyft.schedule.schedule, polyft.emit.cuda_target\n"
             "assert schedule.THIRD_PARTY\n"
             "from polyft.workloads import get\n"
             "w = get('stacked_rnn')\n"
             "prog = ft.analyze(w.program, *w.specs(), sizes={'N': 2, 'D': 3, 'L': 4})\n"
             "print(polyft.schedule.__file__, prog.schedule.sequential_steps)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    where, steps = out.stdout.split()
    assert Path(where).is_relative_to(site) and steps == "6"


def test_dir_shows_the_public_api_only():
    """`dir(polyft)` is `polyft.__all__`: every name in it exists, and the only module in it is
    `errors` (the error family users catch); the submodules imports leave behind are not listed."""
    import types

    import polyft as ft
    assert dir(ft) == ft.__all__ == sorted(set(ft.__all__))
    listed = {name: getattr(ft, name) for name in ft.__all__ if name not in ("torch", "jax")}
    assert [n for n, v in listed.items() if isinstance(v, types.ModuleType)] == ["errors"]
    assert "tracing" not in dir(ft) and "autodiff_rules" not in dir(ft)
