"""The speedrun's record and its verification (bench/speedrun.py), with the seconds-long
"tiny" recipe: a record says what ran, where and how fast; a rerun of the same code on the
same seed verifies it; a record whose loss or code version does not match fails."""
import copy
import importlib.util
import json
import os
import statistics
import subprocess

import pytest

from coursebuild import paths


@pytest.fixture(scope="module")
def speedrun():
    spec = importlib.util.spec_from_file_location("bench_speedrun", paths.ROOT / "bench" / "speedrun.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_record_verifies_on_a_rerun_and_a_changed_one_does_not(speedrun, tmp_path, capsys):
    board = tmp_path / "speedrun.json"
    model = tmp_path / "tiny.pt"
    assert speedrun.main(["run", "--recipe", "tiny", "--threads", "1", "--out", str(board), "--model", str(model)]) == 0
    assert model.exists() and (tmp_path / "tiny-tokenizer.json").exists()
    [record] = json.loads(board.read_text())["records"]
    assert record["recipe"] == "tiny" and record["settings"] == speedrun.RECIPES["tiny"]
    assert record["code_version"] == speedrun.code_version(speedrun.RECIPES["tiny"])
    assert record["threads"] == 1 and record["torch"] and record["machine"]["cores"]
    assert record["steps"] == speedrun.RECIPES["tiny"]["steps"] and not record["reached_target"]
    assert [e["step"] for e in record["evaluations"]] == [20, 40]
    assert 0 < record["train_seconds"] and 0 < record["nats_per_char"] < 8
    calibration = record["calibration"]
    assert all(calibration[when]["nanogpt_tokens_per_second"] > 0 and calibration[when]["matmul_gflops"] > 0
               for when in ("before", "after"))
    assert calibration["nanogpt_tokens_per_second"] == pytest.approx(
        (calibration["before"]["nanogpt_tokens_per_second"] + calibration["after"]["nanogpt_tokens_per_second"]) / 2)
    assert "evaluations excluded" in record["clock"]
    assert speedrun.normalized_seconds(record) == pytest.approx(
        record["train_seconds"] * record["calibration"]["nanogpt_tokens_per_second"]
        / speedrun.REFERENCE_TOKENS_PER_SECOND)

    # The tiny recipe trains for a fraction of a second, so its time is mostly noise here.
    race = tmp_path / "race.json"
    assert speedrun.main(["verify", "0", "--board", str(board), "--time-tolerance", "20", "--out", str(race)]) == 0
    assert "record 0: verified" in capsys.readouterr().out
    [rerun] = speedrun.load_board(race)  # the instructor's leaderboard holds the rerun, not the submission
    assert rerun["code_version"] == record["code_version"] and rerun["date"] >= record["date"]

    assert speedrun.verify(record, record) == []
    wrong_loss = copy.deepcopy(record)
    wrong_loss["nats_per_char"] -= 0.05
    assert any("loss" in problem for problem in speedrun.verify(wrong_loss, record))
    other_code = copy.deepcopy(record)
    other_code["code_version"] = "0" * 16
    assert any("code version" in problem for problem in speedrun.verify(other_code, record))
    slower = copy.deepcopy(record)
    slower["train_seconds"] *= 3
    assert any("normalized time" in problem for problem in speedrun.verify(record, slower))

    speedrun.save_board([wrong_loss], board)
    assert speedrun.main(["verify", "0", "--board", str(board), "--time-tolerance", "20", "--out", str(race)]) == 1
    assert "NOT verified" in capsys.readouterr().out
    assert len(speedrun.load_board(race)) == 1, "a rerun that does not hold is not added"


def test_the_code_version_covers_the_training_loop(speedrun, tmp_path):
    """A learner who changes bench/speedrun.py's loop (not only the package) changes the version."""
    changed = tmp_path / "speedrun.py"
    changed.write_text((paths.ROOT / "bench" / "speedrun.py").read_text() + "\n# a changed loop\n")
    spec = importlib.util.spec_from_file_location("bench_speedrun_changed", changed)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    settings = speedrun.RECIPES["tiny"]
    assert module.code_version(settings) != speedrun.code_version(settings)
    assert speedrun.code_version(dict(settings, lr=1e-3)) != speedrun.code_version(settings)


def test_the_leaderboard_sorts_by_normalized_time_and_refuses_a_missing_record(speedrun, tmp_path, capsys):
    base = {"recipe": "course", "nats_per_char": 1.39, "steps": 2000, "threads": 2, "reached_target": True,
            "machine": {"cpu": "x"}}
    fast_machine = dict(base, train_seconds=300.0, calibration={"nanogpt_tokens_per_second": 40_000.0})
    slow_machine = dict(base, train_seconds=400.0, calibration={"nanogpt_tokens_per_second": 20_000.0})
    missed = dict(base, train_seconds=100.0, reached_target=False, calibration={"nanogpt_tokens_per_second": 20_000.0})
    lines = speedrun.board_lines([fast_machine, slow_machine, missed])
    assert [line.split()[0] for line in lines[1:]] == ["1", "0", "2"], lines
    board = tmp_path / "board.json"
    speedrun.save_board([slow_machine], board)
    with pytest.raises(SystemExit):
        speedrun.main(["verify", "3", "--board", str(board)])
    assert "record must be 0 to 0" in capsys.readouterr().err


@pytest.fixture
def ablations(monkeypatch):
    """bench/speedrun_ablations.py over the tiny recipe, with one change: seconds, not minutes."""
    spec = importlib.util.spec_from_file_location("bench_speedrun_ablations", paths.ROOT / "bench" / "speedrun_ablations.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    tiny = module.speedrun.RECIPES["tiny"]
    monkeypatch.setattr(module, "BASE", dict(tiny, steps=20, check_every=20))
    monkeypatch.setattr(module, "ABLATIONS", {"base": ({}, "tiny"), "lr 1e-2": ({"lr": 1e-2}, "a higher rate"),
                                              "heavy decay": ({"weight_decay": 5.0}, "much decay")})
    return module


def test_ablations_are_cached_resumed_and_paired_by_seed(ablations, tmp_path):
    cache = tmp_path / "ablations.json"
    said = []
    runs = ablations.run_missing(["base", "lr 1e-2"], [0, 1], threads=1, path=cache, say=said.append)
    assert sorted((r["ablation"], r["seed"]) for r in runs) == [("base", 0), ("base", 1), ("lr 1e-2", 0), ("lr 1e-2", 1)]
    assert ablations.load(cache) == runs  # saved as each run ends
    said.clear()
    again = ablations.run_missing(["base", "lr 1e-2", "heavy decay"], [0, 1], threads=1, path=cache,
                                  say=said.append)
    assert [line for line in said if not line.startswith("  ")] == ["heavy decay, seed 0:", "heavy decay, seed 1:"]
    # the weight decay reached the optimizer: its run differs from the base run of the same seed
    decayed = {r["seed"]: r["nats_per_char"] for r in again if r["ablation"] == "heavy decay"}
    base = {r["seed"]: r["nats_per_char"] for r in again if r["ablation"] == "base"}
    assert decayed != base
    rows = {line.split(" | ")[0].strip("| "): line for line in ablations.table(again) if line.startswith("| ")}
    paired = sorted(decayed[s] - base[s] for s in (0, 1))
    assert f"{statistics.median(paired):+.3f} ({paired[0]:+.3f} to {paired[1]:+.3f})" in rows["heavy decay"]
    # a run made by other code (another version of its settings) is neither used nor kept
    changed = [dict(r, code_version="0" * 16) if r["ablation"] == "lr 1e-2" and r["seed"] == 1 else r for r in again]
    ablations.save(changed, cache)
    said.clear()
    ablations.run_missing(["lr 1e-2"], [1], threads=1, path=cache, say=said.append)
    assert said[0] == "lr 1e-2, seed 1:"
    assert len(ablations.load(cache)) == 6


def test_make_speedrun_verify_writes_a_leaderboard_only_when_asked():
    """The Makefile's own OUT (make grade's folder) is not a leaderboard to append to."""
    def command(*args):
        run = subprocess.run(["make", "--no-print-directory", "-n", "speedrun-verify", *args], cwd=paths.ROOT,
                             capture_output=True, text=True, timeout=60, env={**os.environ, "MAKEFLAGS": ""})
        return run.stdout.strip().splitlines()[-1]

    assert "--out" not in command("RECORD=0")
    assert command("RECORD=0", "BOARD=alice.json", "OUT=race.json").endswith(
        "verify 0 --board alice.json --out race.json")
