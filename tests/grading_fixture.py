"""A tiny chapter for grading tests, built by the tests themselves, and submissions of it.

Two exercises (a function returning a tensor, a function returning an int), a visible and
a hidden test each, and a written question. Its master notebook is made with the course's
own cell directives, so it goes through the same build rules as a real chapter.
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import nbformat

from coursebuild.notebooks import apply_directives

SLUG = "90_fixture"
HIDDEN_MARKER = "FIXTURE-HIDDEN-MARKER-7f3a"

CELLS = [
    ("markdown", "# Fixture chapter\nTwo small exercises."),
    ("code", "import os\nimport numpy as np\nimport torch\nprint('set up')"),
    ("code", '#| export minillm/fixture_ref.py\n"""The fixture\'s reference module."""\nimport torch'),
    ("markdown", "## Exercise 1 · scale a tensor\nReturn $y = c\\,x$, elementwise:\n$$y_i = c\\,x_i.$$"),
    ("code", "#| answer scale\n#| export minillm/fixture_ref.py\n"
             "def scale(x: torch.Tensor, factor: float) -> torch.Tensor:\n"
             '    """x times factor."""\n'
             "    ### BEGIN SOLUTION\n    return x * factor\n    ### END SOLUTION"),
    ("code", "#| test scale_visible points=1\n"
             "x = torch.tensor([1.0, 2.0])\n"
             "got = scale(x, 3.0)\n"
             "assert isinstance(got, torch.Tensor), f'scale should return a tensor, got {type(got).__name__}'\n"
             "assert torch.allclose(got, torch.tensor([3.0, 6.0])), f'scale([1, 2], 3) should be [3, 6], got {got}'\n"
             "print('scale: visible test passed')"),
    ("code", "#| test scale_hidden points=2\n# Hidden tests: they run when your notebook is graded.\n"
             "### BEGIN HIDDEN TESTS\n"
             f"# {HIDDEN_MARKER}\n"
             "for shape in [(3,), (2, 5)]:\n"
             "    x = torch.randn(*shape, dtype=torch.float64)\n"
             "    factor = float(torch.rand(())) + 0.5\n"
             "    got = scale(x, factor)\n"
             "    assert type(got) is torch.Tensor and got.shape == x.shape, 'scale: wrong type or shape'\n"
             "    assert torch.allclose(got, x * factor), 'scale: wrong values'\n"
             "    assert np.allclose(got.numpy(), (x * factor).numpy()), 'scale: wrong values (numpy)'\n"
             "### END HIDDEN TESTS"),
    ("code", "scaled_twice = scale(scale(torch.ones(2), 2.0), 2.0)\nprint(scaled_twice)"),
    ("markdown", "## Exercise 2 · count the weights of a linear layer"),
    ("code", "#| answer count_weights\n"
             "def count_weights(d_in: int, d_out: int, bias: bool = True) -> int:\n"
             '    """Parameters of torch.nn.Linear(d_in, d_out, bias)."""\n'
             "    ### BEGIN SOLUTION\n    return d_in * d_out + (d_out if bias else 0)\n    ### END SOLUTION"),
    ("code", "#| test count_weights_visible points=1\n"
             "assert count_weights(3, 2, True) == 8, f'count_weights(3, 2, True) should be 8, got {count_weights(3, 2, True)!r}'\n"
             "print('count_weights: visible test passed')"),
    ("code", "#| test count_weights_hidden points=2\n# Hidden tests: they run when your notebook is graded.\n"
             "### BEGIN HIDDEN TESTS\n"
             f"# {HIDDEN_MARKER}\n"
             "for d_in, d_out, bias in [(5, 7, True), (64, 3, False), (1, 1, True)]:\n"
             "    expected = sum(p.numel() for p in torch.nn.Linear(d_in, d_out, bias=bias).parameters())\n"
             "    got = count_weights(d_in, d_out, bias)\n"
             "    assert type(got) is int and got == expected, f'count_weights{(d_in, d_out, bias)}: expected {expected}, got {got!r}'\n"
             "### END HIDDEN TESTS"),
    ("markdown", "#| written why_bias points=1\n### BEGIN SOLUTION\nA bias shifts the output; it adds d_out parameters.\n### END SOLUTION"),
]



