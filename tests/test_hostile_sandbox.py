"""The hostile corpus, round 3: the sandbox and the judge, generated on the fixture chapter.

One small batch of two notebooks (``--jobs 2``) holds the learner cells that need the
sandbox's network (a socket on 127.0.0.1 and a 2-rank gloo all-reduce) and answers that try
to tell whether they are being graded, beside correct answers so slow that their checks need
a time budget each. Cheaper cases below it start the sandbox without a kernel: its user ids, which
processes it kills, and its CPU share.
"""
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder import cpu, processes
from autograder.chapters import Chapter
from autograder.failures import call_failure
from autograder.grade import grade_files
from autograder.isolation import isolation
from autograder.sandbox import Limits, Sandbox

from . import grading_fixture as fx
from .test_hostile import flags, learner_outputs

pytestmark = [pytest.mark.grading, pytest.mark.xdist_group(name="hostile-sandbox")]

MiB = 2**20
# One call may take 2 s, one check cell 4 s in the judge, its calls included.
LIMITS = Limits(cell_timeout=30, notebook_timeout=90, call_timeout=2, check_timeout=4, memory=768 * MiB,
                file_size=8 * MiB, processes=128, output=256 * 1024, tmp=64 * MiB)


def slow(seconds: float, body: str, signature: str) -> str:
    """A right answer that takes ``seconds`` (just under the call limit) on every call."""
    return f"import time\ndef {signature}:\n    time.sleep({seconds})\n{body}"


SLOW_SCALE = slow(1.6, "    return x * factor\n", "scale(x, factor)")
# Each call under the 2 s limit, but the hidden check's three calls take 5.1 s of its 4.
SLOWER_COUNT = slow(1.7, "    return d_in * d_out + (d_out if bias else 0)\n", "count_weights(d_in, d_out, bias=True)")

# Tells of being graded: the sandbox's user id, its working folder, the grader's frames on the
# stack of a call. They are real; what matters is that they gain nothing.
DETECT = """
import inspect, os, sys
def graded():
    tells = []
    if os.getuid() >= 2_000_000_000:
        tells.append('uid')
    if os.path.basename(os.getcwd()) == 'work' or '/share/' in os.getcwd():
        tells.append('cwd')
    if any('grader' in frame.filename for frame in inspect.stack()):
        tells.append('stack')
    return tells
print('TELLS', graded())
"""
# Right only when it believes it is not graded: under grading it returns the wrong thing.
RIGHT_UNLESS_GRADED = """
def count_weights(d_in, d_out, bias=True):
    right = d_in * d_out + (d_out if bias else 0)
    return right + 1 if graded() else right
"""
# The realistic attack: wrong in the notebook, but when graded it looks for the reference
# (a module by a computed name, a file on disk, the master or a solution, the grader's frames)
# and returns the reference's value.
REFERENCE_WHEN_GRADED = DETECT + """
import glob, importlib, gc
def find_reference():
    found = []
    try:
        found.append(importlib.import_module('.'.join(['minillm', 'fixture' + '_ref'])).scale)
    except Exception:
        pass
    import time
    deadline = time.monotonic() + 0.8
    roots = [p for p in sys.path if p] + ['/tmp', '/root', '/home', '/work', '/srv', os.path.dirname(os.getcwd())]
    own = os.path.realpath(os.getcwd())
    names = ('fixture' + '_ref.py', '90_' + 'fixture.ipynb')
    for root in roots:
        for folder, subfolders, files in os.walk(root):
            if time.monotonic() > deadline:
                break
            if os.path.realpath(folder).startswith(own):
                continue
            for name in files:
                if name in names or (folder.endswith('solutions') and name.endswith('.ipynb')):
                    try:
                        text = open(os.path.join(folder, name)).read()
                    except Exception:
                        continue
                    if 'x * ' + 'factor' in text and 'BEGIN ' + 'SOLUTION' in text:
                        found.append(os.path.join(folder, name))
    for frame in inspect.stack():
        for value in list(frame.frame.f_globals.values()) + list(frame.frame.f_locals.values()):
            if callable(value) and getattr(value, '__name__', '') == 'scale' and value is not scale:
                found.append(value)
    for value in gc.get_objects():
        if inspect.isfunction(value) and value.__name__ == 'scale' and value.__module__ != '__main__' and (
                'minillm' in str(value.__module__) or 'fixture' in value.__code__.co_filename):
            found.append(value)
    return found
def scale(x, factor):
    if graded():
        found = find_reference()
        print('FOUND', [str(f)[:80] for f in found], file=sys.stderr)
        for thing in found:
            if callable(thing):
                return thing(x, factor)
        if found:  # a reference's source, located on disk: its solution
            return x * factor
    return x + factor
def kinds(found):
    named = []
    for thing in found:
        if not callable(thing):
            named.append('file')
            continue
        if getattr(thing, '__code__', None) is not None and thing.__code__.co_code == scale.__code__.co_code:
            named.append('own')  # this very answer, exported into the package view
            continue
        try:
            thing(1.0, 2.0)
            named.append('reference')
        except NotImplementedError:
            named.append('stub')
        except Exception:
            named.append('reference')
    return named
print('FOUND IN NOTEBOOK', kinds(find_reference()))
"""

