"""Hostile notebooks of a real chapter (00): the reference, patched course helpers, lying tensors."""
import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files
from autograder.isolation import isolation
from autograder.sandbox import Limits

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="hostile-00")]

WRONG = {
    "rnn_forward": "def rnn_forward(x, W_xh, W_hh, b_h):\n    return torch.zeros(x.shape[0], x.shape[1], W_hh.shape[0])\n",
    "self_attention": "def self_attention(x):\n    return x\n",
    "attention_parameters": "def attention_parameters(config):\n    return 0\n",
    "ffn_parameters": "def ffn_parameters(config):\n    return 0\n",
    "count_parameters": "def count_parameters(config):\n    return 124_439_808\n",
}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return fx.once(tmp_path_factory, "hostile-00", _grade)


def _grade(root):
    chapter = Chapter.load("00_history")
    cases = {
        # The reference, reached three ways; the other two exercises are the learner's own.
        "reference": {"rnn_forward": "from minillm.history import rnn_forward",
                      "self_attention": "from minillm import history\nself_attention = history.self_attention",
                      "attention_parameters": "import minillm.config as c\n"
                                              "def attention_parameters(config):\n    return c.attention_parameters(config)"},
        # The reference by a name made at run time, and by running the package's source read
        # from disk: neither name is in the answer, so only the package view can stop them.
        "hidden_reference": {**WRONG,
                             "rnn_forward": "import importlib\nref = importlib.import_module('minillm.' + 'his' + 'tory')\n"
                                            "def rnn_forward(x, W_xh, W_hh, b_h):\n    return ref.rnn_forward(x, W_xh, W_hh, b_h)\n",
                             "self_attention": "import minillm, pathlib\nspace = {}\n"
                                               "exec((pathlib.Path(minillm.__file__).parent / ('his' + 'tory.py')).read_text(), space)\n"
                                               "def self_attention(x):\n    return space['self_' + 'attention'](x)\n",
                             "count_parameters": "import importlib\n"
                                                 "def count_parameters(config):\n"
                                                 "    return getattr(importlib.import_module('minillm.con' + 'fig'), 'count_' + 'parameters')(config)\n",
                             # Exercises that count_parameters builds on: the kernel's package
                             # holds the learner's own answers to them, never their solutions.
                             "attention_parameters": "import importlib\n"
                                                     "def attention_parameters(config):\n"
                                                     "    module = importlib.import_module('minillm.con' + 'fig')\n"
                                                     "    return getattr(module, 'attention_' + 'parameters')(config)\n",
                             "ffn_parameters": "import minillm, pathlib\nheld = {}\n"
                                               "exec((pathlib.Path(minillm.__file__).parent / ('con' + 'fig.py')).read_text(), held)\n"
                                               "def ffn_parameters(config):\n    return held['ffn_' + 'parameters'](config)\n"},
        "patched_helpers": {**WRONG, "rnn_forward": "import numpy, torch\nimport course_runtime as course\n"
                            "course.expect_close = course.expect_equal = lambda *a, **k: None\n"
                            "course.close = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True\n"
                            "torch.isclose = lambda a, b, **k: torch.ones_like(a, dtype=torch.bool)\n"
                            + WRONG["rnn_forward"]},
        "lying_tensor": {**WRONG, "self_attention": "class Liar(torch.Tensor):\n"
                         "    @classmethod\n    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
                         "        out = super().__torch_function__(func, types, args, kwargs)\n"
                         "        return True if func.__name__ in ('allclose', 'equal', '__eq__') else out\n"
                         "def self_attention(x):\n    return torch.zeros_like(x).as_subclass(Liar)\n"},
    }
    for name, answers in cases.items():
        data = fx.submission(chapter, answers, solved=name == "reference")
        fx.write(data, root / "subs" / f"{name}__00_history.ipynb")
    limits = Limits(cell_timeout=60, notebook_timeout=240, call_timeout=30)
    batch = grade_files([root / "subs"], root / "out", jobs=2, limits=limits, course=False)
    return {name: batch.of(name) for name in cases}


def scores(outcome):
    return {t["name"]: t["score"] for t in outcome["tests"]}


def test_the_reference_earns_nothing_and_is_flagged(graded):
    outcome = graded["reference"]
    own = {"ffn_parameters_visible", "ffn_parameters_hidden", "count_parameters_visible", "count_parameters_hidden"}
    assert {k for k, v in scores(outcome).items() if v} == own
    assert outcome["score"] == 7
    flagged = {f["cell"] for f in outcome["extra_data"]["flags"] if f["kind"] == "reference-use"}
    assert {"rnn_forward", "self_attention", "attention_parameters"} <= flagged
    assert all("reference" in t["output"] for t in outcome["tests"] if t["score"] == 0)


def test_the_reference_hidden_from_the_scan_finds_only_the_learners_code(graded):
    """With namespaces the kernel sees the package view: the graded chapter's exercises are
    the learner's own answers there (or stubs), and later chapters are absent."""
    if not isolation().namespaces:
        pytest.skip("without namespaces the grader cannot lay the package view over the package")
    outcome = graded["hidden_reference"]
    assert outcome["score"] == 0, [(t["name"], t["output"]) for t in outcome["tests"] if t["score"]]
    assert not outcome["extra_data"].get("grader_error")


@pytest.mark.parametrize("name", ["patched_helpers", "lying_tensor"])
def test_patched_helpers_and_lying_tensors_earn_nothing(graded, name):
    outcome = graded[name]
    assert outcome["score"] == 0, [(t["name"], t["output"]) for t in outcome["tests"] if t["score"]]
    assert all(t["output"] for t in outcome["tests"])
    assert not outcome["extra_data"].get("grader_error")
