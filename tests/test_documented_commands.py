"""Every command README.md (with the docs pages it links for details: measured, platforms,
training, speedrun), docs/grading.md and `make help` show works as written.

Commands are extracted from the documents: every line of a ```bash or ```sh block (a
trailing `  # comment` dropped), inline code that starts with `make `, `.venv/bin/<tool> `,
`python -m autograder `, `cd ` or `cp `, and each target of `make help` (its example
when the description gives one, `[optional]` arguments dropped). tests/documented_commands.toml
says what each must do (exit status, a piece of output) or, for the exceptions, why it is
not run as written and what runs instead.

Each command runs twice: from the repository's folder, and from a folder of the test's
own. Where the document says a command runs from the repository (all of README.md and
`make help`; `make` and anything the sentence says runs "from the repository" in
docs/grading.md), the second run is `cd REPOSITORY && command`, the same run as the first,
so it is not repeated. docs/grading.md's other commands run in both places, in a shell
where `.venv` was activated, as that page says to do once. README.md's commands run with
`.venv/bin` off PATH, as in a fresh shell.

The runs share the repository's `.venv`. No fresh clone is made: the environment is an
editable install of this working tree, so a clone sharing it would run this tree's code,
not its own, and prove nothing about the clone.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from . import labserver

ROOT = Path(__file__).resolve().parent.parent
TABLE = Path(__file__).with_name("documented_commands.toml")
VENV_BIN = ROOT / ".venv" / "bin"
INLINE = re.compile(r"^(make [a-z]|\.venv/bin/\S+ |python -m autograder |cd |cp )")
FENCE = re.compile(r"^```(\w*)\s*$")
COMMAND_WORDS = ("make ", "python", ".venv/", "cd ", "jupyter ", "nbgrader ", "pip ", "conda ")
SUBMISSION_SLUG = "00_history"
# README and the pages it moved its details to: their commands run from the repository.
README_PAGES = ("README.md", "docs/measured.md", "docs/platforms.md", "docs/training.md", "docs/speedrun.md")


@dataclass
class Command:
    text: str
    doc: str
    where: str                # "repository" or "anywhere"
    activate: bool            # run in a shell where .venv was activated


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence around text[start:end]."""
    before = max(text.rfind(". ", 0, start), text.rfind("\n\n", 0, start))
    after = [i for i in (text.find(". ", end), text.find("\n\n", end)) if i != -1]
    return text[before + 1: min(after) if after else len(text)]


def from_markdown(name: str) -> list[Command]:
    text = (ROOT / name).read_text(encoding="utf-8")
    grading = name == "docs/grading.md"
    found, prose, fence, body = [], [], None, []
    for line in text.splitlines(keepends=True):
        match = FENCE.match(line.strip())
        if fence is None and match:
            fence, body = match.group(1), []
        elif fence is not None and line.strip() == "```":
            steps = [s for s in (re.split(r"\s{2,}#\s", b.strip())[0].strip() for b in body)
                     if s and not s.startswith("#")]
            if fence in ("bash", "sh"):
                for step in steps:
                    where = "repository" if not grading or step.startswith("make ") else "anywhere"
                    found.append(Command(step, name, where, grading and not step.startswith("make ")))
            else:
                assert not (fence in ("", "console", "shell") and steps and steps[0].startswith(COMMAND_WORDS)), (
                    f"{name}: a block of commands must be marked ```bash: {steps[0]!r}")
            fence = None
        elif fence is not None:
            body.append(line)
        else:
            prose.append(line)
    flat = "".join(prose)
    for match in re.finditer(r"`([^`\n]+)`", flat):
        span = match.group(1)
        if not INLINE.match(span):
            continue
        repository = (not grading or span.startswith("make ")
                      or "repository" in _sentence(flat, match.start(), match.end()))
        found.append(Command(span, name, "repository" if repository else "anywhere",
                             grading and not span.startswith("make ")))
    return found


def from_make_help() -> list[Command]:
    run = subprocess.run(["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    found = []
    for line in run.stdout.splitlines():
        match = re.match(r"^(make \S+(?: [A-Z_]+=\S+)*)(?: \[[^\]]*\])?\s{2,}(.*)$", line)
        assert match, f"make help: a line that names no command: {line!r}"
        head, description = match.groups()
        example = re.search(r"(make \S+(?: [A-Z_]+=\S+)+)", description)
        found.append(Command(example.group(1) if example else head, "make help", "repository", False))
    return found


def documented() -> list[Command]:
    for name in README_PAGES:
        page = " ".join((ROOT / name).read_text(encoding="utf-8").split())
        assert "Run the commands on this page from the repository's folder" in page, name
    grading = " ".join((ROOT / "docs/grading.md").read_text(encoding="utf-8").split())
    assert "activate it once in your shell with `source .venv/bin/activate`" in grading
    assert "`make` commands run from the repository's folder" in grading
    unique: dict[str, Command] = {}
    pages = [command for name in (*README_PAGES, "docs/grading.md") for command in from_markdown(name)]
    for command in pages + from_make_help():
        unique.setdefault(command.text, command)
    return list(unique.values())


def table() -> dict[str, dict]:
    entries = tomllib.loads(TABLE.read_text(encoding="utf-8"))["command"]
    return {entry["run"]: entry for entry in entries}


def test_every_documented_command_has_an_entry_and_every_entry_a_command():
    commands = {c.text: c for c in documented()}
    entries = table()
    missing = sorted(set(commands) - set(entries))
    stale = sorted(set(entries) - set(commands))
    assert not missing, f"documented commands with no entry in {TABLE.name}: {missing}"
    assert not stale, f"entries of {TABLE.name} that no document shows: {stale}"
    for run, entry in entries.items():
        assert ("reason" in entry) == ("reduced" in entry), f"{run}: an exception needs a reason and a reduced form"


# ---------------------------------------------------------------- running them
def _env(home: Path) -> dict:
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != VENV_BIN.resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "MAKEFLAGS", "MFLAGS")}
    return {**env, "PATH": path, "HOME": str(home), "JUPYTER_CONFIG_DIR": str(home / ".jupyter"),
            "JUPYTER_RUNTIME_DIR": str(home / ".jupyter-runtime"), "JUPYTER_DATA_DIR": str(home / ".jupyter-data")}


