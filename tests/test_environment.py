"""The environment is reproducible: pyproject.toml declares what the course imports,
constraints.txt pins every package exactly, and make venv, environment.yml, the README and
`make doctor` agree with them."""
import ast
import importlib.metadata
import os
import re
import subprocess
import sys
import tomllib

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from coursebuild import constraints, paths
from minillm import doctor

PROJECT = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
ALL_PINS = constraints.read()
# The pins that apply to the Python running the tests (constraints.txt holds every platform's).
PINS = {canonicalize_name(r.name): r for r in ALL_PINS if r.marker is None or r.marker.evaluate()}
LOCAL = {"minillm", "course_runtime", "autograder", "coursebuild", "tests", "bench", "conftest"}


def pinned_version(name: str, pin: Requirement | None = None) -> Version:
    pin = pin or PINS[canonicalize_name(name)]
    (specifier,) = pin.specifier
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


def test_the_lock_is_written_by_uv_for_every_platform_from_pypi_alone():
    command = constraints.lock_command(constraints.FILE)
    assert command[1:3] == ["pip", "compile"] and "--universal" in command
    assert command[command.index("--python-version") + 1] == constraints.python_bounds()[0]
    assert command[command.index("--index-url") + 1] == "https://pypi.org/simple"
    assert {"--no-config", "--no-build", "--fork-strategy"} <= set(command)
    assert command[command.index("--output-file") + 1] == "constraints.txt", "annotations name relative paths"
    assert "--upgrade" not in command and "--upgrade" in constraints.lock_command(constraints.FILE, upgrade=True)
    text = constraints.FILE.read_text(encoding="utf-8")
    assert text.startswith(constraints.HEADER)
    assert "--hash" not in text and "--index-url" not in text and "--find-links" not in text
    assert "/work/" not in text and "/tmp/" not in text, "no machine's paths in the lock"


def test_one_version_of_each_package_for_every_platform_and_python():
    """A marker says where a package is needed, never which version: every Python and
    platform gets the versions the tests ran with (uv's --fork-strategy fewest)."""
    versions = {}
    for pin in ALL_PINS:
        versions.setdefault(canonicalize_name(pin.name), set()).add(pinned_version(pin.name, pin))
    forked = {name: sorted(map(str, found)) for name, found in versions.items() if len(found) > 1}
    assert not forked, f"constraints.txt pins several versions of {forked}"


def test_the_python_range_has_both_bounds():
    assert constraints.python_bounds() == ("3.11.0", "3.14")
    assert constraints.python_bounds(">=3.11.5,<3.14") == ("3.11.5", "3.13")
    with pytest.raises(ValueError):
        constraints.python_bounds(">=3.11")


def test_every_dependency_is_pinned_exactly():
    missing = sorted(locked_closure() - PINS.keys())
    assert not missing, f"not in constraints.txt: {missing}; run `make constraints`"
    for pin in ALL_PINS:
        pinned_version(pin.name, pin)


def test_the_environment_is_the_pinned_one():
    """What this Python runs on is what constraints.txt says (a CUDA build of torch, 2.13.0+cu128,
    or the CPU wheel on disk here, 2.13.0+cpu, counts as 2.13.0): every installed package
    that is pinned for this platform, and every package the course needs here. The pins of
    PyPI's CUDA build of torch (the nvidia packages) hold on Linux too, but the CPU build
    needs none of them, so a pin that nothing installed needs may be absent."""
    installed = {}
    for d in importlib.metadata.distributions():  # the first on sys.path is the one imported; setuptools
        installed.setdefault(canonicalize_name(d.metadata["Name"]), Version(d.version))  # appends its _vendor
    needed = locked_closure()
    assert {"torch", "nbgrader", "pytest"} <= needed
    wrong, absent = [], []
    for name, pin in PINS.items():
        if name not in installed:
            if name in needed:
                absent.append(name)
            continue
        if Version(installed[name].public) != pinned_version(name):
            wrong.append(f"{name} {installed[name]} (pinned {pinned_version(name)})")
    assert not wrong and not absent, (
        f"installed versions differ from constraints.txt: {wrong}, missing: {absent}; run `make venv`")


