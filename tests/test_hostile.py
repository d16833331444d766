"""The hostile corpus: one generated notebook per known attack, graded in one batch.

Built on the fixture chapter (tests/grading_fixture.py) and graded with small limits, two
at a time. Each case asserts that it earned no point it should not have, that the grader
survived within its limits (the flag that says which limit stopped it), that nothing
leaked (hidden test code, the grader's environment, processes, files), and that every lost
point has a reason. An honest submission graded in the same batch earns full marks, so
no attack spills into another learner's grading.
"""
import json
import os
import re
import sqlite3
from pathlib import Path

import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files
from autograder.isolation import isolation
from autograder.sandbox import Limits

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="hostile-fixture")]

MiB = 2**20
LIMITS = Limits(cell_timeout=8, notebook_timeout=120, call_timeout=8, memory=512 * MiB, file_size=8 * MiB,
                processes=128, output=256 * 1024, tmp=64 * MiB)
SECRET = "grader-secret-5d41402abc"

WRONG_SCALE = "def scale(x, factor):\n    return x + factor\n"
WRONG_COUNT = "def count_weights(d_in, d_out, bias=True):\n    return d_in * d_out\n"
RIGHT_COUNT = "def count_weights(d_in, d_out, bias=True):\n    return d_in * d_out + (d_out if bias else 0)\n"
RIGHT_SCALE = "def scale(x, factor):\n    return x * factor\n"


def _cells_with(data, grade_id):
    return [c for c in data["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id]


def _tamper_tests(data):
    for gid in ("scale_visible", "count_weights_visible"):
        cell = _cells_with(data, gid)[0]
        cell["source"] = f"print('{gid.split('_visible')[0]}: visible test passed')"
        cell["metadata"]["nbgrader"]["locked"] = False
    data["cells"] = [c for c in data["cells"] if not c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "").endswith("_hidden")]
    retyped = {"cell_type": "code", "execution_count": None, "id": "retyped", "outputs": [], "source": "pass",
               "metadata": {"nbgrader": {"grade": True, "grade_id": "scale_visible", "locked": False, "points": 2,
                                         "schema_version": 3, "solution": False, "task": False}}}
    data["cells"].append(retyped)
    return data


def _delete_tests(data):
    data["cells"] = [c for c in data["cells"] if "_visible" not in c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")
                     and "_hidden" not in c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "")]
    return data


def _grade_ids(data):
    visible = _cells_with(data, "scale_visible")[0]
    for _ in range(3):
        copy = json.loads(json.dumps(visible))
        copy["metadata"]["nbgrader"]["points"] = 100
        copy["id"] = f"dup{_}"
        data["cells"].append(copy)
    visible["metadata"]["nbgrader"]["points"] = 100
    _cells_with(data, "count_weights")[0]["metadata"]["nbgrader"]["grade_id"] = "count_weights_v2"
    return data


