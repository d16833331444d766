"""Batch mode: names that never collide, resume after a kill, --force, gradebook and export."""
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
from autograder.grade import ChapterRef, plan

from . import grading_fixture as fx

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def fixture_chapter(tmp_path_factory):
    master = fx.write_master(tmp_path_factory.mktemp("batch-master"))
    return master, Chapter.from_master(master, fx.SLUG)


def run_cli(*args, cwd=None, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "autograder", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=600, **kwargs)


def test_same_named_files_from_different_folders_never_collide(tmp_path, fixture_chapter):
    master, chapter = fixture_chapter
    a = fx.write(fx.submission(chapter), tmp_path / "a" / f"{fx.SLUG}.ipynb")
    b = fx.write(fx.submission(chapter), tmp_path / "b" / f"{fx.SLUG}.ipynb")
    as_files = plan([a, b], master=master)
    assert len({job.name for job in as_files}) == 2
    assert {job.chapter for job in as_files} == {ChapterRef(fx.SLUG, Path(master).resolve())}
    assert plan([a, b], master=master) == as_files, "names are stable from run to run"
    in_folder = plan([(a, tmp_path), (b, tmp_path)], master=master)
    assert [job.name for job in in_folder] == [f"a__{fx.SLUG}", f"b__{fx.SLUG}"]
    nbgrader_layout = tmp_path / "submitted" / "alice" / fx.SLUG / f"{fx.SLUG}.ipynb"
    fx.write(fx.submission(chapter), nbgrader_layout)
    assert plan([(nbgrader_layout, tmp_path / "submitted")], master=master)[0].student == "alice"


def test_the_chapter_comes_from_the_file_name_never_the_metadata(tmp_path):
    data = fx.submission(Chapter.load("00_history"))
    data["metadata"]["chapter"] = "01_tokenization"
    path = fx.write(data, tmp_path / "00_history.ipynb")
    assert plan([path])[0].chapter == ChapterRef("00_history")
    assert plan([path], chapter="01")[0].chapter == ChapterRef("01_tokenization")


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
    assert not (tmp_path / "out" / "00_history").exists()


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
        fx.write(fx.submission(chapter, solved=index % 2 == 0), subs / f"student{index}" / f"{fx.SLUG}.ipynb")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "autograder", "grade", str(subs), "--out", str(out), "--master", str(master),
               "--jobs", "1", "--quiet"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    first = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             start_new_session=True)
    try:
        while first.poll() is None and not list(out.glob("*/results.json")):
            time.sleep(0.2)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    graded_before = {p.parent.name: p.stat() for p in out.glob("*/results.json")}
    assert 1 <= len(graded_before) < 3, "the run was killed part of the way through"

    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    results = {p.parent.name: json.loads(p.read_text()) for p in out.glob("*/results.json")}
    assert len(results) == 3
    for name, info in graded_before.items():
        assert (out / name / "results.json").stat().st_mtime_ns == info.st_mtime_ns, f"{name} was graded twice"
    assert sorted(r["score"] for r in results.values()) == [0, 6, 6]
    rows = _gradebook_rows(out / "nbgrader")
    assert sorted(rows) == sorted({(f"student{i}__{fx.SLUG}", fx.SLUG) for i in range(3)})
    with open(out / "summary.csv") as stream:
        summary = list(csv.DictReader(stream))
    assert len(summary) == 3 and {row["status"] for row in summary} == {"graded"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(("mg-", "mj-"))], "the killed run's sandbox is swept"
    assert not fx.processes_mentioning(tmp_path), "the killed run's kernel and judge died with it"

    forced = subprocess.run(command + ["--force"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert forced.returncode == 0, forced.stderr
    for name, info in graded_before.items():
        assert (out / name / "results.json").stat().st_mtime_ns != info.st_mtime_ns, "--force grades again"
    assert sorted(_gradebook_rows(out / "nbgrader")) == sorted(rows), "re-grading updates, never duplicates"

    export = subprocess.run([sys.executable, "-m", "nbgrader", "export", "--to", str(tmp_path / "grades.csv")],
                            cwd=out / "nbgrader", capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"})
    assert export.returncode == 0, export.stderr
    with open(tmp_path / "grades.csv") as stream:
        exported = {row["student_id"]: float(row["raw_score"]) for row in csv.DictReader(stream)}
    assert exported == {f"student{i}__{fx.SLUG}": (6.0 if i % 2 == 0 else 0.0) for i in range(3)}


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
    assert "not answered yet" in text and "a hidden check, run when your notebook is graded" in text
    assert "2 of 5 visible checks pass." in text
