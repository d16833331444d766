"""`make student-bundle`: the learner notebooks handed out and a minillm complete only for
the chapters due; nothing an instructor keeps private ships."""
import ast
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import nbformat
import pytest

from coursebuild import bundle, execute, paths

from .test_release_safety import secret_lines

pytestmark = pytest.mark.xdist_group(name="bundle")  # its bundles are built once, on one worker

UPTO, DUE, NOT_DUE = "02_embeddings", ["00_history", "01_tokenization"], "02_embeddings"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return bundle.build("02", tmp_path_factory.mktemp("dist"))


def files_of(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in folder.rglob("*") if p.is_file() and p.suffix in (".py", ".ipynb", ".md", ".json", ".toml", ".yml", "")
    }


def test_it_holds_the_chapters_handed_out_and_nothing_private(built):
    top = sorted(p.name for p in built.iterdir())
    assert top == ["Makefile", "README.md", "autograder", "bundle.json", "chapters", "constraints.txt",
                   "course_runtime", "data", "environment.yml", "lab", "minillm", "pyproject.toml"]
    assert json.loads((built / "lab" / "learner" / "jupyter_server_config.json").read_text()) == \
        json.loads((paths.ROOT / "lab" / "learner" / "jupyter_server_config.json").read_text()), "the learner's lab config"
    assert (built / "constraints.txt").read_text() == (paths.ROOT / "constraints.txt").read_text()
    assert "-c constraints.txt" in (built / "Makefile").read_text(), "the bundle installs the pinned versions"
    assert sorted(p.name for p in (built / "chapters").iterdir()) == [*DUE, NOT_DUE]
    for slug in [*DUE, NOT_DUE]:
        assert (built / "chapters" / slug / f"{slug}.ipynb").read_bytes() == paths.release_notebook(slug).read_bytes()
    later = {"attention.py", "positional.py", "model.py", "loss.py", "optim.py", "batches.py", "train.py", "recipe.py",
             "convert.py", "__main__.py"}
    assert not later & {p.name for p in (built / "minillm").iterdir()}, "modules of later chapters ship"
    manifest = json.loads((built / "bundle.json").read_text())
    assert manifest["handed_out"] == [*DUE, NOT_DUE] and manifest["due"] == DUE


def test_due_chapters_are_complete_and_the_others_are_stubs(built):
    for module in ("history.py", "config.py", "tokenizer.py", "curves.py", "data.py"):
        assert (built / "minillm" / module).read_text() == (paths.PACKAGE / module).read_text()
    for module in (paths.ROOT / "course_runtime").glob("*.py"):
        assert (built / "course_runtime" / module.name).read_text() == module.read_text(), "the notebook runtime ships"
    stub = (built / "minillm" / "embedding.py").read_text()
    exercises = ("one_hot_embed", "embedding_weight_grad", "nearest_neighbours", "pca_project")
    assert f"__learner_exercises__ = {exercises!r}" in stub
    functions = {node.name: node for node in ast.walk(ast.parse(stub)) if isinstance(node, ast.FunctionDef)}
    for name in exercises:
        last = functions[name].body[-1]
        assert isinstance(last, ast.Raise) and ast.unparse(last.exc) == "NotImplementedError()", name
    assert "class TokenEmbedding" in stub, "the chapter's given code ships"


def test_no_solution_line_of_a_chapter_not_due_ships(built):
    """No line that only the instructor may see ships, beyond what the learner notebooks
    show anyway (a hidden test may share an import line with given code)."""
    files = files_of(built)
    text = "\n".join(files.values())
    # The runtime's marks module names the markers the build strips (and is the repository's own).
    assert files.pop("course_runtime/marks.py") == (paths.ROOT / "course_runtime" / "marks.py").read_text()
    assert not [name for name, body in files.items() if "BEGIN SOLUTION" in body or "BEGIN HIDDEN TESTS" in body]
    public = "\n".join(paths.release_notebook(slug).read_text() for slug in paths.present_slugs())
    for slug, kinds in [*((slug, ("text", "notes")) for slug in DUE), (NOT_DUE, ("hidden", "text", "notes", "code"))]:
        private = secret_lines(slug, kinds)
        assert private, f"{slug} should have lines to keep private"
        leaked = sorted(line for line in private if line in text and line not in public)
        assert not leaked, f"{slug}: private lines ship: {leaked[:3]}"


