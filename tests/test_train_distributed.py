"""minillm.train under DistributedDataParallel: two CPU processes (gloo) train a GPT through
train(); both end with the same weights, only rank 0 writes, every rank's generators are kept."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from minillm.checkpoint import load_checkpoint
from minillm.model import GPT, GPTConfig
from minillm.batches import BatchSampler
from minillm.train import TrainConfig, TrainState, held_out_loss, train

pytestmark = pytest.mark.xdist_group(name="ddp")  # its two-process runs happen once, on one worker

WORLD_SIZE = 2
TINY = dict(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2, d_ff=32, dropout=0.1)
RUN = TrainConfig(steps=6, warmup_steps=1, eval_every=3, checkpoint_every=2)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _stream():
    return torch.randint(0, TINY["vocab_size"], (600,), generator=torch.Generator().manual_seed(0))


def _model(rank: int) -> DistributedDataParallel:
    torch.manual_seed(0)  # the same initialization on every rank (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(GPT(GPTConfig(**TINY)))
    torch.manual_seed(100 + rank)  # each rank's own dropout draws
    return model


def _worker(rank: int, folder: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        data, evaluate = _stream(), held_out_loss(_stream()[:100])

        def batches():
            return BatchSampler(data, batch_size=4, context=TINY["context_length"], rank=rank, world_size=WORLD_SIZE)

        # every rank names its own file, so that a write by any rank but 0 would show
        model = _model(rank)
        whole = train(model, batches(), RUN, evaluate=evaluate, checkpoint_path=f"{folder}/whole-{rank}.pt",
                      progress=False)
        weights = {name: value.clone() for name, value in model.module.state_dict().items()}

        model = _model(rank)
        train(model, batches(), RUN, evaluate=evaluate, checkpoint_path=f"{folder}/part-{rank}.pt", stop_after=3,
              progress=False)
        model = _model(rank)  # a fresh model: the checkpoint must restore weights, optimizer, cursor, generators
        torch.manual_seed(999)
        state = TrainState.load(f"{folder}/part-0.pt", model, RUN)  # the one file: rank 0's
        resumed = train(model, batches(), RUN, evaluate=evaluate, state=state, progress=False)
        torch.save({"weights": weights, "whole": whole.history, "resumed": resumed.history,
                    "resumed_weights": model.module.state_dict()}, f"{folder}/result-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this build")
    folder = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(str(folder), _free_port()), nprocs=WORLD_SIZE, join=True)
    return folder, [torch.load(folder / f"result-{rank}.pt") for rank in range(WORLD_SIZE)]


def test_both_ranks_end_with_the_same_weights_and_history(results):
    _, (zero, one) = results
    assert all(torch.equal(zero["weights"][name], one["weights"][name]) for name in zero["weights"])
    torch.manual_seed(0)
    start = GPT(GPTConfig(**TINY)).state_dict()  # the ranks' common start: training moved the weights
    assert any(not torch.equal(zero["weights"][name], start[name]) for name in start)
    assert zero["whole"] == one["whole"], "the history logs the mean over the ranks, the same on each"
    assert len(zero["whole"]["train_loss"]) == 6 and zero["whole"]["val_step"] == [3, 6]


def test_only_rank_0_writes_and_every_rank_s_generators_are_kept(results):
    folder, _ = results
    assert sorted(p.name for p in folder.glob("*.pt") if not p.name.startswith("result")) == ["part-0.pt", "whole-0.pt"]
    saved = load_checkpoint(folder / "whole-0.pt")
    assert saved["step"] == 6 and not any(key.startswith("module.") for key in saved["model"])
    rng = saved["rng"]
    assert len(rng) == WORLD_SIZE and not torch.equal(rng[0]["torch"], rng[1]["torch"]), \
        "each rank draws its own dropout: both ranks' generators must be kept"


def test_a_data_parallel_run_resumes_exactly(results):
    _, ranks = results
    for result in ranks:
        assert result["resumed"] == result["whole"]
        assert all(torch.equal(result["resumed_weights"][name], value) for name, value in result["weights"].items())


# Data parallel equals one process: 2 ranks with B rows each follow 1 process with 2B rows.
EXACT = dict(TINY, dropout=0.0)  # no dropout: its draws differ between a rank and a single process
SHORT = TrainConfig(steps=5, warmup_steps=1, eval_every=5, checkpoint_every=5)
ROWS = 4  # each rank's rows, B


def _exact_run(batch_size: int, grad_accum_steps: int = 1, rank: int = 0, world_size: int = 1):
    """Train EXACT from seed 0 on batches of ``batch_size`` global rows: (losses, weights)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**EXACT))
    if world_size > 1:
        model = DistributedDataParallel(model)
    batches = BatchSampler(_stream(), batch_size=batch_size, context=EXACT["context_length"], seed=3, rank=rank,
                           world_size=world_size)
    config = TrainConfig(**{**SHORT.__dict__, "grad_accum_steps": grad_accum_steps})
    history = train(model, batches, config, progress=False).history
    weights = {name: value.detach().clone() for name, value in getattr(model, "module", model).state_dict().items()}
    return history["train_loss"], weights


