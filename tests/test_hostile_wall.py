"""One wall-clock limit for a whole submission, and capped messages, whatever the kernel sends.

Each case is graded in one batch with a small notebook limit (the deadline of the whole
submission) and generous cell and call limits, so that only the deadline can end a case on
time. Each must end within the deadline plus :data:`TEARDOWN` (killing the kernel, its
sandbox and its judge; generous, since the machine is loaded) and say why it lost points.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.chapters import Chapter
from autograder.grade import grade_files
from autograder.sandbox import Limits
from autograder.wall import MAX_MESSAGE

from . import grading_fixture as fx

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="hostile-wall")]

MiB = 2**20
DEADLINE = 20
TEARDOWN = 15
LIMITS = Limits(cell_timeout=60, notebook_timeout=DEADLINE, call_timeout=60, memory=768 * MiB, output=256 * 1024)
ROOT = Path(__file__).resolve().parents[1]

RIGHT_SCALE = "def scale(x, factor):\n    return x * factor\n"
GRADED = "'__grader_serve__' in get_ipython().user_ns"  # true once the checks call into the kernel
KERNEL = "_k = get_ipython().kernel\n_p = _k.get_parent()\n"


def _send(channel: str, buffers: str = "", content: str = "{'name': 'stdout', 'text': 'f' * 65536}",
          kind: str = "stream") -> str:
    """Source that sends one message straight down the kernel's ``channel`` socket."""
    socket = "_k.iopub_socket" if channel == "iopub" else "_k.shell_stream"
    extra = ", ident=_k._parent_ident['shell']" if channel == "shell" else ""
    parent = "_p" if channel == "iopub" else "_k.get_parent('shell')"
    return f"_k.session.send({socket}, {kind!r}, {content}, parent={parent}{extra}{buffers})"


DISPLAY = "{'data': {'text/plain': 'x'}, 'metadata': {}}"
CASES = {
    "honest": RIGHT_SCALE,
    # Floods iopub with small messages faster than they are read, and ignores the interrupt.
    "flooded_iopub": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n" + KERNEL + RIGHT_SCALE
                     + "while True:\n    " + _send("iopub") + "\n",
    # A thread that prints forever after its cell returned.
    "prints_forever": "import threading, time\ndef _spam():\n    while True:\n        print('y' * 4096)\n"
                      "        time.sleep(0.001)\nthreading.Thread(target=_spam, daemon=True).start()\n" + RIGHT_SCALE,
    # One message of 300 MiB on iopub.
    "giant_message": KERNEL + _send("iopub", ", buffers=[memoryview(b'z' * (300 * 2**20))]", DISPLAY, "display_data")
                     + "\n" + RIGHT_SCALE,
    # Once a check calls it, the kernel answers no request again.
    "never_replies": "def _drop(*args, **kwargs):\n    return None\n"
                     f"def scale(x, factor):\n    if {GRADED}:\n"
                     "        get_ipython().kernel.shell_handlers['execute_request'] = _drop\n"
                     "    return x * factor\n",
    # Messages of 600 MiB (200 frames of 3 MiB) down the judge's shell socket when a check calls.
    "judge_flood": f"def scale(x, factor):\n    if {GRADED}:\n" + "".join(
        "        " + line + "\n" for line in KERNEL.splitlines()) + "        _big = memoryview(b'j' * (3 * 2**20))\n"
        "        for _ in range(4):\n            " + _send("shell", ", buffers=[_big] * 200", "{'status': 'ok'}",
                                                          "execute_reply") + "\n    return x * factor\n",
}