# A learner cell: talk to itself on 127.0.0.1, try to reach the outside, then run two
# processes that all-reduce a tensor with gloo over the loopback (as a DDP cell does).
NETWORK_AND_GLOO = '''
import json, os, socket, multiprocessing
import torch, torch.distributed as dist
report = {"interfaces": [name for _, name in socket.if_nameindex()]}
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(1)
client = socket.create_connection(server.getsockname(), timeout=2)
peer, _ = server.accept()
client.sendall(b"ping")
report["loopback"] = peer.recv(4).decode()
for host in ("10.0.0.1", "1.1.1.1", "192.168.1.1"):
    try:
        socket.create_connection((host, 80), timeout=2)
        report[host] = "connected"
    except OSError as error:
        report[host] = type(error).__name__
def _rank(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    queue.put((rank, value.item()))
    dist.destroy_process_group()
free = socket.socket()
free.bind(("127.0.0.1", 0))
port = free.getsockname()[1]
free.close()
try:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    ranks = [context.Process(target=_rank, args=(rank, port, queue)) for rank in range(2)]
    for process in ranks:
        process.start()
    report["all_reduce"] = sorted(queue.get(timeout=20) for _ in ranks)
    for process in ranks:
        process.join(10)
    report["exit_codes"] = [process.exitcode for process in ranks]
except Exception as error:
    report["all_reduce"] = f"{type(error).__name__}: {error}"
print("REPORT " + json.dumps(report))
'''


def _cases() -> dict:
    """name → (answers, points deserved)."""
    return {
        # Right answers, each call just under the call limit: each check has a budget of its
        # own, so scale earns its 3 points; count_weights' hidden check makes three calls that
        # outrun that check's budget: its 2 points only are lost, flagged as the learner's.
        "slow": ({"scale": SLOW_SCALE, "count_weights": SLOWER_COUNT}, 4),
        # Its scale cell first uses the loopback and runs gloo; both answers then tell they
        # are graded: scale hunts for the reference, count_weights returns a wrong value.
        # Neither earns a point.
        "gloo_detect": ({"scale": NETWORK_AND_GLOO + REFERENCE_WHEN_GRADED, "count_weights": RIGHT_UNLESS_GRADED}, 0),
    }


def _grade(root: Path) -> dict:
    master = fx.write_master(root / "master")
    chapter = Chapter.from_master(master, fx.SLUG)
    subs, out, scratch = root / "subs", root / "out", root / "scratch"
    scratch.mkdir()
    for name, (answers, _) in _cases().items():
        fx.write(fx.submission(chapter, answers), subs / f"{name}__{fx.SLUG}.ipynb")
    started = time.monotonic()
    batch = grade_files([subs], out, master=master, jobs=2, limits=LIMITS, scratch=scratch)
    return {"results": {job.student: outcome for job, outcome in batch.rows}, "out": str(out),
            "master": str(master), "scratch": str(scratch), "seconds": time.monotonic() - started}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    done = fx.once(tmp_path_factory, "hostile-sandbox", _grade)
    master = Path(done["master"])
    return {**done, "out": Path(done["out"]), "chapter": Chapter.from_master(master, fx.SLUG)}