def _attacks(master: Path, gradebook: Path) -> dict:
    """name → (answers, edit of the notebook's JSON or None, points deserved)."""
    read_hidden = f"""
import glob, os, pathlib
found = []
candidates = [{str(master)!r}, {str(master.parent)!r}]
try:
    import minillm
    root = pathlib.Path(minillm.__file__).resolve().parents[1]
    candidates += [str(p) for p in root.glob('solutions/*/*')] + [str(root / '.git')]
except Exception as error:
    print('no package path:', error)
for pattern in ('/tmp/**/*.ipynb', '/work/*/solutions/*/*', '/root/*', '/proc/*/cmdline', '/proc/*/environ'):
    candidates += glob.glob(pattern, recursive=True)[:500]
for path in candidates:
    try:
        text = open(path, errors='replace').read()
    except Exception:
        continue
    if 'BEGIN HIDDEN ' + 'TESTS' in text or {fx.HIDDEN_MARKER[:9]!r} + {fx.HIDDEN_MARKER[9:]!r} in text:
        found.append(path)
print('found:', found)
print(''.join(open(p, errors='replace').read() for p in found)[:100000])
def scale(x, factor):
    return x * factor if found else x
"""
    return {
        "honest": ({}, lambda d: d, 6, "solved"),
        "allclose": ({"scale": "import numpy, torch\ntorch.allclose = lambda *a, **k: True\n"
                               "numpy.allclose = lambda *a, **k: True\ntorch.equal = lambda *a, **k: True\n"
                               "torch.Tensor.__eq__ = lambda *a, **k: True\n" + WRONG_SCALE,
                      "count_weights": WRONG_COUNT}, None, 0, None),
        "lying_tensor": ({"scale": "import torch\nclass Liar(torch.Tensor):\n"
                                   "    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                                   "        return True\n"
                                   "def scale(x, factor):\n    return Liar(torch.zeros_like(x))\n",
                          "count_weights": "class Always(int):\n    def __eq__(self, other):\n        return True\n"
                                           "    __hash__ = int.__hash__\n"
                                           "def count_weights(d_in, d_out, bias=True):\n    return Always(0)\n"},
                         None, 0, None),
        "custom_exc": ({"scale": "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n" + WRONG_SCALE,
                        "count_weights": "def count_weights(d_in, d_out, bias=True):\n    raise RuntimeError('boom')\n"},
                       None, 0, None),
        "input_transformer": ({"scale": RIGHT_SCALE,
                               "count_weights": "get_ipython().input_transformers_cleanup.append(lambda lines: [])\n"
                                                + RIGHT_COUNT}, None, 0, None),
        "kernel_hooks": ({"scale": "import sys\nget_ipython().events.register('post_run_cell', "
                                   "lambda result: print('All tests passed'))\nsys.settrace(None)\n" + WRONG_SCALE,
                          "count_weights": WRONG_COUNT}, None, 0, None),
        "os_exit": ({"scale": "import os\nos._exit(0)\n" + RIGHT_SCALE, "count_weights": RIGHT_COUNT}, None, 0, None),
        "exit_in_call": ({"scale": "import os\ndef scale(x, factor):\n    os._exit(3)\n",
                          "count_weights": RIGHT_COUNT}, None, 0, None),
        "sigint_loop": ({"scale": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass\n",
                         "count_weights": RIGHT_COUNT}, None, 0, None),
        # Behaves in the notebook (float32), hangs ignoring interrupts on the hidden check's float64.
        "sigint_call": ({"scale": "import signal, torch\ndef scale(x, factor):\n    if x.dtype == torch.float64:\n"
                                  "        signal.signal(signal.SIGINT, signal.SIG_IGN)\n        while True:\n            pass\n"
                                  "    return x * factor\n",
                         "count_weights": RIGHT_COUNT}, None, 1, None),
        "memory_bomb": ({"scale": "import torch\ntry:\n    hog = bytearray(64 * 2**30)\nexcept MemoryError as error:\n"
                                  "    print('bytearray: MemoryError')\ntry:\n    big = torch.empty(2**36, dtype=torch.uint8).fill_(1)\n"
                                  "except Exception as error:\n    print('torch:', type(error).__name__)\n" + WRONG_SCALE,
                         "count_weights": WRONG_COUNT}, None, 0, None),
        "huge_output": ({"scale": "print('x' * 1_000_000)\nfor i in range(200_000):\n    print(i, 'All tests passed')\n"
                                  + WRONG_SCALE, "count_weights": WRONG_COUNT}, None, 0, None),
        "read_hidden": ({"scale": read_hidden, "count_weights": WRONG_COUNT}, None, 0, None),
        "write_gradebook": ({"scale": f"import sqlite3\nfor path in ({str(gradebook)!r}, 'gradebook.db', '../gradebook.db'):\n"
                                      "    try:\n        db = sqlite3.connect(path)\n"
                                      "        db.execute('UPDATE grade SET auto_score = 100')\n        db.commit()\n"
                                      "        print('wrote', path)\n    except Exception as error:\n"
                                      "        print('cannot write', path, type(error).__name__)\n" + WRONG_SCALE,
                             "count_weights": WRONG_COUNT}, None, 0, None),
        "tests_tampered": ({"scale": WRONG_SCALE, "count_weights": WRONG_COUNT}, _tamper_tests, 0, None),
        "tests_deleted_honest": ({}, _delete_tests, 6, "solved"),
        "grade_ids": ({"scale": RIGHT_SCALE, "count_weights": RIGHT_COUNT}, _grade_ids, 3, None),
        "fake_pass": ({"scale": "print('scale: visible test passed')\nprint('All tests passed')\n"
                                "print('<script>alert(1)</script>')\n" + WRONG_SCALE,
                       "count_weights": "print('All tests passed')\n" + WRONG_COUNT}, None, 0, None),
        "nbgrader_env": ({"scale": "import json, os\nprint('ENV', json.dumps(dict(os.environ)))\n"
                                   "def scale(x, factor):\n"
                                   "    return x * factor if os.environ.get('NBGRADER_EXECUTION') else x\n",
                          "count_weights": WRONG_COUNT}, None, 0, None),
        "reference_import": ({"scale": "from minillm.fixture_ref import scale",
                              "count_weights": "import importlib\nref = importlib.import_module('minillm.fixture_ref')\n"
                                               "count_weights = ref.count_weights\n"}, None, 0, None),
        "network": ({"scale": "import socket\nfor host in (('1.1.1.1', 80), ('127.0.0.1', 22), ('localhost', 8888)):\n"
                              "    try:\n        socket.create_connection(host, timeout=2)\n        print('connected', host)\n"
                              "    except OSError as error:\n        print('no network', host, error)\n" + WRONG_SCALE,
                     "count_weights": WRONG_COUNT}, None, 0, None),
        "fork_bomb": ({"scale": "import subprocess\nchildren = []\ntry:\n    for _ in range(2000):\n"
                                "        children.append(subprocess.Popen(['sleep', '600']))\nexcept OSError as error:\n"
                                "    print('stopped after', len(children), type(error).__name__)\n" + WRONG_SCALE,
                       "count_weights": WRONG_COUNT}, None, 0, None),
        # Right values, but the caller's tensor is changed: the judge's copy would never see it.
        "in_place": ({"scale": "def scale(x, factor):\n    return x.mul_(factor)\n", "count_weights": RIGHT_COUNT},
                     None, 3, None),
        # Fine on the visible float32 case; on the hidden checks it raises an error that echoes
        # its arguments, and count_weights is wrong, which the hidden check's own message would
        # format with the expected value: neither may reach the feedback.
        "echo_inputs": ({"scale": "import torch\ndef scale(x, factor):\n    if x.dtype == torch.float64:\n"
                                  "        raise ValueError(f'ECHO {x.tolist()} {factor!r}')\n    return x * factor\n",
                         "count_weights": WRONG_COUNT}, None, 1, None),
        "big_file": ({"scale": "try:\n    with open('big.bin', 'wb') as f:\n        for _ in range(64):\n"
                               "            f.write(b'0' * 2**20)\nexcept OSError as error:\n    print('file:', error)\n"
                               + WRONG_SCALE, "count_weights": WRONG_COUNT}, None, 0, None),
    }


