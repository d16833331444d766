"""environment.yml (conda, Binder) and pyproject.toml ask for the same packages."""
import tomllib

import yaml
from packaging.requirements import Requirement

from coursebuild import paths


def normalized(requirements):
    return {str(Requirement(r)) for r in requirements}


def test_environment_yml_agrees_with_pyproject():
    project = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
    wanted = normalized(project["dependencies"] + project["optional-dependencies"]["test"])
    env = yaml.safe_load((paths.ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict))
    listed = [line for line in pip_section if not line.startswith("-")]
    assert normalized(listed) == wanted
    assert "-e ." in pip_section, "the course itself must be installed"


def test_torch_is_pinned():
    project = tomllib.loads((paths.ROOT / "pyproject.toml").read_text())["project"]
    assert "torch==2.13.0" in project["dependencies"]