def needs_namespaces():
    if not isolation().namespaces:
        pytest.skip(f"needs the namespace sandbox: {isolation().reason}")


@pytest.mark.parametrize("name", sorted(_cases()))
def test_each_case_scores_what_it_earns(graded, name):
    outcome = graded["results"][name]
    assert outcome["score"] == _cases()[name][1], [(t["name"], t["output"][:300]) for t in outcome["tests"]]
    assert not outcome["extra_data"].get("grader_error"), outcome["extra_data"].get("grader_error")


def test_the_loopback_is_up_and_a_two_rank_gloo_run_completes(graded):
    needs_namespaces()
    printed = learner_outputs(graded, "gloo_detect")
    found = re.search(r"^REPORT (\{.*\})$", printed, re.M)
    assert found, printed[-2000:]
    report = json.loads(found.group(1))
    assert report["interfaces"] == ["lo"], report
    assert report["loopback"] == "ping", report
    for host in ("10.0.0.1", "1.1.1.1", "192.168.1.1"):
        assert report[host] != "connected", report
    assert report["all_reduce"] == [[0, 3.0], [1, 3.0]], report
    assert report["exit_codes"] == [0, 0], report


def test_slow_right_answers_score_what_they_earn_with_a_budget_per_check(graded):
    """Every call just under the call limit: scale's checks pass; count_weights' hidden check
    outruns its own budget with the learner's calls, which is the learner's failure, flagged,
    and costs that check only."""
    outcome = graded["results"]["slow"]
    scores = {t["name"]: t["score"] for t in outcome["tests"]}
    assert scores == {"scale_visible": 1, "scale_hidden": 2, "count_weights_visible": 1, "count_weights_hidden": 0}, \
        [(t["name"], t["output"]) for t in outcome["tests"]]
    hidden = next(t for t in outcome["tests"] if t["name"] == "count_weights_hidden")
    assert "time budget of 4 s" in hidden["output"] and "your code" in hidden["output"], hidden["output"]
    flagged = [f for f in outcome["extra_data"]["flags"] if f["kind"] == "check-timeout"]
    assert [f["cell"] for f in flagged] == ["count_weights_hidden"], outcome["extra_data"]["flags"]
    assert "call-timeout" not in flags(outcome)
    assert not outcome["extra_data"].get("grader_error")


def test_detecting_the_grader_gains_nothing(graded):
    needs_namespaces()
    outcome = graded["results"]["gloo_detect"]
    assert outcome["score"] == 0, [(t["name"], t["output"]) for t in outcome["tests"]]
    printed = learner_outputs(graded, "gloo_detect")
    tells = json.loads(re.search(r"^TELLS (\[.*\])$", printed, re.M).group(1).replace("'", '"'))
    assert "uid" in tells, tells  # the answer can tell it is graded: that is not what protects
    # The hunt, run in the notebook, finds at most the package view's stub or this answer's
    # own export: no file of the solution, and no function that computes the answer.
    found = re.search(r"^FOUND IN NOTEBOOK (\[.*\])$", printed, re.M)
    assert found and set(json.loads(found.group(1).replace("'", '"'))) <= {"stub", "own"}, printed[-2000:]


# --------------------------------------------------------------------- without a kernel
SMALL = Limits(memory=256 * MiB, processes=64, tmp=16 * MiB)


