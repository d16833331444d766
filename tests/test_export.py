"""make export: a learner's answers that pass their visible tests become their own copy of the
package (``autograder.export``), which the package's own code then runs: in files, not by patching."""
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import nbformat
import pytest

from autograder import export, workspace
from autograder.chapters import Chapter
from coursebuild import bundle

from . import grading_fixture as fx

MODULE = '''import math


def helper(x):
    return x


@staticmethod
def softmax(x):
    raise NotImplementedError()


def other():
    return softmax(1)


__learner_exercises__ = ('softmax', 'split_heads')
'''


def test_an_answer_takes_the_place_of_its_definition_and_leaves_the_stub_list():
    text = export.with_answer(MODULE, "def softmax(x):\n    return helper(x)\n")
    assert "raise NotImplementedError" not in text and "@staticmethod" not in text
    assert "def softmax(x):\n    return helper(x)\n" in text and "def other():" in text
    assert "__learner_exercises__ = ('split_heads',)" in text
    namespace = {}
    exec(compile(text, "module", "exec"), namespace)
    assert namespace["other"]() == 1


def test_an_answer_that_needs_a_name_no_export_cell_defines_is_refused():
    assert export.outside_names("def softmax(x):\n    return scratch(x) + math.pi + helper(len(x))\n", MODULE) == ["scratch"]
    assert export._refusal("def softmax(x):\n    return scratch(x)\n", MODULE).startswith("not exported: it uses scratch,")
    assert "does not parse" in export._refusal("def softmax(x:\n", MODULE)
    assert "defines ['unknown']" in export._refusal("def unknown():\n    pass\n", MODULE)
    assert export._refusal("import torch\n\ndef softmax(x):\n    y = torch.tensor(x)\n    return y\n", MODULE) is None


COUNTING = "softmax_calls = []  # how often the package's own code calls this answer\n\n"


def _bundle_python(path: Path, code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose path is ``path`` and the installed packages (no
    ``site``, so that the repository's own editable install answers for nothing)."""
    search = os.pathsep.join([str(path), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    return subprocess.run([sys.executable, "-S", "-c", textwrap.dedent(code)], cwd=path,
                          env={**os.environ, "PYTHONPATH": search}, capture_output=True, text=True, timeout=300)


@pytest.mark.grading
def test_after_export_the_bundles_own_attention_runs_the_learners_softmax(tmp_path):
    built = bundle.build("04", tmp_path / "dist")  # chapter 04 handed out, not due: its exercises are stubs
    chapter = Chapter.load("04_attention")
    softmax = chapter.by_id["softmax"].source
    body = softmax.split('"""', 2)[2]  # after the docstring: count each call
    answers = {"softmax": softmax.replace("def softmax(", COUNTING + "def softmax(", 1).replace(
        body, "\n    softmax_calls.append(1)" + body, 1),
               "kv_cache_bytes": "def kv_cache_bytes(*args, **kwargs):\n    return 0\n"}  # wrong: not exported
    work = tmp_path / "work"
    notebook = fx.write(fx.submission(chapter, answers, solved=True), work / "04_attention" / "04_attention.ipynb")
    attention = """
        import torch
        import minillm
        from minillm import attention
        print(json.dumps({"file": minillm.__file__, "stubs": list(attention.__learner_exercises__)}))
        layer = attention.MultiHeadAttention(16, 4, backend="math")
        try:
            layer(torch.randn(2, 5, 16))
            print(json.dumps({"calls": len(attention.softmax_calls), "softmax": attention.softmax.__code__.co_filename}))
        except NotImplementedError:
            print(json.dumps({"calls": None}))
    """
    before = _bundle_python(built, "import json\n" + textwrap.dedent(attention))
    assert before.returncode == 0, before.stderr[-2000:]
    assert json.loads(before.stdout.splitlines()[-1]) == {"calls": None}, "the bundle's attention is stubs"

    env = {**os.environ, "PYTHONPATH": str(built)}
    env.pop("MINILLM_COURSE_ROOT", None)
    done = subprocess.run([sys.executable, "-m", "autograder", "export", "04", "--work", str(work)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = dict(line.split(": ", 1) for line in done.stdout.splitlines() if ": " in line and not line.startswith("/"))
    assert said["softmax"] == "exported into minillm/attention.py"
    assert said["kv_cache_bytes"].startswith("its visible test does not pass yet"), said
    assert "restart the notebook's kernel" in done.stdout
    overlay = export.overlay_folder(work)
    assert (overlay / "bundle.json").is_file(), "the learner's own package is still a bundle's"

    after = _bundle_python(overlay, "import json\n"
                           + textwrap.dedent(attention))
    assert after.returncode == 0, after.stderr[-2000:]
    first, second = (json.loads(line) for line in after.stdout.splitlines()[-2:])
    assert first["file"].startswith(str(overlay)) and "softmax" not in first["stubs"]
    assert first["stubs"] == ["kv_cache_bytes"], "an answer that fails its visible test is not exported"
    assert second["calls"] and second["softmax"].startswith(str(overlay)), second

    workspace.reset(work, "04")
    assert not (overlay / "minillm").exists() and json.loads((overlay / export.RECORD).read_text()) == {}
    assert notebook.read_text() != ""


def test_the_labs_kernels_import_the_learners_package_first(tmp_path):
    from autograder import lab

    env = lab.learner_environment(tmp_path / "work", {"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str((tmp_path / "work" / ".minillm").resolve()), "/elsewhere"]
    assert (Path(env["MINILLM_DATA"]) / "tinyshakespeare.txt").is_file(), "the overlay has no data/ beside it"
    assert export.rebuild(tmp_path / "work") is None, "nothing exported: no overlay, the installed package answers"
