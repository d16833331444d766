"""Batch mode: the accepted layouts, names that never collide, resume after a kill, --force,
gradebook and export."""
import csv
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autograder.chapters import Chapter
from autograder.collect import ChapterRef, batch

from . import grading_fixture as fx

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fixture_chapter(tmp_path_factory):
    master = fx.write_master(tmp_path_factory.mktemp("batch-master"))
    return master, Chapter.from_master(master, fx.SLUG)


def run_cli(*args, cwd=None, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=600, **kwargs)


def test_the_three_layouts_name_the_student_and_nothing_else_does(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    slug = fx.SLUG
    course = tmp_path / "course"
    alice = fx.write(fx.submission(chapter), course / "submitted" / "alice" / slug / f"{slug}.ipynb")
    fx.write(fx.submission(chapter), course / "source" / slug / f"{slug}.ipynb")   # a course directory's own
    flat = fx.write(fx.submission(chapter), tmp_path / "flat" / f"bob__{slug}.ipynb")
    single = fx.write(fx.submission(chapter), tmp_path / "anything.ipynb")
    planned = batch([course, tmp_path / "flat", single], master=master)
    assert [(j.student, j.layout, j.path, j.name) for j in planned.jobs] == [
        ("alice", "nbgrader", str(alice), f"alice__{slug}"), ("bob", "flat", str(flat), f"bob__{slug}"),
        ("anything", "single", str(single), f"anything__{slug}")]
    assert planned.flagged == [], "a course directory is read through its submitted/ folder"
    assert batch([course / "submitted"], master=master).jobs == planned.jobs[:1]
    assert batch([course, tmp_path / "flat", single], master=master) == planned, "plans are stable"


def test_same_named_files_are_one_student_twice_and_neither_is_graded(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    a = fx.write(fx.submission(chapter), tmp_path / "a" / f"carol__{fx.SLUG}.ipynb")
    b = fx.write(fx.submission(chapter), tmp_path / "b" / f"carol__{fx.SLUG}.ipynb")
    planned = batch([a, b, a], master=master)
    [job] = planned.jobs
    assert (job.student, job.path, job.layout) == ("carol", "", "duplicate")
    assert str(a) in job.problem and str(b) in job.problem
    assert sorted(f.path for f in planned.flagged) == sorted([str(a), str(b)])
    assert {f.kind for f in planned.flagged} == {"duplicate-submission"}


def test_only_the_layouts_are_graded_and_the_rest_is_flagged(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    slug, folder = fx.SLUG, tmp_path / "submitted"
    good = fx.write(fx.submission(chapter), folder / "alice" / slug / f"{slug}.ipynb")
    strays = [fx.write(fx.submission(chapter), folder / "alice" / slug / name)
              for name in ("Untitled.ipynb", f"bob__{slug}.ipynb")]
    strays += [fx.write(fx.submission(chapter), folder / "alice" / f"{slug}.ipynb"),
               fx.write(fx.submission(chapter), folder / "alice" / slug / "bob" / slug / f"{slug}.ipynb"),
               fx.write(fx.submission(chapter), folder / f"{slug}.ipynb"),
               fx.write(fx.submission(chapter), folder / "x" / "y" / "z" / "w" / f"{slug}.ipynb")]
    fx.write(fx.submission(chapter), folder / "alice" / slug / ".ipynb_checkpoints" / f"{slug}-checkpoint.ipynb")
    fx.write(fx.submission(chapter), folder / "bad id" / slug / f"{slug}.ipynb")
    fx.write(b"not a notebook", folder / "alice" / slug / "summary.csv")
    planned = batch([folder], master=master)
    assert [job.path for job in planned.jobs] == [str(good)]
    kinds = {Path(f.path).relative_to(folder).as_posix(): f.kind for f in planned.flagged}
    assert kinds == {**{s.relative_to(folder).as_posix(): "stray-notebook" for s in strays},
                     f"bad id/{slug}/{slug}.ipynb": "bad-student-id"}
    assert all(f.reason for f in planned.flagged)


def test_links_and_special_files_are_never_read(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    slug, folder = fx.SLUG, tmp_path / "submitted"
    bob = fx.write(fx.submission(chapter, solved=True), folder / "bob" / slug / f"{slug}.ipynb")
    (folder / "alice" / slug).mkdir(parents=True)
    (folder / "alice" / slug / f"{slug}.ipynb").symlink_to(bob)
    (folder / "carol").mkdir()
    (folder / "carol" / slug).symlink_to(bob.parent, target_is_directory=True)
    (folder / "dan" / slug).mkdir(parents=True)
    os.mkfifo(folder / "dan" / slug / f"{slug}.ipynb")
    (folder / "bob" / slug / "dangling.ipynb").symlink_to(tmp_path / "nowhere.ipynb")
    planned = batch([folder], master=master)
    jobs = {job.student: job for job in planned.jobs}
    assert set(jobs) == {"alice", "bob", "dan"}
    assert not jobs["bob"].problem
    assert "symbolic link" in jobs["alice"].problem and "not a regular file" in jobs["dan"].problem
    assert {Path(f.path).relative_to(folder).as_posix(): f.kind for f in planned.flagged} == {
        f"carol/{slug}": "symlink", f"bob/{slug}/dangling.ipynb": "symlink"}


def test_the_chapter_comes_from_the_file_name_never_the_metadata(tmp_path):
    data = fx.submission(Chapter.load("00_history"))
    data["metadata"]["chapter"] = "01_tokenization"
    path = fx.write(data, tmp_path / "00_history.ipynb")
    assert batch([path]).jobs[0].chapter == ChapterRef("00_history")
    assert batch([path], chapter="01").jobs[0].chapter == ChapterRef("01_tokenization")


@pytest.mark.parametrize("args, message", [
    (["--jobs", "0"], "argument --jobs: must be a positive integer"),
    (["--jobs", "two"], "argument --jobs: must be a positive integer"),
    (["--cell-timeout", "-1"], "argument --cell-timeout: must be a positive number"),
    (["--chapter", "99"], "no chapter '99'"),
])
def test_bad_arguments_are_refused_with_a_clear_error(tmp_path, args, message):
    notebook = fx.write(b"{}", tmp_path / "00_history.ipynb")
    run = run_cli("grade", notebook, "--out", tmp_path / "out", *args)
    assert run.returncode != 0
    assert message in run.stderr
    assert not (tmp_path / "out" / "submissions").exists()


def test_a_missing_path_is_refused(tmp_path):
    run = run_cli("grade", tmp_path / "nowhere.ipynb", "--out", tmp_path / "out")
    assert run.returncode != 0 and "argument PATH" in run.stderr


def test_check_refuses_an_unknown_target(tmp_path):
    run = run_cli("check", tmp_path / "nothing-here")
    assert run.returncode == 2 and "argument NOTEBOOK|CHAPTER" in run.stderr


def _gradebook_rows(course: Path) -> list[tuple]:
    with sqlite3.connect(course / "gradebook.db") as db:
        return list(db.execute(
            "SELECT student.id, assignment.name FROM submitted_assignment JOIN student ON "
            "submitted_assignment.student_id = student.id JOIN assignment ON "
            "submitted_assignment.assignment_id = assignment.id"))


@pytest.mark.grading
@pytest.mark.xdist_group(name="grade-batch")
def test_a_killed_batch_resumes_without_losing_or_duplicating_a_grade(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    subs = tmp_path / "subs"
    for index in range(3):
        fx.write(fx.submission(chapter, solved=index % 2 == 0), subs / f"student{index}__{fx.SLUG}.ipynb")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out), "--master", str(master),
               "--jobs", "1", "--quiet"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        while first.poll() is None and not list(out.glob("submissions/*/results.json")):
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    graded_before = {p.parent.name: p.stat() for p in out.glob("submissions/*/results.json")}
    assert 1 <= len(graded_before) < 3, "the run was killed part of the way through"

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("submissions/*/results.json")}
    assert len(results) == 3
    for name, info in graded_before.items():
        assert (out / "submissions" / name / "results.json").stat().st_mtime_ns == info.st_mtime_ns, f"{name} was graded twice"
    assert sorted(r["score"] for r in results.values()) == [0, 6, 6]
    rows = _gradebook_rows(out / "nbgrader")
    assert sorted(rows) == sorted({(f"student{i}", fx.SLUG) for i in range(3)})
    with open(out / "summary.csv") as stream:
        summary = list(csv.DictReader(stream))
    assert len(summary) == 3 and {row["status"] for row in summary} == {"graded"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("mg-", "mj-"))], "the killed run's sandbox is swept"
    assert not fx.processes_mentioning(tmp_path), "the killed run's kernel and judge died with it"

    forced = subprocess.run(command + ["--force"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert forced.returncode == 0, forced.stderr
    for name, info in graded_before.items():
        assert (out / "submissions" / name / "results.json").stat().st_mtime_ns != info.st_mtime_ns, "--force grades again"
    assert sorted(_gradebook_rows(out / "nbgrader")) == sorted(rows), "re-grading updates, never duplicates"

    export = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to", str(tmp_path / "grades.csv")],
                            cwd=out / "nbgrader", capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert export.returncode == 0, export.stderr
    with open(tmp_path / "grades.csv") as stream:
        exported = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(stream)}
    assert exported == {f"student{i}": (6.0 if i % 2 == 0 else 0.0) for i in range(3)}


@pytest.mark.grading
def test_check_reports_each_exercise_with_the_visible_checks_only(tmp_path):
    import io

    from autograder.check import report
    from autograder.sandbox import Limits

    chapter = Chapter.load("00_history")
    solved = {c.grade_id: c.source for c in chapter.answers if c.grade_id in ("rnn_forward", "ffn_parameters")}
    solved["self_attention"] = "def self_attention(x):\n    return x\n"
    path = fx.write(fx.submission(chapter, solved), tmp_path / "00_history.ipynb")
    printed = io.StringIO()
    outcome = report(str(path), Limits(cell_timeout=60, call_timeout=60), stream=printed)
    assert outcome["checks"] == {"rnn_forward_visible": True, "self_attention_visible": False,
                                 "attention_parameters_visible": False, "ffn_parameters_visible": True,
                                 "count_parameters_visible": False}
    text = printed.getvalue()
    assert "self_attention_visible: CheckFailed: self_attention: values differ" in text
    assert "a hidden check, run when your notebook is graded" in text
    for unanswered in ("attention_parameters", "count_parameters"):
        assert f"\n  ✗ {unanswered}_visible: not answered yet\n" in text, text
    assert "2 of 5 visible checks pass." in text


def test_a_single_file_named_as_the_flat_layout_tells_its_student_and_chapter(tmp_path):
    path = tmp_path / "alice__00_history.ipynb"
    path.write_text("{}")
    [job] = batch([path]).jobs
    assert (job.student, job.chapter.slug, job.layout) == ("alice", "00_history", "single")


@pytest.mark.grading
def test_check_says_not_answered_yet_for_a_stub_and_exits_0(tmp_path):
    """Chapter 05's answer cells edited (a comment added) but still the release's stubs: every
    visible check says "not answered yet", never the hint it gives for a mistake (swiglu's
    check turns a RuntimeError into "a weight used untransposed?", and the stub's
    NotImplementedError is a RuntimeError). Failing checks are the report, not an error."""
    slug = "05_feed_forward"
    chapter = Chapter.load(slug)
    edited = {c.grade_id: "# still working on it\n" + c.learner_source for c in chapter.answers}
    fx.write(fx.submission(chapter, edited), tmp_path / "work" / slug / f"{slug}.ipynb")
    run = run_cli("check", "05", "--work", tmp_path / "work")
    assert run.returncode == 0, run.stderr[-3000:]
    visible = [c.grade_id for c in chapter.cells if c.kind == "visible"]
    lines = [line.strip() for line in run.stdout.splitlines() if line.strip().startswith("✗")]
    assert lines == [f"✗ {grade_id}: not answered yet" for grade_id in visible], run.stdout
    assert f"0 of {len(visible)} visible checks pass." in run.stdout