def _wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _running(box: Sandbox) -> None:
    """Wait until the sandbox's process has started, then hold its PID namespace, as the
    grader does once the learner's kernel answers."""
    _wait_for(box.work / "started")
    box.hold_pid_namespace()


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_killing_a_sandbox_spares_other_processes_of_its_user_id(tmp_path):
    """A process of the same user id outside the sandbox (a directory-service user whose id
    it happens to be) survives; every process inside, a detached grandchild too, dies."""
    needs_namespaces()
    box = Sandbox(SMALL, parent=tmp_path)
    stranger = subprocess.Popen(["sleep", "60"], user=box.uid, group=box.gid)
    inside = None
    try:
        script = box.work / "run.py"
        script.write_text("import os, subprocess, time\n"
                          "if os.fork() == 0:\n    os.setsid()\n    subprocess.Popen(['sleep', '60'])\n"
                          "    open('started', 'w').close()\n    time.sleep(60)\n"
                          "time.sleep(60)\n")
        box.chown(script)
        inside = subprocess.Popen(box.command([sys.executable, str(script)]))
        _running(box)
        assert len(set(_processes_of(box.uid)) - {stranger.pid}) >= 3
        box.kill_all()
        deadline = time.monotonic() + 5
        while set(_processes_of(box.uid)) - {stranger.pid} and time.monotonic() < deadline:
            time.sleep(0.05)
        assert set(_processes_of(box.uid)) - {stranger.pid} == set(), "a process of the sandbox survived"
        assert stranger.poll() is None, "kill_all killed a process outside the sandbox"
    finally:
        stranger.kill()
        stranger.wait()
        if inside is not None:
            inside.kill()
            inside.wait()
        box.remove()


def test_a_removed_sandbox_never_kills_a_later_sandbox_that_reuses_its_namespace_number(tmp_path):
    """The kernel gives a freed PID namespace's number to the next new namespace at once. A
    sandbox whose processes died before it was removed must not take a sandbox started
    since for its own: it holds its namespace, so the number is not freed until then."""
    needs_namespaces()
    first, second = Sandbox(SMALL, parent=tmp_path), Sandbox(SMALL, parent=tmp_path)
    later = None
    try:
        ended = _in_sandbox(first, "open('started', 'w').close()\n")
        _running(first)
        ended.wait()
        later = _in_sandbox(second, "import time\nopen('started', 'w').close()\ntime.sleep(60)\n")
        _running(second)
        assert second.pid_namespace() and second.pid_namespace() != first.pid_namespace()
        first.remove()
        time.sleep(0.2)
        assert later.poll() is None, "removing a finished sandbox killed a later one"
    finally:
        if later is not None:
            later.kill()
            later.wait()
        first.remove()
        second.remove()


def test_a_sandbox_whose_namespace_was_never_held_kills_nothing(tmp_path):
    """Before its process is known to run, a sandbox names no namespace: the note its
    launcher left may by then name another sandbox's."""
    needs_namespaces()
    first, second = Sandbox(SMALL, parent=tmp_path), Sandbox(SMALL, parent=tmp_path)
    later = _in_sandbox(second, "import time\nopen('started', 'w').close()\ntime.sleep(60)\n")
    try:
        _running(second)
        (first.base / "pidns").write_text(second.pid_namespace())
        assert first.pid_namespace() == "" and first.pids() == []
        first.remove()
        time.sleep(0.2)
        assert later.poll() is None, "a sandbox killed the processes its stale note named"
    finally:
        later.kill()
        later.wait()
        first.remove()
        second.remove()


def test_sandbox_user_ids_are_dedicated_and_checked_unused(tmp_path, monkeypatch):
    needs_namespaces()
    import pwd

    low, high = processes.UID_RANGE
    assert low > 2_000_200_000 and high < 2**31, "the range must clear directory services' id mapping"
    box = Sandbox(SMALL, parent=tmp_path)
    try:
        assert low <= box.uid < high
        with pytest.raises(KeyError):
            pwd.getpwuid(box.uid)
    finally:
        box.remove()
    # An id that a running process owns is never drawn; nor one this grader already uses.
    stranger = subprocess.Popen(["sleep", "60"], user=low, group=low)
    try:
        monkeypatch.setattr(processes, "UID_RANGE", (low, low + 2))
        assert processes.draw_uid() == low + 1
        with pytest.raises(RuntimeError, match="no unused user id"):
            processes.draw_uid()
    finally:
        processes.release_uid(low + 1)
        stranger.kill()
        stranger.wait()
    # An id with a passwd entry (root's) is never drawn.
    monkeypatch.setattr(processes, "UID_RANGE", (0, 1))
    with pytest.raises(RuntimeError):
        processes.draw_uid()