def _grade(root: Path) -> dict:
    master = fx.write_master(root / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    for name, answer in CASES.items():
        fx.write(fx.submission(chapter, {"scale": answer}, solved=True), root / "subs" / f"{name}__{fx.SLUG}.ipynb")
    batch = grade_files([root / "subs"], root / "out", master=master, jobs=2, limits=LIMITS, course=False)
    return {job.student: outcome for job, outcome in batch.rows}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    return fx.once(tmp_path_factory, "hostile-wall", _grade)


def _seconds(outcome: dict) -> float:
    """The run's wall time: every kernel of the submission, from its sandbox to its removal."""
    return sum(value for key, value in outcome["extra_data"]["seconds"].items() if key.startswith("total"))


def _lost(outcome: dict) -> dict[str, str]:
    return {t["name"]: t["output"] for t in outcome["tests"] if t["score"] < t["max_score"]}


def _kinds(outcome: dict) -> set[str]:
    return {flag["kind"] for flag in outcome["extra_data"]["flags"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_case_ends_within_the_deadline(graded, name):
    outcome = graded[name]
    assert _seconds(outcome) <= DEADLINE + TEARDOWN, (outcome["extra_data"]["seconds"], _lost(outcome))
    assert not outcome["extra_data"].get("grader_error"), outcome["extra_data"]["grader_error"]


def test_an_honest_submission_in_the_same_batch_earns_full_marks(graded):
    outcome = graded["honest"]
    assert outcome["score"] == outcome["max_score"] == 6, _lost(outcome)


def test_a_flood_that_ignores_the_interrupt_is_stopped_with_a_reason(graded):
    """Stopped at the deadline, or earlier when the kernel's own queue of unsent messages
    runs it out of memory: either way every check it costs says why it was not run."""
    lost = _lost(graded["flooded_iopub"])
    assert {"scale_visible", "scale_hidden"} <= set(lost), lost
    assert all(why.startswith("not run: ") for why in lost.values()), lost


def test_a_thread_printing_after_its_cell_costs_no_point_of_right_answers(graded):
    outcome = graded["prints_forever"]
    assert outcome["score"] == 6, _lost(outcome)


def test_a_giant_message_fails_the_submission_with_the_limit_named(graded):
    outcome = graded["giant_message"]
    assert outcome["score"] == 0 and "message-over-limit" in _kinds(outcome), _lost(outcome)
    assert all(f"{MAX_MESSAGE // MiB} MiB in one message" in why for why in _lost(outcome).values()), _lost(outcome)


def test_a_kernel_that_never_replies_keeps_the_checks_that_completed(graded):
    """The rule of a per-cell timeout: a check that completed keeps its points; the checks
    the deadline left unreached score 0 with its reason."""
    outcome = graded["never_replies"]
    scores = {t["name"]: t["score"] for t in outcome["tests"]}
    assert scores["scale_visible"] == 1, _lost(outcome)
    assert "submission-timeout" in _kinds(outcome)
    assert _lost(outcome) and all(f"time limit of {DEADLINE} s" in why for why in _lost(outcome).values())


def test_a_flood_of_giant_messages_to_the_judge_fails_the_submission_with_the_limit_named(graded):
    outcome = graded["judge_flood"]
    assert outcome["score"] == 0 and "message-over-limit" in _kinds(outcome), _lost(outcome)
    assert all(f"{MAX_MESSAGE // MiB} MiB in one message" in why for why in _lost(outcome).values()), _lost(outcome)


def test_a_flood_of_large_messages_does_not_grow_the_graders_memory(tmp_path):
    """200 messages of 40 MiB, from a thread, faster than they are read: the grader refuses
    them unread (the first fails the submission), and its own peak memory stays flat."""
    flood = ("import threading\n" + KERNEL + "_big = memoryview(b'w' * (40 * 2**20))\ndef _push():\n"
             "    for _ in range(200):\n        " + _send("iopub", ", buffers=[_big]", DISPLAY, "display_data")
             + "\nthreading.Thread(target=_push, daemon=True).start()\n" + RIGHT_SCALE)
    master = fx.write_master(tmp_path / "master")
    fx.write(fx.submission(Chapter.from_master(master, fx.SLUG), {"scale": flood}, solved=True),
             tmp_path / "subs" / f"flood__{fx.SLUG}.ipynb")
    script = (
        "import json, resource, sys\nfrom pathlib import Path\n"
        "from autograder.grade import grade_files\nfrom tests.test_hostile_wall import LIMITS\n"
        "root = Path(sys.argv[1])\nbefore = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "batch = grade_files([root / 'subs'], root / 'out', master=root / 'master' / '90_fixture.ipynb',"
        " limits=LIMITS, course=False)\n"
        "grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10\n"
        "print(json.dumps({'grown': grown, 'outcome': batch.of('flood')}))\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["outcome"]["score"] == 0 and "message-over-limit" in _kinds(found["outcome"]), _lost(found["outcome"])
    assert found["grown"] < 200, f"the grader's peak memory grew by {found['grown']} MiB"
