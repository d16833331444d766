"""minillm.checkpoint: atomic saves, clear errors, exact random-generator restore, one rank or many."""
import dataclasses
import random

import pytest
import torch

from minillm.checkpoint import (CheckpointError, config_from_dict, is_main_process, load_checkpoint, rank_and_world_size,
                                rng_state, rng_states, save_checkpoint, set_rng_state, set_rng_states)


def test_round_trip_of_model_and_optimizer(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optimizer.step()
    path = save_checkpoint(tmp_path / "run" / "ckpt.pt", {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 1})
    state = load_checkpoint(path, required=("model", "optimizer"))
    restored = torch.nn.Linear(3, 2)
    restored.load_state_dict(state["model"])
    assert torch.equal(restored.weight, model.weight)
    assert state["step"] == 1
    assert state["optimizer"]["state"][0]["exp_avg"].shape == (2, 3)


def test_a_saved_file_has_ordinary_permissions_and_no_leftovers(tmp_path):
    import os

    mask = os.umask(0o022)
    try:
        path = save_checkpoint(tmp_path / "ckpt.pt", {"step": 1})
    finally:
        os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_random_generators_resume_exactly(tmp_path):
    torch.manual_seed(1)
    random.seed(1)
    save_checkpoint(tmp_path / "rng.pt", {"rng": rng_state()})
    expected = (torch.rand(5), random.random())
    torch.manual_seed(99)
    random.seed(99)
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    got = (torch.rand(5), random.random())
    assert torch.equal(got[0], expected[0]) and got[1] == expected[1]


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path):
    path = save_checkpoint(tmp_path / "ckpt.pt", {"step": 1})

    class Unsaveable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_checkpoint(path, {"step": 2, "bad": Unsaveable()})
    assert load_checkpoint(path)["step"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"], "a temporary file was left behind"


def test_missing_and_corrupt_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(corrupt)
    save_checkpoint(tmp_path / "partial.pt", {"model": {}})
    with pytest.raises(CheckpointError, match="lacks \\['config'\\]"):
        load_checkpoint(tmp_path / "partial.pt", required=("model", "config"))
    with pytest.raises(TypeError, match="state"):
        save_checkpoint(tmp_path / "x.pt", [1, 2])


def test_loading_never_runs_code(tmp_path):
    class Exploit:
        def __reduce__(self):
            return (print, ("pwned",))

    path = tmp_path / "evil.pt"
    torch.save({"x": Exploit()}, path)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint(path)


def test_config_from_dict_rebuilds_the_dataclass_and_names_unknown_keys():
    @dataclasses.dataclass(frozen=True)
    class Shape:
        width: int = 4
        depth: int = 2

    assert config_from_dict(Shape, dataclasses.asdict(Shape(8, 3))) == Shape(8, 3)
    assert config_from_dict(Shape, {"width": 5}) == Shape(5, 2)
    with pytest.raises(ValueError, match=r"unknown Shape fields \['colour', 'height'\]"):
        config_from_dict(Shape, {"width": 5, "height": 1, "colour": "red"})


def test_without_a_process_group_there_is_one_rank_and_it_writes():
    assert rank_and_world_size() == (0, 1) and is_main_process()
    torch.manual_seed(3)
    states = rng_states()
    assert len(states) == 1 and torch.equal(states[0]["torch"], rng_state()["torch"])
    expected = torch.rand(4)
    torch.manual_seed(8)
    set_rng_states(states)
    assert torch.equal(torch.rand(4), expected)
    with pytest.raises(ValueError, match="1 process"):
        set_rng_states(states * 2)  # gathered from two processes: not this run's