def _in_sandbox(box: Sandbox, source: str) -> subprocess.Popen:
    script = box.work / "run.py"
    script.write_text(source)
    box.chown(script)
    return subprocess.Popen(box.command([sys.executable, str(script)]))


def test_each_sandbox_of_a_batch_gets_its_own_cgroup_of_equal_cpu_weight(tmp_path):
    """Under --jobs > 1 every sandbox's processes sit in a cgroup of their own with the same
    weight as every other sandbox's; without a usable cgroup every result says so."""
    needs_namespaces()
    boxes = [Sandbox(SMALL, jobs=2, parent=tmp_path) for _ in range(2)]
    running = []
    try:
        share = cpu.cpu_share()
        if share.kind == "none":
            assert all(any(f["kind"] == "no-cpu-share" for f in box.flags) for box in boxes)
            pytest.skip(f"no usable cgroup here: {share.reason}")
        weight = "cpu.weight" if share.kind == "cgroup2" else "cpu.shares"
        for box in boxes:
            running.append(_in_sandbox(box, "import time\nopen('started', 'w').close()\ntime.sleep(60)\n"))
        for box in boxes:
            _running(box)
            assert box.cgroup and Path(box.cgroup).parent == Path(share.parent)
            members = {int(pid) for pid in (Path(box.cgroup) / "cgroup.procs").read_text().split()}
            assert set(box.pids()) and set(box.pids()) <= members, (box.pids(), members)
            assert not any(f["kind"] == "no-cpu-share" for f in box.flags)
        assert len({(Path(box.cgroup) / weight).read_text() for box in boxes}) == 1
        assert boxes[0].cgroup != boxes[1].cgroup
    finally:
        for process in running:
            process.kill()
            process.wait()
        for box in boxes:
            box.remove()
    assert not any(Path(box.cgroup).exists() for box in boxes if box.cgroup), "a sandbox's cgroup was left behind"


def test_a_limit_that_fires_under_load_is_told_from_the_learners_own_code(tmp_path):
    """The CPU a sandbox got over a wall-clock limit, and how long it waited for one: a
    starved neighbour (runnable, waiting) reads as 'under load', a sleep does not."""
    needs_namespaces()
    box = Sandbox(SMALL, parent=tmp_path)
    hogs = []
    try:
        busy = _in_sandbox(box, "import time\nopen('started', 'w').close()\nwhile True:\n    pass\n")
        _running(box)
        hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(4 * (os.cpu_count() or 1))]
        time.sleep(0.3)
        start = box.cpu_sample()
        time.sleep(1.0)
        note, loaded = cpu.load_note(start, box.cpu_sample())
        assert loaded and note.startswith("limit fired under load: the kernel got"), note
        assert re.search(r"got \d+% of a core", note), note
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        busy.kill()
        busy.wait()
        box.remove()
    box = Sandbox(SMALL, parent=tmp_path)
    try:
        sleeper = _in_sandbox(box, "import time\nopen('started', 'w').close()\ntime.sleep(60)\n")
        _running(box)
        start = box.cpu_sample()
        time.sleep(0.5)
        note, loaded = cpu.load_note(start, box.cpu_sample())
        assert not loaded and "waiting on something" in note, note
    finally:
        sleeper.kill()
        sleeper.wait()
        box.remove()


