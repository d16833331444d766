"""minillm.distributed: the launch torchrun describes, bad launches refused with clear errors,
and ``torchrun --nproc_per_node=2 -m minillm train`` itself, run literally."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from minillm import distributed
from minillm.checkpoint import load_checkpoint

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]  # the `torchrun` script, run by this interpreter
FULL = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}


def test_no_launch_variables_is_one_process():
    assert distributed.environment({}) == (0, 0, 1)
    assert not distributed.environment({}).distributed
    launch, device = distributed.init(env={})
    assert launch == (0, 0, 1) and not torch.distributed.is_initialized()


def test_a_torchrun_launch_is_read():
    launch = distributed.environment(FULL)
    assert launch == (1, 1, 2) and launch.distributed
    assert distributed.environment({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"}) == (0, 0, 1)


@pytest.mark.parametrize("missing", ["RANK", "LOCAL_RANK", "WORLD_SIZE"])
def test_a_partial_launch_names_the_missing_variable(missing):
    env = {name: value for name, value in FULL.items() if name != missing}
    with pytest.raises(ValueError, match=missing):
        distributed.environment(env)


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT"])
def test_a_missing_rendezvous_variable_is_named(missing):
    env = {name: value for name, value in FULL.items() if name != missing}
    with pytest.raises(ValueError, match=f"rendezvous variable {missing}"):
        distributed.environment(env)


@pytest.mark.parametrize("env, match", [({**FULL, "RANK": "2"}, "RANK=2"), ({**FULL, "WORLD_SIZE": "two"}, "WORLD_SIZE"),
                                        ({**FULL, "LOCAL_RANK": "-1"}, "LOCAL_RANK=-1")])
def test_an_impossible_launch_is_refused(env, match):
    with pytest.raises(ValueError, match=match):
        distributed.environment(env)


def test_the_world_size_must_divide_the_global_batch():
    assert distributed.local_batch_size(8, 2) == 4
    with pytest.raises(ValueError, match="divisible by the number of processes"):
        distributed.local_batch_size(9, 2)
    with pytest.raises(ValueError, match="batch_size"):
        distributed.local_batch_size(0, 2)


def test_wrap_without_a_process_group_returns_the_model():
    model = torch.nn.Linear(2, 2)
    assert distributed.wrap(model, torch.device("cpu")) is model


def _corpus(folder: Path) -> Path:
    from minillm import data

    path = folder / "corpus.txt"
    path.write_text(data.corpus_text()[:20_000], encoding="utf-8")
    return path


def _train_command(folder: Path, corpus: Path, *extra: str) -> list[str]:
    return ["-m", "minillm", "train", "--corpus", str(corpus), "--out", str(folder / "model.pt"),
            "--checkpoint", str(folder / "run.pt"), "--batch-size", "4", "--vocab-size", "260", "--context", "16",
            "--d-model", "16", "--layers", "1", "--heads", "2", "--threads", "1", "--quiet", *extra]


def _run(command: list[str], **env) -> subprocess.CompletedProcess:
    environment = {key: value for key, value in os.environ.items() if key not in FULL}
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env={**environment, **env})


def test_torchrun_trains_data_parallel_and_resumes(tmp_path):
    corpus = _corpus(tmp_path)
    launch = [*TORCHRUN, "--nproc_per_node=2"]
    done = _run([*launch, *_train_command(tmp_path, corpus, "--steps", "2")])
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("validation loss:") == 1, "only rank 0 prints"
    assert "data-parallel over 2 processes (2 x 2 rows a batch)" in done.stdout
    saved = load_checkpoint(tmp_path / "model.pt")
    assert saved["world_size"] == 2 and len(saved["train_loss"]) == 2
    assert len(load_checkpoint(tmp_path / "run.pt")["rng"]) == 2, "the training checkpoint keeps both ranks' generators"
    # the run is complete: resuming it under torchrun loads both ranks' state, does no step, writes the same model
    # (an exact resume from the middle of a data-parallel run is tests/test_train_distributed.py's)
    resumed = _run([*launch, *_train_command(tmp_path, corpus, "--steps", "2", "--resume")])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = load_checkpoint(tmp_path / "model.pt")
    assert again["train_loss"] == saved["train_loss"]
    assert all(torch.equal(again["model"][name], value) for name, value in saved["model"].items())
    one = _run([*launch[:-1], "--nproc_per_node=1", *_train_command(tmp_path, corpus, "--steps", "2", "--resume")])
    assert one.returncode != 0 and "resume with as many processes" in one.stderr


def test_torchrun_refuses_a_batch_the_world_size_does_not_divide(tmp_path):
    done = _run([*TORCHRUN, "--nproc_per_node=2", *_train_command(tmp_path, _corpus(tmp_path), "--steps", "1",
                                                                  "--batch-size", "5")])
    assert done.returncode != 0
    assert "must be divisible by the number of processes (2)" in done.stderr


def test_a_process_started_by_hand_without_rendezvous_is_refused(tmp_path):
    done = _run([sys.executable, *_train_command(tmp_path, _corpus(tmp_path), "--steps", "1")],
                RANK="0", LOCAL_RANK="0", WORLD_SIZE="2")
    assert done.returncode != 0
    assert "error: WORLD_SIZE=2 but the rendezvous variable MASTER_ADDR, MASTER_PORT is not set" in done.stderr


def test_the_old_run_flag_would_be_taken_by_torchrun():
    """Why the checkpoint's flag is --checkpoint: torchrun reads --run as its own --run-path."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--nproc_per_node=2", "-m", "minillm", "train", "--run", "x.pt"])
    args = parser.parse_args(["--nproc_per_node=2", "-m", "minillm", "train", "--checkpoint", "x.pt", "--grad-accum",
                              "2", "--batch-size", "4"])
    assert args.training_script_args == ["train", "--checkpoint", "x.pt", "--grad-accum", "2", "--batch-size", "4"]


def test_grad_accum_on_the_command_line_equals_the_larger_batch(tmp_path):
    from minillm.__main__ import main

    corpus = _corpus(tmp_path)
    losses = {}
    for name, extra in (("whole", ["--batch-size", "4"]), ("accumulated", ["--batch-size", "2", "--grad-accum", "2"])):
        folder = tmp_path / name
        folder.mkdir()
        main(_train_command(folder, corpus, "--steps", "3")[2:] + extra)  # without "-m minillm"
        losses[name] = load_checkpoint(folder / "model.pt")["train_loss"]
    assert len(losses["whole"]) == 3
    assert torch.allclose(torch.tensor(losses["whole"]), torch.tensor(losses["accumulated"]), rtol=1e-5, atol=1e-5)
