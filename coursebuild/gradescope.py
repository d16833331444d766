"""``make gradescope CHAPTER=NN``: the autograder zip of one chapter for Gradescope.

Gradescope builds an image from the zip once (``setup.sh``), then grades each submission in
a container of its own (``run_autograder`` → ``python -m autograder gradescope``). The zip
holds what grading that chapter needs and nothing more: the package as complete as that
chapter (later chapters absent), the grader, the data, the locked versions, and the
chapter's master notebook. That notebook holds the solutions and the hidden tests, so the
zip is the instructor's and is uploaded to Gradescope only, never handed out.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from . import bundle, constraints, package, paths

SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, when it builds the image: the course's locked environment,
# with torch's CPU build. It needs Linux with a python3 of {low} to {high} (docs/grading.md,
# "Gradescope": Ubuntu 24.04's python3 is 3.12; Ubuntu 22.04's, 3.10, is too old).
set -euo pipefail
cd "$(dirname "$0")"
python="${{PYTHON:-python3}}"
system="$(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME" || uname -sr)"
if ! version="$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])' 2>/dev/null)"; then
    echo "setup.sh: $system has no $python: choose a base image with Python {low} to {high}" >&2
    exit 1
fi
if [ "$(uname -s)" != Linux ] || ! "$python" -c 'import sys; sys.exit(not ({low_tuple} <= sys.version_info[:3] < {stop_tuple}))'; then
    echo "setup.sh: $system with Python $version; this autograder needs Linux with Python {low} to {high}:" \\
         "choose another base image (docs/grading.md, Gradescope)" >&2
    exit 1
fi
echo "setup.sh: $system with Python $version, as this autograder expects"
"$python" -m pip install --quiet --disable-pip-version-check \\
    --extra-index-url https://download.pytorch.org/whl/cpu -c constraints.txt -e .
"""

RUN = """\
#!/usr/bin/env bash
# Gradescope runs this for every submission: it grades the notebook in
# ${{AUTOGRADER_ROOT:-/autograder}}/submission and writes results/results.json there.
set -euo pipefail
cd "$(dirname "$0")"
exec "${{PYTHON:-python3}}" -m autograder gradescope {slug} --root "${{AUTOGRADER_ROOT:-/autograder}}"
"""


def setup_script() -> str:
    """setup.sh, with the Python range of pyproject.toml's requires-python."""
    low, high = constraints.python_bounds()
    low_tuple = tuple(int(part) for part in low.split("."))
    stop_tuple = (3, int(high.split(".")[1]) + 1, 0)
    return SETUP.format(low=low, high=high, low_tuple=low_tuple, stop_tuple=stop_tuple)


def build(chapter: str, out: Path) -> Path:
    """Write ``out/gradescope-NN/`` and ``out/gradescope-NN.zip`` for ``chapter``; the zip's path."""
    handed_out, due = bundle.plan(chapter, chapter)
    slug = handed_out[-1]
    target = Path(out) / f"gradescope-{slug[:2]}"
    if target.exists():
        if not (target / "run_autograder").is_file():
            raise FileExistsError(f"{target} exists and is not a Gradescope autograder: not overwriting it")
        shutil.rmtree(target)
    (target / "minillm").mkdir(parents=True)
    generated = package.exports(paths.present_slugs())
    for module, owner in bundle.owners(generated).items():
        if owner is None or owner in due:
            shutil.copy2(paths.ROOT / module, target / module)
    for folder in ("autograder", "course_runtime", "data"):
        shutil.copytree(paths.ROOT / folder, target / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    for notebook in (paths.solution_notebook(slug), paths.release_notebook(slug)):
        destination = target / notebook.relative_to(paths.ROOT)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, destination)
    (target / "pyproject.toml").write_text(bundle._pyproject(), encoding="utf-8")
    shutil.copy2(paths.ROOT / "constraints.txt", target / "constraints.txt")
    (target / "setup.sh").write_text(setup_script(), encoding="utf-8")
    (target / "run_autograder").write_text(RUN.format(slug=slug), encoding="utf-8")
    for script in ("setup.sh", "run_autograder"):
        (target / script).chmod(0o755)
    return bundle.write_zip(target, inside_folder=False, executable=("setup.sh", "run_autograder"))