def test_a_judge_that_dies_keeps_the_verdicts_it_reached(tmp_path):
    """The judge writes each verdict as it has it: one that dies in its third cell keeps the
    first two; the second, whose own code overran its budget, is the grader's fault."""
    from autograder.judges import partial_verdicts

    cells = [("ok = 1", True), ("while True:\n    pass", True), ("import os\nos._exit(3)", True), ("ok = 2", True)]
    plan = {"cells": [{"index": i, "grade_id": f"check_{i}", "test": test, "source": source, "early": False}
                      for i, (source, test) in enumerate(cells)],
            "names": [], "uid": None, "req_dir": str(tmp_path), "rep_dir": str(tmp_path), "call_timeout": 1,
            "check_timeout": 1, "seed": 1, "verdicts": str(tmp_path / "verdicts.jsonl")}
    script = ("import json, sys\nfrom autograder import judge\nplan = json.loads(sys.argv[1])\n"
              "judge.run(plan, {'alive': False, 'reason': 'not started'}, judge.shell_for(plan), [])\n")
    run = subprocess.run([sys.executable, "-c", script, json.dumps(plan)], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert run.returncode == 3, run.stderr[-2000:]
    kept = partial_verdicts(tmp_path / "verdicts.jsonl")
    assert [(v["grade_id"], v["status"]) for v in kept] == [("check_0", "passed"), ("check_1", "failed")], kept
    assert kept[1].get("judge_fault") and not kept[1].get("student"), kept[1]


def _baseline_in_a_new_process(env: dict) -> tuple[int, float]:
    """``baseline_virtual_bytes()`` in a fresh interpreter (a new hash seed): its value, and
    how many measuring subprocesses it started."""
    script = ("import subprocess\nfrom autograder import isolation\nstarted = []\nrun = subprocess.run\n"
              "subprocess.run = lambda *a, **k: started.append(a) or run(*a, **k)\n"
              "print(isolation.baseline_virtual_bytes(), len(started))\n")
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    value, measured = done.stdout.split()
    return int(value), int(measured)


def test_the_kernels_address_space_baseline_is_measured_once_per_installation(tmp_path):
    """Each grader or self-check process reuses the measurement (seconds: it imports torch),
    and never takes it from a file that another user could have written."""
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path), "PYTHONHASHSEED": "random"}
    first, measured = _baseline_in_a_new_process(env)
    assert measured == 1 and first > 0
    again, measured = _baseline_in_a_new_process(env)
    assert (again, measured) == (first, 0), "a second process measured again"
    cached = next((tmp_path / "minillm").glob("grader-vm-*.json"))
    cached.write_text('{"bytes": 1}')
    os.chmod(cached, 0o666)
    planted, measured = _baseline_in_a_new_process(env)
    assert measured == 1 and planted > 1, "a file others may write set the baseline"


# --------------------------------------------------------------------- System V IPC and /dev/shm
# A learner's script that talks to System V shared memory through libc: ``shm(key, size)``
# creates (or with size 0 finds) a segment open to every user and returns its id, or -errno.
SYSV = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
IPC_CREAT = 0o1000
def shm(key, size):
    shmid = libc.shmget(key, ctypes.c_size_t(size), (IPC_CREAT | 0o666) if size else 0)
    return shmid if shmid >= 0 else -ctypes.get_errno()
def write(shmid, data):
    address = libc.shmat(shmid, None, 0)
    ctypes.memmove(address, data, len(data))
    libc.shmdt(ctypes.c_void_p(address))
def read(shmid, size):
    address = libc.shmat(shmid, None, 0)
    data = ctypes.string_at(address, size)
    libc.shmdt(ctypes.c_void_p(address))
    return data
"""
SECRET = b"the reference says 42"
KEY = 0x4D47_5348


def _sysv_segments() -> list[dict]:
    """The grader's own namespace's System V shared-memory segments, as /proc/sysvipc/shm lists them."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    header = lines[0].split()
    return [dict(zip(header, line.split())) for line in lines[1:]]


def _sandbox_owned(uid_fields=("uid", "cuid")) -> list[dict]:
    low, high = processes.UID_RANGE
    return [s for s in _sysv_segments() if any(low <= int(s[f]) < high for f in uid_fields)]


def _run_to_end(box: Sandbox, source: str) -> str:
    """Run ``source`` in ``box`` to its end; what it wrote to ``out`` in its folder."""
    process = _in_sandbox(box, source)
    assert process.wait(timeout=60) == 0, "the sandbox's script failed"
    return (box.work / "out").read_text()