def test_zip_is_the_folder_and_byte_stable(built, tmp_path):
    with zipfile.ZipFile(built.with_suffix(".zip")) as archive:
        names = {name.split("/", 1)[1] for name in archive.namelist()}
    assert names == {p.relative_to(built).as_posix() for p in built.rglob("*") if p.is_file()}
    again = bundle.build("02", tmp_path)
    assert again.with_suffix(".zip").read_bytes() == built.with_suffix(".zip").read_bytes()
    (again / "chapters" / "02_embeddings" / "mine.txt").write_text("rebuilt away")
    bundle.build("02", tmp_path)
    assert not (again / "chapters" / "02_embeddings" / "mine.txt").exists()


def test_bad_arguments_and_a_foreign_folder(tmp_path):
    with pytest.raises(ValueError, match="upto"):
        bundle.plan("99")
    with pytest.raises(ValueError, match="due"):
        bundle.plan("01", due="02")
    assert bundle.plan("00") == (["00_history"], [])
    assert bundle.plan("02", due="none") == ([*DUE, NOT_DUE], [])
    (tmp_path / "student-bundle-upto-01-due-00").mkdir()
    (tmp_path / "student-bundle-upto-01-due-00" / "notes.txt").write_text("an instructor's file")
    with pytest.raises(FileExistsError, match="not a student bundle"):
        bundle.build("01", tmp_path)
    assert (tmp_path / "student-bundle-upto-01-due-00" / "notes.txt").read_text() == "an instructor's file"


def with_answers(slug: str):
    """The learner notebook with every answer cell taken from the solution."""
    answers = {
        cell.metadata["nbgrader"]["grade_id"]: cell.source
        for cell in nbformat.read(paths.solution_notebook(slug), as_version=4).cells
        if cell.metadata.get("nbgrader", {}).get("solution")
    }
    notebook = nbformat.read(paths.release_notebook(slug), as_version=4)
    for cell in notebook.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution") and cell.cell_type == "code":
            cell.source = answers[meta["grade_id"]]
    return notebook


def exported_answers(notebook) -> dict[str, dict[str, str]]:
    """What ``make export`` writes of ``notebook``'s answer cells (all of them passing):
    module → grade_id → source."""
    from course_runtime import marks

    answers: dict[str, dict[str, str]] = {}
    for cell in notebook.cells:
        target = marks.export_target(cell.source) if cell.cell_type == "code" else None
        if target and cell.metadata.get("nbgrader", {}).get("solution"):
            answers.setdefault(target, {})[cell.metadata["nbgrader"]["grade_id"]] = marks.export_body(cell.source)
    return answers


# The last cell of a chapter run in a bundle: what the learner's code left in the package.
PLAIN_LIBRARY = """
import json, sys
from IPython import get_ipython
_left = {
    "replaced": sorted(f"{m}.{a}" for m, attributes in _at_import.items() for a, value in attributes.items()
                       if getattr(sys.modules[m], a, None) is not value),
    "from_the_notebook": sorted(f"{m}.{a}" for m, module in list(sys.modules.items()) if m.startswith("minillm.")
                                for a, value in vars(module).items() if getattr(value, "__module__", "") == "__main__"),
    "hooks": sorted(getattr(f, "__module__", "?") for f in get_ipython().events.callbacks["post_run_cell"]
                    if getattr(f, "__module__", "").startswith("minillm")),
}
print("PLAIN-LIBRARY " + json.dumps(_left))
"""


@pytest.mark.notebooks
@pytest.mark.parametrize("slug", paths.present_slugs())
def test_a_learner_with_right_answers_runs_the_chapter_on_the_exported_bundle(slug, tmp_path, monkeypatch):
    """The learner exports right answers (``make export``): visible tests pass and every cell
    runs with only the bundle's minillm, the learner's own copy of it first; and the package
    stays a plain library: no attribute of a minillm module is replaced while the chapter
    runs, none holds a function of the notebook, and the package leaves no IPython hook."""
    from autograder import export

    folder = bundle.build(slug, tmp_path)
    notebook = with_answers(slug)
    work = tmp_path / "work"
    overlay = export.write(work, slug, exported_answers(notebook), package=folder / "minillm")
    package = overlay or folder / "minillm"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(export.overlay_folder(work)), str(folder)]))
    monkeypatch.setenv("MINILLM_DATA", str(folder / "data"))  # as the lab sets it (autograder.export.kernel_environment)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(
        "import sys\nimport minillm\nprint(minillm.__file__)\n"
        "_at_import = {m: dict(vars(module)) for m, module in list(sys.modules.items()) if m.startswith('minillm.')}"))
    notebook.cells.append(nbformat.v4.new_code_cell(PLAIN_LIBRARY))
    execute.execute(notebook, folder / "chapters" / slug, quick=True)
    outputs = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs
    )
    assert outputs.startswith(str(package)), "the kernel imported another minillm"
    assert "package's reference" not in outputs and "not working yet" not in outputs
    assert "skipped: this cell needs" not in outputs, "an exported answer is the package's own"
    left = json.loads(outputs.split("PLAIN-LIBRARY ", 1)[1].splitlines()[0])
    assert left == {"replaced": [], "from_the_notebook": [], "hooks": []}, left