def test_pins_lie_within_the_declared_ranges():
    for requirement in constraints.declared():
        key = canonicalize_name(requirement.name)
        pins = [pin for pin in ALL_PINS if canonicalize_name(pin.name) == key]
        assert pins, f"{requirement.name} is declared but not pinned"
        for pin in pins:
            assert requirement.specifier.contains(pinned_version(key, pin), prereleases=True), (
                f"constraints.txt pins {requirement.name} {pinned_version(key, pin)}, outside pyproject's {requirement}"
            )
            # uv writes its own form of a marker (platform_system == 'Linux' as sys_platform == 'linux').
            assert pin.marker == requirement.marker, f"{requirement.name}: markers differ ({pin.marker}, {requirement.marker})"


def test_torch_and_triton_are_pinned_as_torch_requires_them_on_pypi():
    """PyPI's torch 2.13.0 requires triton==3.7.1 wherever platform_system == "Linux" (its
    CUDA build, aarch64 included); the CPU wheel on disk here requires no triton, so another
    triton installs here but cannot install from PyPI. tests/test_resolution.py resolves it
    there."""
    assert "torch==2.13.0" in PROJECT["dependencies"]
    assert "triton==3.7.1; sys_platform == 'linux'" in PROJECT["dependencies"]
    assert str(PINS["torch"]) == "torch==2.13.0"
    (triton,) = [pin for pin in ALL_PINS if canonicalize_name(pin.name) == "triton"]
    assert str(triton) == 'triton==3.7.1; sys_platform == "linux"'


def test_make_venv_and_environment_yml_install_with_the_constraints():
    makefile = (paths.ROOT / "Makefile").read_text()
    assert "pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'" in makefile
    assert "pip install --quiet --disable-pip-version-check -c constraints.txt -e .\n" in makefile
    assert re.search(r"^\$\(STAMP\): pyproject.toml constraints.txt$", makefile, re.M)
    assert re.search(r"^\$\(LEARNER_STAMP\): pyproject.toml constraints.txt$", makefile, re.M)
    env = yaml.safe_load((paths.ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    requirements = [line for line in pip_section if not line.startswith("--")]
    assert requirements == ["-c ${PWD}/constraints.txt", "-e ."], "environment.yml must not keep its own list"
    (python,) = [d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python=")]
    assert SpecifierSet(PROJECT["requires-python"]).contains(python.split("=", 1)[1] + ".0")


@pytest.mark.parametrize("beside", [True, False], ids=["temp-file-beside-environment.yml", "temp-file-in-tmp"])
def test_environment_ymls_constraints_are_found_wherever_the_temporary_file_is(tmp_path, beside):
    """conda and micromamba write the pip section to a temporary requirements file, beside
    environment.yml or in /tmp, and run pip in the repository: the constraints file is
    found either way (pip stops at the unknown requirement after reading it)."""
    env = yaml.safe_load((paths.ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    folder = paths.ROOT if beside else tmp_path
    temporary = folder / f"condaenv.{tmp_path.name}.requirements.txt"
    temporary.write_text("".join(f"{line}\n" for line in pip_section if line.startswith("-c")) + "no-such-package-x\n")
    try:
        run = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-index", "-r", str(temporary)],
                             cwd=paths.ROOT, env={**os.environ, "PWD": str(paths.ROOT)}, capture_output=True, text=True)
    finally:
        temporary.unlink()
    assert "Could not open requirements file" not in run.stderr, run.stderr
    assert "no-such-package-x" in run.stderr, run.stderr


def test_requires_python_is_what_readme_doctor_and_this_python_say():
    required = SpecifierSet(PROJECT["requires-python"])
    lowest, highest = constraints.python_bounds()
    minimum, maximum = lowest.removesuffix(".0"), highest
    readme = " ".join((paths.ROOT / "README.md").read_text().split())
    assert f"You need Python {minimum} to {maximum}" in readme
    assert ".".join(map(str, doctor.MIN_PYTHON)) == minimum and ".".join(map(str, doctor.MAX_PYTHON)) == maximum
    assert required.contains(".".join(map(str, sys.version_info[:3])))
    assert required.contains(lowest) and required.contains(f"{highest}.99")
    assert not required.contains("3.10.14"), "the tests import tomllib (3.11+)"
    assert not required.contains(f"3.{int(highest.split('.')[1]) + 1}.0"), "torch 2.13.0 has no wheels for it"


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
    files = [p for folder in ("minillm", "course_runtime", "autograder", "coursebuild", "tests", "bench", "solutions")
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