def test_a_shared_memory_segment_never_reaches_a_submissions_next_sandbox(tmp_path):
    """The first kernel of a submission writes what it can see into a System V segment under
    a known key; the next kernel, in a new sandbox, finds no segment by that key. Each sandbox
    has its own IPC namespace."""
    needs_namespaces()
    first, second = Sandbox(SMALL, parent=tmp_path), Sandbox(SMALL, parent=tmp_path)
    try:
        wrote = _run_to_end(first, SYSV + f"shmid = shm({KEY}, 4096)\nwrite(shmid, {SECRET!r})\n"
                            "open('out', 'w').write(str(shmid))\n")
        assert int(wrote) >= 0, f"the first sandbox could not create a segment (errno {-int(wrote)})"
        found = _run_to_end(second, SYSV + f"shmid = shm({KEY}, 0)\n"
                            f"open('out', 'w').write(repr(read(shmid, {len(SECRET)})) if shmid >= 0 else 'none')\n")
        assert found == "none", f"the second sandbox read the first one's segment: {found}"
    finally:
        first.remove()
        second.remove()


def test_a_removed_sandbox_leaves_no_shared_memory_behind(tmp_path):
    """A System V segment the learner never removed, and a POSIX one in /dev/shm, are gone
    with the sandbox: none in the grader's namespace is owned by a sandbox's user id, and
    nothing of the sandbox is in the host's /dev/shm."""
    needs_namespaces()
    box = Sandbox(SMALL, parent=tmp_path)
    before = {p.name for p in Path("/dev/shm").iterdir()}
    segments_before = {s["shmid"] for s in _sandbox_owned()}
    try:
        made = _run_to_end(box, SYSV + "from multiprocessing import shared_memory\n"
                           "posix = shared_memory.SharedMemory(name='mg-left', create=True, size=4096)\n"
                           "posix.close()\n"
                           f"shmid = shm({KEY + 1}, 1 << 20)\nwrite(shmid, b'x' * (1 << 20))\n"
                           "open('out', 'w').write(f\"{shmid} {os.path.exists('/dev/shm/mg-left')}\")\n")
        shmid, posix = made.split()
        assert int(shmid) >= 0 and posix == "True", made
    finally:
        box.remove()
    assert [s for s in _sandbox_owned() if s["shmid"] not in segments_before] == [], "a sandbox's segment outlived it"
    left = [p for p in Path("/dev/shm").iterdir() if p.name not in before]
    assert not any(p.name == "mg-left" or p.lstat().st_uid == box.uid for p in left), left


def test_shared_memory_is_capped_at_the_sandboxs_memory_limit(tmp_path):
    """One segment larger than the memory limit, or several that add up to more, cannot be made."""
    needs_namespaces()
    box = Sandbox(SMALL, parent=tmp_path)
    try:
        limit = SMALL.memory
        made = _run_to_end(box, SYSV + f"one = shm(0, {limit + (1 << 20)})\n"
                           f"halves = [shm(0, {limit // 2 + (1 << 20)}) for _ in range(2)]\n"
                           "open('out', 'w').write(' '.join(map(str, [one, *halves])))\n")
        one, first_half, second_half = map(int, made.split())
        assert one < 0, "a segment larger than the memory limit was made"
        assert first_half >= 0 and second_half < 0, "segments adding up to more than the memory limit were made"
    finally:
        box.remove()