def master_notebook() -> nbformat.NotebookNode:
    """The fixture's master notebook (the nbgrader source), as the course's build makes it."""
    notebook = nbformat.v4.new_notebook()
    for index, (kind, source) in enumerate(CELLS):
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        apply_directives(cell, f"fixture cell {index}")
        cell.id = cell.metadata.get("nbgrader", {}).get("grade_id") or f"c{index:03d}"
        notebook.cells.append(cell)
    notebook.metadata = nbformat.from_dict({
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"}})
    return notebook


def write_master(folder: Path) -> Path:
    path = Path(folder) / f"{SLUG}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(master_notebook(), path)
    return path


def submission(chapter, answers: dict[str, str] | None = None, *, solved: bool = False) -> dict:
    """A learner's notebook of ``chapter`` as JSON data: the release, with ``answers``.

    ``solved`` starts from the master's answers instead of the release's stubs.
    """
    notebook = copy.deepcopy(chapter.learner)
    for cell, master in zip(notebook.cells, chapter.cells):
        if solved and master.kind in ("answer", "written"):
            cell.source = master.source
        if master.grade_id in (answers or {}):
            cell.source = answers[master.grade_id]
    return json.loads(nbformat.writes(notebook))


def write(data: dict | str | bytes, path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, dict):
        data = json.dumps(data, indent=1)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


def processes_mentioning(path: str | os.PathLike) -> list[str]:
    """The command lines of the running processes that mention ``path`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if str(path) in cmdline:
                found.append(cmdline)
    return found


def cell_of(data: dict, grade_id: str) -> dict:
    for cell in data["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return cell
    raise KeyError(grade_id)


CLASS_SLUG = "91_classes"
CLASS_CELLS = [
    ("code", "import torch"),
    ("code", "#| answer affine\n"
             "class Affine(torch.nn.Module):\n"
             '    """y = x W^T + b, as torch.nn.Linear, through an attribute named linear."""\n'
             "    def __init__(self, d_in: int, d_out: int):\n"
             "        super().__init__()\n"
             "        ### BEGIN SOLUTION\n        self.linear = torch.nn.Linear(d_in, d_out)\n        ### END SOLUTION\n\n"
             "    def forward(self, x):\n"
             "        ### BEGIN SOLUTION\n        return self.linear(x)\n        ### END SOLUTION"),
    ("code", "#| test affine_hidden points=3\n### BEGIN HIDDEN TESTS\n"
             "model = Affine(3, 2)\n"
             "assert isinstance(model, Affine), 'Affine(3, 2) is not an Affine'\n"
             "assert sum(p.numel() for p in model.parameters()) == 8, 'Affine(3, 2) should have 8 parameters'\n"
             "assert model.linear.weight.shape == (2, 3), 'linear.weight should be (2, 3)'\n"
             "reference = torch.nn.Linear(3, 2)\n"
             "missing = model.load_state_dict({'linear.weight': reference.weight.detach(), 'linear.bias': reference.bias.detach()})\n"
             "assert not missing.missing_keys and len(model.state_dict()) == 2\n"
             "x = torch.randn(5, 3)\n"
             "assert torch.allclose(model(x), reference(x)), 'Affine.forward differs from torch.nn.Linear'\n"
             "assert len(list(model.children())) == 1\n"
             "### END HIDDEN TESTS"),
]


def class_master_notebook() -> nbformat.NotebookNode:
    """A master whose one exercise is a class (a torch module) tested from outside."""
    notebook = nbformat.v4.new_notebook()
    for index, (kind, source) in enumerate(CLASS_CELLS):
        cell = nbformat.v4.new_code_cell(source)
        apply_directives(cell, f"class fixture cell {index}")
        cell.id = cell.metadata.get("nbgrader", {}).get("grade_id") or f"c{index:03d}"
        notebook.cells.append(cell)
    notebook.metadata = master_notebook().metadata
    return notebook


def shared_folder(tmp_path_factory) -> Path:
    """A folder all pytest-xdist workers of this session share (the session's own otherwise)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def once(tmp_path_factory, name: str, build):
    """``build(folder)`` (JSON-able) computed once per test session, by whichever worker asks
    first; the others wait for it. Under `--dist loadgroup` a module's ``xdist_group`` runs on
    one worker (tests/conftest.py), so none waits; other modes still build it once."""
    import fcntl

    shared = shared_folder(tmp_path_factory)
    folder = shared / f"once-{name}"
    with open(shared / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = folder / "done.json"
        if not done.exists():
            folder.mkdir(exist_ok=True)
            done.write_text(json.dumps(build(folder)))
        return json.loads(done.read_text())