def _equivalence_worker(rank: int, folder: str, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    try:
        plain = _exact_run(WORLD_SIZE * ROWS, rank=rank, world_size=WORLD_SIZE)
        # each rank B/2 rows, two accumulated batches a step: again 2B rows a step
        accumulated = _exact_run(ROWS, grad_accum_steps=2, rank=rank, world_size=WORLD_SIZE)
        torch.save({"plain": plain, "accumulated": accumulated}, f"{folder}/equivalence-{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with the gloo backend is not available in this build")
    folder = tmp_path_factory.mktemp("equivalence")
    mp.spawn(_equivalence_worker, args=(str(folder), _free_port()), nprocs=WORLD_SIZE, join=True)
    return [torch.load(folder / f"equivalence-{rank}.pt") for rank in range(WORLD_SIZE)]


def _assert_same_run(got, expected, what: str) -> None:
    (losses, weights), (expected_losses, expected_weights) = got, expected
    assert len(losses) == len(expected_losses) == SHORT.steps
    assert torch.allclose(torch.tensor(losses), torch.tensor(expected_losses), rtol=1e-5, atol=1e-5), \
        f"{what}: losses {losses} against {expected_losses}"
    for name, value in expected_weights.items():
        assert torch.allclose(weights[name], value, rtol=1e-5, atol=1e-5), f"{what}: weight {name} differs"


def test_two_processes_of_batch_b_follow_one_process_of_batch_2b(equivalence):
    one = _exact_run(WORLD_SIZE * ROWS)
    for result in equivalence:
        _assert_same_run(result["plain"], one, "2 ranks x 4 rows against 1 process x 8 rows")
    torch.manual_seed(0)
    start = GPT(GPTConfig(**EXACT)).state_dict()
    assert any(not torch.allclose(one[1][name], start[name]) for name in start), "training must move the weights"
    half = _exact_run(ROWS)  # the same seed but half the batch: another trajectory, so the check can fail
    assert not torch.allclose(torch.tensor(half[0]), torch.tensor(one[0]), rtol=0, atol=1e-4)


def test_gradient_accumulation_equals_the_larger_batch():
    one = _exact_run(2 * ROWS)
    _assert_same_run(_exact_run(ROWS, grad_accum_steps=2), one, "2 accumulated batches of 4 against 1 batch of 8")
    _assert_same_run(_exact_run(ROWS // 2, grad_accum_steps=4), one, "4 accumulated batches of 2 against 1 of 8")


def test_gradient_accumulation_under_ddp_equals_one_process(equivalence):
    one = _exact_run(2 * ROWS)
    for result in equivalence:
        _assert_same_run(result["accumulated"], one, "2 ranks x 2 accumulated batches of 2 rows against 1 x 8")


def test_grad_accum_steps_is_checked():
    with pytest.raises(ValueError, match="grad_accum_steps"):
        TrainConfig(grad_accum_steps=0)
    assert TrainConfig.from_dict({"steps": 3, "warmup_steps": 1}).grad_accum_steps == 1  # older checkpoints load
