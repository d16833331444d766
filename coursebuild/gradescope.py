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

from . import bundle, package, paths

SETUP = """\
#!/usr/bin/env bash
# Gradescope runs this once, when it builds the image: the course's locked environment,
# with torch's CPU build. Needs Python 3.11 to 3.14 (choose such a base image).
set -euo pipefail
cd "$(dirname "$0")"
"${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check \\
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
    for folder in ("autograder", "data"):
        shutil.copytree(paths.ROOT / folder, target / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".*"))
    for notebook in (paths.solution_notebook(slug), paths.release_notebook(slug)):
        destination = target / notebook.relative_to(paths.ROOT)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(notebook, destination)
    (target / "pyproject.toml").write_text(bundle._pyproject(), encoding="utf-8")
    shutil.copy2(paths.ROOT / "constraints.txt", target / "constraints.txt")
    (target / "setup.sh").write_text(SETUP, encoding="utf-8")
    (target / "run_autograder").write_text(RUN.format(slug=slug), encoding="utf-8")
    for script in ("setup.sh", "run_autograder"):
        (target / script).chmod(0o755)
    return bundle.write_zip(target, inside_folder=False, executable=("setup.sh", "run_autograder"))