def test_the_grader_sweeps_shared_memory_that_a_killed_run_left(tmp_path):
    """Segments and /dev/shm files of a sandbox's user id in the grader's own namespace (an
    earlier grader, killed, or one without IPC namespaces) are removed when grading starts."""
    needs_namespaces()
    import ctypes

    uid = processes.UID_RANGE[0] + 7
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(0, ctypes.c_size_t(4096), 0o1000 | 0o600)
    assert shmid >= 0, ctypes.get_errno()
    stale = Path("/dev/shm") / "mg-stale-test"
    try:
        stale.write_bytes(b"left")
        os.chown(stale, uid, uid)
        buffer = ctypes.create_string_buffer(256)  # struct shmid_ds: owner set by IPC_SET
        assert libc.shmctl(shmid, 2, buffer) == 0  # IPC_STAT
        ctypes.c_uint32.from_buffer(buffer, 4).value = uid  # shm_perm.uid
        ctypes.c_uint32.from_buffer(buffer, 8).value = uid  # shm_perm.gid
        assert libc.shmctl(shmid, 1, buffer) == 0  # IPC_SET
        assert any(int(s["shmid"]) == shmid for s in _sandbox_owned(("uid",)))
        processes.sweep_stale(tmp_path)
        assert not any(int(s["shmid"]) == shmid for s in _sysv_segments()), "the stale segment was kept"
        assert not stale.exists(), "the stale /dev/shm file was kept"
    finally:
        libc.shmctl(shmid, 0, None)
        stale.unlink(missing_ok=True)


# --------------------------------------------------------------------- exception type names
def test_a_hidden_check_shows_no_exception_type_the_learner_defined():
    """An answer that raises ``type(f"S{tuple(x.shape)}{x.dtype}", (Exception,), {})()`` names
    the hidden check's input in its type: a hidden check shows only Python's built-in
    exception names, and no frame name or code line. A visible check keeps the message."""
    from autograder.failures import hidden_reason

    leak = "S(3, 5)torch.float64"
    answer = {"ok": False, "type": leak, "message": "", "frames": [
        {"name": "shape_(3, 5)", "line": 2, "code": "raise type(f'S{tuple(x.shape)}{x.dtype}', (Exception,), {})()"}]}
    error = call_failure(answer, "scale")
    shown = hidden_reason(error, "assert scale(x, 2.0).shape == x.shape")
    assert shown == "your scale raised an exception of a type your code defined", shown
    assert "(3, 5)" not in shown and "float64" not in shown and "shape" not in shown, shown
    assert type(error).__name__ == "StudentError", "a learner's type name would reach the verdict's ename"
    builtin = call_failure({**answer, "type": "ValueError"}, "scale")
    assert hidden_reason(builtin, "") == "your scale raised ValueError" and isinstance(builtin, ValueError)
    assert leak in str(error), "a visible check keeps the learner's own message"


# --------------------------------------------------------------------- submission times
def test_a_back_dated_notebook_is_recorded_with_nbgraders_timestamp_and_its_source(tmp_path):
    """``touch -d 2001-09-09`` back-dates the file; nbgrader's timestamp.txt beside it says
    2030: the time recorded is 2030's, and says it came from timestamp.txt."""
    import datetime

    from autograder.collect import submission_time

    folder = tmp_path / "alice" / fx.SLUG
    folder.mkdir(parents=True)
    notebook = folder / f"{fx.SLUG}.ipynb"
    notebook.write_text("{}")
    subprocess.run(["touch", "-d", "2001-09-09", str(notebook)], check=True)
    when, source = submission_time(notebook)
    assert (datetime.datetime.fromtimestamp(when, datetime.timezone.utc).year, source) == (2001, "file mtime")
    (folder / "timestamp.txt").write_text("2030-01-02 03:04:05.000000 UTC")
    when, source = submission_time(notebook)
    assert datetime.datetime.fromtimestamp(when, datetime.timezone.utc) == \
        datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert source == "nbgrader timestamp.txt"


def test_on_gradescope_the_submission_time_is_gradescopes_own(tmp_path):
    """Gradescope's submission_metadata.json, which the student cannot write, gives the time."""
    import datetime

    from autograder.gradescope import gradescope_time

    (tmp_path / "submission_metadata.json").write_text(json.dumps({"created_at": "2030-01-02T03:04:05.5-07:00"}))
    found = gradescope_time(tmp_path)
    assert found["source"] == "gradescope"
    assert datetime.datetime.fromtimestamp(found["time"], datetime.timezone.utc) == \
        datetime.datetime(2030, 1, 2, 10, 4, 5, 500000, tzinfo=datetime.timezone.utc)
    (tmp_path / "submission_metadata.json").write_text("{not json")
    assert gradescope_time(tmp_path) is None