@pytest.mark.parametrize("slug", paths.present_slugs())
def test_keep_going_checks_never_call_the_reference_they_stand_in_for(slug):
    """In a bundle that reference is a stub: a check that calls it fails a right answer."""
    for cell in nbformat.read(paths.release_notebook(slug), as_version=4).cells:
        if cell.cell_type != "code" or "keep_going(" not in cell.source:
            continue
        for node in ast.walk(ast.parse(cell.source)):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("keep_going"):
                reference = ast.unparse(node.args[2])
                check = ast.unparse(node.args[3] if len(node.args) > 3 else next(k.value for k in node.keywords if k.arg == "check"))
                assert reference not in check, f"{slug}: the check of {reference} calls {reference}"


# ---------------------------------------------------------------- registered answers reach the model

def _run_in_bundle(folder: Path, code: str) -> str:
    """Run ``code`` in a fresh interpreter that imports only the bundle's minillm; its stdout.

    Without ``site`` (``-S``): the repository's own editable install would otherwise answer
    for any ``minillm.x`` the bundle lacks; the installed packages stay on the path."""
    import sysconfig

    code = f"import minillm\nassert minillm.__file__.startswith({str(folder)!r}), minillm.__file__\n" + textwrap.dedent(code)
    path = os.pathsep.join([str(folder), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    result = subprocess.run([sys.executable, "-S", "-c", code], cwd=folder, env={**os.environ, "PYTHONPATH": path},
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def ffn_not_due(tmp_path_factory) -> Path:
    """Chapter 05 handed out, 04 due; SwiGLU made one of the learner's exercises.

    Chapter 05's SwiGLU is given code, not an exercise; a later chapter's registered
    component is one (chapter 11's MoEFeedForward, chapter 10's kernels). So the learner
    notebook's SwiGLU cell is marked as an answer cell, as such a chapter's would be, and
    the bundle is built from it by the real path: its exercise names, its stub module.
    """
    learner = nbformat.read(paths.release_notebook("05_feed_forward"), as_version=4)
    cells = [cell for cell in learner.cells if cell.cell_type == "code" and "\nclass SwiGLU(" in cell.source]
    assert len(cells) == 1
    cells[0].metadata["nbgrader"] = {"grade": False, "grade_id": "SwiGLU_module", "locked": False,
                                     "schema_version": 3, "solution": True, "task": False}
    marked = tmp_path_factory.mktemp("learner") / "05_feed_forward.ipynb"
    nbformat.write(learner, marked)
    real = paths.release_notebook
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(paths, "release_notebook", lambda slug: marked if slug == "05_feed_forward" else real(slug))
        return bundle.build("05", tmp_path_factory.mktemp("dist"), due="04")


LEARNERS_SWIGLU_HIDDEN_SIZE = """\
def swiglu_hidden_size(d_model, multiple_of=256, ffn_dim_multiplier=None):
    hidden = int(8 * d_model / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return -(-hidden // multiple_of) * multiple_of
"""

LEARNERS_SWIGLU = """\
import torch.nn.functional as F
from torch import nn


class SwiGLU(nn.Module):
    # the learner's own: gate and value in one fused Linear
    def __init__(self, d_model, d_ff, bias=False, dropout=0.0):
        super().__init__()
        self.d_ff = d_ff
        self.up = nn.Linear(d_model, 2 * d_ff, bias=bias)
        self.down = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    @classmethod
    def default_d_ff(cls, d_model, **options):
        return swiglu_hidden_size(d_model, multiple_of=32)

    def forward(self, x):
        gate, value = self.up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * value))
"""


def test_a_learners_exported_class_is_what_the_registry_builds(ffn_not_due, tmp_path):
    """The FFN registry holds forward references, so once the learner exports (``make
    export``) build_ffn builds the learner's class from their own copy of the package, and
    the package's own SwiGLU rule calls the learner's swiglu_hidden_size."""
    from autograder import export

    before = _run_in_bundle(ffn_not_due, """
        from minillm import ffn

        assert {"SwiGLU", "swiglu_hidden_size"} <= set(ffn.__learner_exercises__)
        try:
            ffn.default_d_ff("swiglu", 128)
        except NotImplementedError:
            print("the stub")
    """)
    assert before.strip() == "the stub"
    given = ffn_not_due / "minillm"
    overlay = export.write(tmp_path / "work", "05_feed_forward", {"minillm/ffn.py": {
        "swiglu_hidden_size": LEARNERS_SWIGLU_HIDDEN_SIZE, "SwiGLU_module": LEARNERS_SWIGLU}}, package=given)
    out = _run_in_bundle(overlay.parent, """
        import torch
        import torch.nn.functional as F
        from minillm import ffn

        assert not {"SwiGLU", "swiglu_hidden_size"} & set(ffn.__learner_exercises__)
        module = ffn.build_ffn("swiglu", 8, 16, bias=True)
        assert type(module) is ffn.SwiGLU and hasattr(module, "up"), type(module)
        x = torch.randn(3, 8)
        gate, value = (x @ module.up.weight.T + module.up.bias).chunk(2, dim=-1)
        expected = (F.silu(gate) * value) @ module.down.weight.T + module.down.bias
        torch.testing.assert_close(module(x), expected)
        print("default_d_ff", ffn.default_d_ff("swiglu", 128))
    """)
    assert out.strip() == "default_d_ff 352"
    assert (given / "ffn.py").read_text().count("raise NotImplementedError") >= 2, "the bundle's own file is untouched"


def test_a_later_chapters_name_names_its_chapter_in_a_bundle(ffn_not_due):
    out = _run_in_bundle(ffn_not_due, """
        from minillm.attention import MultiHeadAttention, get_attention_backend
        from minillm.ffn import available_ffns, build_ffn

        assert "moe" in available_ffns()
        for attempt in (lambda: build_ffn("moe", 8, 16), lambda: get_attention_backend("flash"),
                        lambda: MultiHeadAttention(16, 4, backend="triton")):
            try:
                attempt()
                raise AssertionError("a later chapter's name should not resolve in this bundle")
            except ValueError as error:
                print(error)
    """)
    assert out.splitlines() == [
        "FFN 'moe' comes from chapter 11_mixture_of_experts (minillm.moe), which this installation of minillm does not have",
        "attention backend 'flash' comes from chapter 10_flash_attention (minillm.flash), which this installation of "
        "minillm does not have",
        "attention backend 'triton' comes from chapter 10_flash_attention (minillm.flash_triton), which this "
        "installation of minillm does not have",
    ]


@pytest.mark.notebooks
def test_run_all_goes_on_past_unsolved_exercises(built, monkeypatch):
    """The learner's notebook of the chapter not yet due, untouched, runs to its last cell on
    the bundle: each cell that needs an unsolved exercise says so in one line."""
    monkeypatch.setenv("PYTHONPATH", str(built))
    notebook = nbformat.read(built / "chapters" / NOT_DUE / f"{NOT_DUE}.ipynb", as_version=4)
    execute.execute(notebook, built / "chapters" / NOT_DUE, quick=True)   # an error would stop it
    lines = [line for cell in notebook.cells if cell.cell_type == "code" and "raises-exception" not in
             cell.metadata.get("tags", []) for output in cell.outputs for line in output.get("text", "").splitlines()]
    errors = [output for cell in notebook.cells if cell.cell_type == "code" and "raises-exception" not in
              cell.metadata.get("tags", []) for output in cell.outputs if output.output_type == "error"]
    assert not errors
    skipped = [line for line in lines if line.startswith("skipped: this cell needs")]
    assert len(skipped) >= 2, lines
    assert any("`one_hot_embed`" in line for line in skipped), skipped


@pytest.mark.grading
def test_the_bundle_checks_itself_with_the_visible_checks_only(built, tmp_path):
    work = tmp_path / "work"
    (work / NOT_DUE).mkdir(parents=True)
    nbformat.write(with_answers(NOT_DUE), work / NOT_DUE / f"{NOT_DUE}.ipynb")
    env = {**os.environ, "PYTHONPATH": str(built)}
    env.pop("MINILLM_COURSE_ROOT", None)
    done = subprocess.run([sys.executable, "-m", "autograder", "check", NOT_DUE[:2], "--work", str(work)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "4 of 4 visible checks pass." in done.stdout
    assert "a hidden check, run when your notebook is graded" in done.stdout
    assert "make self-check" in (built / "Makefile").read_text() and "help:" in (built / "Makefile").read_text()


def test_bundles_that_differ_never_share_a_folder():
    made = {(due, catch_up): bundle.folder_name(*bundle.plan("05", due), catch_up=catch_up)
            for due, catch_up in ((None, False), ("03", False), ("none", False), (None, True))}
    assert made[(None, False)] == "student-bundle-upto-05-due-04" and made[(None, True)] == "catch-up-05"
    assert len(set(made.values())) == len(made), made
