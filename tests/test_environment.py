"""The environment is reproducible: pyproject.toml declares what the course imports,
constraints.txt pins every package exactly, and make venv, environment.yml, the README and
`make doctor` agree with them."""
import ast
import importlib.metadata
import re
import sys
import tomllib

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from coursebuild import constraints, paths
from minillm import doctor

PROJECT = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
PINS = {canonicalize_name(r.name): r for r in constraints.read()}
LOCAL = {"minillm", "autograder", "coursebuild", "tests", "bench", "conftest"}


def pinned_version(name: str) -> Version:
    (specifier,) = PINS[canonicalize_name(name)].specifier
    assert specifier.operator == "==", f"{name} is constrained, not pinned: {specifier}"
    return Version(specifier.version)


def locked_closure() -> set[str]:
    """Every distribution the installed course needs (its test extra included), except those
    the package that needs them already pins exactly."""
    needed, todo = set(), [(constraints.PROJECT, frozenset({"test"}))]
    seen = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen:
            continue
        seen.add((name, extras))
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            environments = [{"extra": extra} for extra in extras or {""}]
            if requirement.marker and not any(requirement.marker.evaluate(e) for e in environments):
                continue
            exact = [s for s in requirement.specifier if s.operator in ("==", "===")]
            key = canonicalize_name(requirement.name)
            if not exact or key in PINS:
                needed.add(key)
            todo.append((key, frozenset(requirement.extras)))
    return needed


def test_pins_are_written_from_pip_freeze():
    frozen = ["torch==2.13.0+cpu", "triton==3.8.0", "pip==23.2.1", "PyYAML==6.0.4", "minillm-course==0.1.0", "# a comment"]
    declared = [Requirement("torch==2.13.0"), Requirement("triton==3.8.0; sys_platform == 'linux'")]
    assert constraints.pins(frozen, declared) == [
        "torch==2.13.0", 'triton==3.8.0; sys_platform == "linux"', "PyYAML==6.0.4",
    ]


def test_every_dependency_is_pinned_exactly():
    missing = sorted(locked_closure() - PINS.keys())
    assert not missing, f"not in constraints.txt: {missing}; run `make constraints`"
    for name in PINS:
        pinned_version(name)


def test_the_environment_is_the_pinned_one():
    """What this Python runs on is what constraints.txt says (a CUDA build of torch, 2.13.0+cu128,
    counts as 2.13.0)."""
    wrong = []
    for name, pin in PINS.items():
        if pin.marker is not None and not pin.marker.evaluate():
            continue
        installed = Version(importlib.metadata.version(name))
        if Version(installed.public) != pinned_version(name):
            wrong.append(f"{name} {installed} (pinned {pinned_version(name)})")
    assert not wrong, f"installed versions differ from constraints.txt: {wrong}; run `make venv`"


def test_pins_lie_within_the_declared_ranges():
    for requirement in constraints.declared():
        key = canonicalize_name(requirement.name)
        assert key in PINS, f"{requirement.name} is declared but not pinned"
        assert requirement.specifier.contains(pinned_version(key), prereleases=True), (
            f"constraints.txt pins {requirement.name} {pinned_version(key)}, outside pyproject's {requirement}"
        )
        assert PINS[key].marker == requirement.marker, f"{requirement.name}: markers differ"


def test_torch_and_triton_are_pinned_to_the_wheels_on_disk():
    assert "torch==2.13.0" in PROJECT["dependencies"]
    assert str(PINS["torch"]) == "torch==2.13.0"
    assert str(PINS["triton"]) == 'triton==3.8.0; sys_platform == "linux" and platform_machine == "x86_64"'


def test_make_venv_and_environment_yml_install_with_the_constraints():
    makefile = (paths.ROOT / "Makefile").read_text()
    assert "pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'" in makefile
    assert "pip install --quiet --disable-pip-version-check -c constraints.txt -e .\n" in makefile
    assert re.search(r"^\$\(STAMP\): pyproject.toml constraints.txt$", makefile, re.M)
    assert re.search(r"^\$\(LEARNER_STAMP\): pyproject.toml constraints.txt$", makefile, re.M)
    env = yaml.safe_load((paths.ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    requirements = [line for line in pip_section if not line.startswith("--")]
    assert requirements == ["-c constraints.txt", "-e ."], "environment.yml must not keep its own list"
    (python,) = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    assert SpecifierSet(PROJECT["requires-python"]).contains(python.split("=", 1)[1] + ".0")


def test_requires_python_is_what_readme_doctor_and_this_python_say():
    required = SpecifierSet(PROJECT["requires-python"])
    (minimum,) = [s.version for s in required if s.operator == ">="]
    assert re.search(rf"You need Python {re.escape(minimum)} or newer", (paths.ROOT / "README.md").read_text())
    assert ".".join(map(str, doctor.MIN_PYTHON)) == minimum
    assert required.contains(".".join(map(str, sys.version_info[:3])))
    assert not required.contains("3.10.14"), "the tests import tomllib (3.11+)"


def imported_top_level(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
        elif (isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.importorskip", "importlib.import_module")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names.add(node.args[0].value.split(".")[0])
    return names


def test_every_package_the_code_and_tests_import_is_declared():
    files = [p for folder in ("minillm", "autograder", "coursebuild", "tests", "bench", "solutions")
             for p in (paths.ROOT / folder).rglob("*.py")] + [paths.ROOT / "conftest.py"]
    # A script's sibling (bench/moe.py importing bench/train.py) is local: Python puts a
    # script's own folder first on its path.
    imported = set().union(*(imported_top_level(ast.parse(p.read_text(encoding="utf-8")))
                             - {sibling.stem for sibling in p.parent.glob("*.py")} for p in files))
    third_party = imported - set(sys.stdlib_module_names) - LOCAL
    assert {"torch", "nbformat", "yaml"} <= third_party, "the scan finds the imports"
    declared = {canonicalize_name(r.name) for r in constraints.declared()}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module in sorted(third_party):
        owners = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not owners & declared:
            undeclared[module] = sorted(owners) or "not installed"
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_no_test_skips_on_a_package_that_is_always_installed():
    """pytest.importorskip on a declared package can never skip: it only hides a broken install."""
    always = {canonicalize_name(r.name) for r in constraints.declared() if r.marker is None}
    distributions = importlib.metadata.packages_distributions()
    guards = []
    for path in (paths.ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and ast.unparse(node.func) == "pytest.importorskip"
                    and isinstance(node.args[0], ast.Constant)):
                module = node.args[0].value.split(".")[0]
                owners = {canonicalize_name(d) for d in distributions.get(module, [])}
                if module in LOCAL or owners & always:
                    guards.append(f"{path.name}:{node.lineno} {node.args[0].value}")
    assert not guards, f"importorskip on packages that are always installed: {guards}"