def _prepare(place: Path) -> None:
    """What the documents assume exists where a command runs: a learner's work/, and
    submissions in each of the three layouts."""
    release = ROOT / "chapters" / SUBMISSION_SLUG / f"{SUBMISSION_SLUG}.ipynb"
    for slug in ("00_history", "03_positional_encoding", "04_attention"):
        target = place / "work" / slug / f"{slug}.ipynb"
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / "chapters" / slug / f"{slug}.ipynb", target)
    for target in (place / "submissions" / f"alice__{SUBMISSION_SLUG}.ipynb",
                   place / "sub" / f"alice__{SUBMISSION_SLUG}.ipynb",
                   place / "submitted" / "alice" / SUBMISSION_SLUG / f"{SUBMISSION_SLUG}.ipynb"):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(release, target)


def _fill(text: str, tmp: Path) -> str:
    return text.replace("{repo}", str(ROOT)).replace("{tmp}", str(tmp))


def _run(command: Command, entry: dict, cwd: Path, tmp: Path, env: dict) -> tuple[int, str]:
    activate = command.activate or entry.get("activate", False)
    script = command.text
    reduced = entry.get("reduced")
    if reduced is not None and reduced != "server":
        script = _fill(reduced, tmp)
    if activate:
        script = f"source {shlex.quote(str(VENV_BIN / 'activate'))}\n{script}"
    if reduced == "server":
        port = labserver.free_port()
        args = labserver.server_args(port)
        if command.text.startswith("make "):
            script = f"{script} LAB_ARGS={shlex.quote(args + ' --allow-root')}"
        else:
            script = f"{script} {args} --allow-root"
        with labserver.serving(["bash", "-c", script], port, cwd=cwd, env=env) as server:
            status = server.json("/api/status")
        return 0, str(status)
    run = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    return run.returncode, run.stdout + run.stderr


@pytest.fixture(scope="module")
def root_outputs():
    """Refuse to run over a learner's or instructor's own files in the repository; remove
    afterwards what the runs wrote there (git ignores all of it)."""
    if subprocess.run(["make", "-q", "venv"], cwd=ROOT, capture_output=True).returncode != 0:
        pytest.skip("the .venv is not up to date (make venv): its commands would reinstall the shared environment")
    created = [ROOT / name for name in ("submissions", "sub", "submitted", "graded")]
    present = [p.name for p in created if p.exists()]
    if present:
        pytest.skip(f"the repository already holds {present}: the documented commands would grade into them")
    for slug in ("00_history", "03_positional_encoding", "04_attention"):
        mine = ROOT / "work" / slug / f"{slug}.ipynb"
        if mine.exists() and mine.read_bytes() != (ROOT / "chapters" / slug / f"{slug}.ipynb").read_bytes():
            pytest.skip(f"work/{slug} holds a learner's answers: the self-check outputs would differ")
    had_work = (ROOT / "work").exists()
    yield
    for path in created + ([] if had_work else [ROOT / "work"]):
        shutil.rmtree(path, ignore_errors=True)


def test_documented_commands_work_as_written_here_and_elsewhere(tmp_path, root_outputs):
    entries = table()
    commands = [c for c in documented() if c.text in entries]
    elsewhere = tmp_path / "elsewhere"
    home = tmp_path / "home"
    for place in (ROOT, elsewhere):
        place.mkdir(exist_ok=True)
        _prepare(place)
    home.mkdir()
    env = _env(home)
    failures = []
    for place in (ROOT, elsewhere):
        for command in commands:
            if place != ROOT and command.where == "repository":
                continue  # `cd REPOSITORY && command`: the run from the repository's folder
            entry = entries[command.text]
            tmp = tmp_path / f"run-{len(failures)}-{abs(hash((str(place), command.text)))}"
            tmp.mkdir()
            started = time.monotonic()
            status, output = _run(command, entry, place, tmp, env)
            print(f"{time.monotonic() - started:6.1f} s  {command.text}  ({'here' if place == ROOT else 'elsewhere'})")
            wanted = entry.get("status", 0)
            where = "the repository" if place == ROOT else "another folder"
            if status != wanted or entry.get("output", "") not in output:
                failures.append(f"{command.text!r} ({command.doc}) from {where}: exit {status}, wanted {wanted}"
                                f" and {entry.get('output', '')!r} in:\n{output[-1500:]}")
            elif "creates" in entry and not Path(_fill(entry["creates"], tmp)).is_file():
                failures.append(f"{command.text!r} from {where} did not write {entry['creates']}:\n{output[-1500:]}")
    assert not failures, "\n\n".join(failures)
