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
from minillm.train import BatchSampler, TrainConfig, TrainState, held_out_loss, train

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