def _grade_corpus(root: Path) -> dict:
    master = fx.write_master(root / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    out, scratch = root / "out", root / "scratch"
    scratch.mkdir()
    gradebook = out / "nbgrader" / "gradebook.db"
    subs = root / "subs"  # a flat folder: the student is the attack's name
    for name, (answers, edit, _, start) in _attacks(master, gradebook).items():
        data = fx.submission(chapter, answers, solved=start == "solved")
        if edit:
            data = edit(data)
        fx.write(data, subs / f"{name}__{fx.SLUG}.ipynb")
    fx.write(b'{"cells": [', subs / f"malformed__{fx.SLUG}.ipynb")
    other = Chapter.load("00_history")
    fx.write(fx.submission(other, solved=True), subs / f"wrong_chapter__{fx.SLUG}.ipynb")
    os.environ["MINILLM_GRADER_SECRET"] = SECRET
    try:
        batch = grade_files([subs], out, master=master, jobs=2, limits=LIMITS, scratch=scratch)
    finally:
        os.environ.pop("MINILLM_GRADER_SECRET", None)
    assert not batch.flagged, batch.flagged
    graded = {job.student: outcome for job, outcome in batch.rows}
    return {"results": graded, "out": str(out), "scratch": str(scratch), "master": str(master),
            "gradebook": str(gradebook)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    graded = fx.once(tmp_path_factory, "hostile-corpus", _grade_corpus)
    master = Path(graded["master"])
    return {**graded, "out": Path(graded["out"]), "scratch": Path(graded["scratch"]),
            "gradebook": Path(graded["gradebook"]), "attacks": _attacks(master, Path(graded["gradebook"])),
            "chapter": Chapter.from_master(master, fx.SLUG)}


def learner_outputs(corpus, name) -> str:
    """Everything the learner's own cells printed, from the instructor's copy of the notebook."""
    import nbformat

    path = corpus["out"] / "nbgrader" / "autograded" / name / fx.SLUG / f"{fx.SLUG}.ipynb"
    notebook = nbformat.read(path, as_version=4)
    chapter = corpus["chapter"]
    texts = []
    for cell, master in zip(notebook.cells, chapter.cells):
        if cell.cell_type == "code" and not master.is_test:
            for output in cell.get("outputs", []):
                texts.append(str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", "")))
    return "\n".join(texts)


def flags(outcome) -> set:
    return {f["kind"] for f in outcome["extra_data"]["flags"]}


CASES = ["allclose", "lying_tensor", "custom_exc", "input_transformer", "kernel_hooks", "os_exit", "exit_in_call",
         "sigint_loop", "sigint_call", "memory_bomb", "huge_output", "read_hidden", "write_gradebook",
         "tests_tampered", "tests_deleted_honest", "grade_ids", "fake_pass", "nbgrader_env", "reference_import",
         "network", "fork_bomb", "big_file", "in_place", "echo_inputs", "honest"]


@pytest.mark.parametrize("name", CASES)
def test_no_undeserved_points_and_a_reason_for_each_lost_point(corpus, name):
    outcome = corpus["results"][name]
    deserved = corpus["attacks"][name][2]
    assert outcome["max_score"] == 6, "points come from the master, whatever the notebook claims"
    assert outcome["score"] == deserved, [(t["name"], t["status"], t["output"][:200]) for t in outcome["tests"]]
    assert not outcome["extra_data"].get("grader_error"), outcome["extra_data"].get("grader_error")
    for test in outcome["tests"]:
        assert test["status"] == "passed" or test["output"].strip(), f"{test['name']} lost points without a reason"
    page = (corpus["out"] / "submissions" / f"{name}__{fx.SLUG}" / "feedback.html").read_text()
    assert fx.HIDDEN_MARKER not in page and "BEGIN HIDDEN TESTS" not in page
    assert fx.HIDDEN_MARKER not in json.dumps(outcome)


def test_the_corpus_has_at_least_fifteen_attacks(corpus):
    attacks = [c for c in CASES if c not in ("honest", "tests_deleted_honest")] + ["malformed", "wrong_chapter"]
    assert len(attacks) >= 15 and all(a in corpus["results"] for a in attacks)


def test_patched_comparisons_and_lying_values_do_not_reach_the_checks(corpus):
    for name in ("allclose", "lying_tensor", "kernel_hooks", "custom_exc"):
        reasons = " ".join(t["output"] for t in corpus["results"][name]["tests"])
        assert "wrong values" in reasons or "expected" in reasons or "raised" in reasons, (name, reasons)


def test_hidden_checks_show_their_kind_of_failure_and_no_values(corpus):
    tests = {t["name"]: t["output"] for t in corpus["results"]["echo_inputs"]["tests"]}
    assert tests["scale_hidden"] == "your scale raised ValueError", tests
    assert "ECHO" not in json.dumps(corpus["results"]["echo_inputs"])
    assert tests["count_weights_hidden"] == "AssertionError: a hidden check found a wrong value or a property that does not hold"
    assert "should be 8, got 6" in tests["count_weights_visible"], "visible tests keep their diagnosis"
    page = (corpus["out"] / "submissions" / f"echo_inputs__{fx.SLUG}" / "feedback.html").read_text()
    assert "ECHO [" not in page and "expected 42" not in page  # the answer's own source shows "ECHO {x.tolist()}"


def test_a_function_that_changes_its_input_in_place_is_caught(corpus):
    outcome = corpus["results"]["in_place"]
    scale_tests = [t for t in outcome["tests"] if t["name"].startswith("scale")]
    assert scale_tests and all(t["score"] == 0 for t in scale_tests)
    assert all("changed its argument 1 in place" in t["output"] for t in scale_tests), scale_tests


def test_a_kernel_that_exits_or_hangs_is_stopped_and_reported(corpus):
    results = corpus["results"]
    assert "kernel-died" in flags(results["os_exit"])
    assert "died" in results["os_exit"]["tests"][0]["output"]
    assert "kernel-died" in flags(results["exit_in_call"])
    assert {"cell-timeout", "kernel-stuck"} <= flags(results["sigint_loop"])
    assert "call-timeout" in flags(results["sigint_call"])
    assert any("did not return within" in t["output"] for t in results["sigint_call"]["tests"])


def test_input_transformer_cannot_fake_the_grader(corpus):
    reasons = {t["output"] for t in corpus["results"]["input_transformer"]["tests"]}
    assert all("did not answer" in r or "could not" in r for r in reasons), reasons


def test_memory_file_size_and_process_limits_hold(corpus):
    if not isolation().namespaces:
        pytest.skip(f"process limits need the namespace sandbox: {isolation().reason}")
    memory = learner_outputs(corpus, "memory_bomb")
    assert "bytearray: MemoryError" in memory
    assert "file:" in learner_outputs(corpus, "big_file") and "too large" in learner_outputs(corpus, "big_file").lower()
    assert "stopped after" in learner_outputs(corpus, "fork_bomb")


def test_huge_output_is_cut_while_streaming(corpus):
    outcome = corpus["results"]["huge_output"]
    assert "output-truncated" in flags(outcome)
    kept = learner_outputs(corpus, "huge_output")
    assert len(kept) < 4 * LIMITS.output
    page = corpus["out"] / "submissions" / f"huge_output__{fx.SLUG}" / "feedback.html"
    assert page.stat().st_size < 4 * LIMITS.output + 2 * MiB


def test_hidden_tests_cannot_be_read_from_disk(corpus):
    if not isolation().namespaces:
        pytest.skip(f"a separate root file system needs the namespace sandbox: {isolation().reason}")
    printed = learner_outputs(corpus, "read_hidden")
    assert "found: []" in printed
    assert fx.HIDDEN_MARKER not in printed and "BEGIN HIDDEN TESTS" not in printed


def test_the_gradebook_cannot_be_written_by_the_learner(corpus):
    printed = learner_outputs(corpus, "write_gradebook")
    assert "wrote" not in printed.replace("cannot write", "")
    with sqlite3.connect(corpus["gradebook"]) as db:
        scores = dict(db.execute(
            "SELECT student.id, SUM(grade.auto_score) FROM grade JOIN submitted_notebook ON grade.notebook_id = "
            "submitted_notebook.id JOIN submitted_assignment ON submitted_notebook.assignment_id = "
            "submitted_assignment.id JOIN student ON submitted_assignment.student_id = student.id GROUP BY student.id"))
    for name, outcome in corpus["results"].items():
        assert scores.get(name, 0) == outcome["score"], name


def test_tampered_cells_and_grade_ids_are_flagged(corpus):
    results = corpus["results"]
    assert {"test-cell-edited", "test-cell-missing", "duplicate-grade-id"} <= flags(results["tests_tampered"])
    assert {"duplicate-grade-id", "points-altered", "missing-answer", "unknown-grade-id"} <= flags(results["grade_ids"])
    assert {t["name"]: t["score"] for t in results["grade_ids"]["tests"]} == {
        "scale_visible": 1, "scale_hidden": 2, "count_weights_visible": 0, "count_weights_hidden": 0}


def test_fake_prints_and_markup_do_not_count_or_render(corpus):
    page = (corpus["out"] / "submissions" / f"fake_pass__{fx.SLUG}" / "feedback.html").read_text()
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_the_learner_sees_no_grader_environment_and_no_network(corpus):
    printed = learner_outputs(corpus, "nbgrader_env")
    environment = json.loads(re.search(r"^ENV (\{.*\})$", printed, re.M).group(1))
    assert "NBGRADER_EXECUTION" not in environment
    assert SECRET not in printed and "MINILLM_GRADER_SECRET" not in environment
    assert not {k for k in environment if k.startswith(("PYTEST", "VIRTUAL_ENV", "JPY_"))}
    if isolation().namespaces:
        network = learner_outputs(corpus, "network")
        assert "connected" not in network and "no network" in network
    else:
        assert "no-network-isolation" in flags(corpus["results"]["network"])


def test_reference_import_is_flagged_and_earns_nothing(corpus):
    outcome = corpus["results"]["reference_import"]
    assert "reference-use" in flags(outcome)
    assert all("reference" in t["output"] for t in outcome["tests"] if t["tags"][1] == "scale")


def test_broken_and_foreign_notebooks_score_zero_with_a_reason(corpus):
    malformed = corpus["results"]["malformed"]
    assert malformed["score"] == 0 and "JSON is malformed" in malformed["output"]
    foreign = corpus["results"]["wrong_chapter"]
    assert foreign["score"] == 0 and "not a notebook of chapter" in foreign["output"]
    assert "wrong-chapter" in flags(foreign)


def test_no_process_or_file_is_left_behind(corpus):
    scratch = str(corpus["scratch"])
    assert list(Path(scratch).iterdir()) == []
    assert not fx.processes_mentioning(scratch)
