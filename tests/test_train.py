"""minillm.train: schedule, weight-decay groups, batches by rank, the held-out loss, the open loop, exact resume, checkpoints."""
import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from minillm.checkpoint import CheckpointError, load_checkpoint
from minillm.model import GPT, GPTConfig
from minillm.batches import BatchSampler
from minillm.loss import nats_per_char, token_nll
from minillm.optim import build_optimizer, build_scheduler, lr_schedule, param_groups
from minillm.train import TrainConfig, TrainState, held_out_loss, lm_loss, load_model, save_model, train, unwrap

TINY = dict(vocab_size=23, context_length=8, d_model=16, n_layers=2, n_heads=2, d_ff=32)


def _stream(n=600, vocab=23, seed=0):
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def test_lr_schedule_against_the_formula():
    max_lr, min_lr, warmup, total = 1e-3, 1e-4, 10, 110
    for step in range(0, 130, 7):
        if step < warmup:
            expected = max_lr * (step + 1) / warmup
        elif step <= total:
            expected = min_lr + 0.5 * (max_lr - min_lr) * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
        else:
            expected = min_lr
        assert lr_schedule(step, max_lr, warmup, total, min_lr) == pytest.approx(expected, rel=1e-12)
    assert lr_schedule(warmup - 1, max_lr, warmup, total, min_lr) == pytest.approx(max_lr)
    assert lr_schedule(warmup, max_lr, warmup, total, min_lr) == pytest.approx(max_lr)
    assert lr_schedule(60, max_lr, warmup, total, min_lr) == pytest.approx((max_lr + min_lr) / 2)
    assert lr_schedule(total, max_lr, warmup, total, min_lr) == pytest.approx(min_lr)
    decay = [lr_schedule(s, max_lr, warmup, total, min_lr) for s in range(warmup, total + 1)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))
    assert lr_schedule(0, 1.0, 0, 50) == 1.0, "no warmup starts at the peak"


@pytest.mark.parametrize("kwargs, name", [
    (dict(step=-1), "step"), (dict(warmup_steps=200), "warmup_steps"), (dict(total_steps=1.5), "total_steps"),
    (dict(min_lr=2.0), "min_lr"),
])
def test_lr_schedule_bad_input(kwargs, name):
    args = dict(step=0, max_lr=1.0, warmup_steps=10, total_steps=100, min_lr=0.1) | kwargs
    with pytest.raises(ValueError, match=name):
        lr_schedule(**args)


def test_scheduler_follows_the_schedule():
    model = GPT(GPTConfig(**TINY))
    optimizer = build_optimizer(model, lr=2e-3)
    scheduler = build_scheduler(optimizer, warmup_steps=4, total_steps=20, min_ratio=0.1)
    for step in range(25):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(lr_schedule(step, 2e-3, 4, 20, 2e-4))
        optimizer.step()
        scheduler.step()


def test_weight_decay_groups():
    model = GPT(GPTConfig(**TINY, tie_embeddings=True))
    decay, no_decay = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    ids = lambda group: {id(p) for p in group["params"]}  # noqa: E731
    assert ids(decay) | ids(no_decay) == {id(p) for p in model.parameters()}
    assert not ids(decay) & ids(no_decay)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    names = {id(p): n for n, p in model.named_parameters()}
    assert {names[i] for i in ids(no_decay)} == {n for n, p in model.named_parameters() if n.endswith("bias")
                                                  or ".norm" in n or n.startswith("final_norm")}
    assert id(model.token_embedding.weight) in ids(decay)
    with pytest.raises(ValueError, match="weight_decay"):
        param_groups(model, -1.0)


def test_batch_sampler_windows_epochs_and_resume():
    ids = torch.arange(200)
    sampler = BatchSampler(ids, batch_size=3, context=9, seed=4)
    starts = []
    for _ in range(6):
        x, y = next(sampler)
        assert x.shape == y.shape == (3, 9)
        assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1), "y must be x shifted by one"
        starts += x[:, 0].tolist()
    epoch = starts[:19]  # 200 tokens hold 19 or 20 windows of 10
    assert len(set(epoch)) == len(epoch), "a window repeated within an epoch"
    assert len({s % 10 for s in epoch}) == 1, "an epoch's windows must not overlap"
    state = sampler.state_dict()
    ahead = [next(sampler) for _ in range(5)]
    resumed = BatchSampler(ids, batch_size=3, context=9, seed=0)
    resumed.load_state_dict(state)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(ahead, (next(resumed) for _ in range(5))))
    other = BatchSampler(ids, batch_size=3, context=9, seed=5)
    assert not torch.equal(next(other)[0], next(BatchSampler(ids, batch_size=3, context=9, seed=4))[0])
    with pytest.raises(ValueError, match="context"):
        BatchSampler(torch.arange(10), 2, 9)
    with pytest.raises(ValueError, match="batch_size"):
        BatchSampler(ids, 0, 9)
    with pytest.raises(ValueError, match="batch_size 3"):
        BatchSampler(ids, batch_size=4, context=9).load_state_dict(state)


def test_batch_sampler_keeps_the_data_order_of_the_shipped_run():
    """The order `make train` trained the shipped model on (recorded before the sampler
    learned about ranks): a change here means the recipe no longer reproduces its weights."""
    sampler = BatchSampler(torch.arange(500), batch_size=4, context=9, seed=3)
    assert [next(sampler)[0][:, 0].tolist() for _ in range(3)] == [[378, 438, 68, 98], [78, 478, 428, 128],
                                                                    [468, 168, 48, 328]]
    sampler = BatchSampler(torch.arange(100), batch_size=4, context=9)  # 9 windows: the third batch starts epoch 1
    assert [next(sampler)[0][:, 0].tolist() for _ in range(4)] == [[8, 68, 48, 28], [88, 38, 78, 58], [18, 54, 4, 14],
                                                                    [44, 74, 84, 24]]


@pytest.mark.parametrize("world_size", [2, 3, 6])
def test_batch_sampler_shards_each_global_batch_by_rank(world_size):
    ids = torch.arange(300)
    whole = BatchSampler(ids, batch_size=6, context=7, seed=2)
    ranks = [BatchSampler(ids, batch_size=6, context=7, seed=2, rank=rank, world_size=world_size)
             for rank in range(world_size)]
    for _ in range(9):  # past the end of an epoch (37 windows of 8)
        x, y = next(whole)
        shards = [next(sampler) for sampler in ranks]
        assert all(shard[0].shape == (6 // world_size, 7) for shard in shards)
        assert torch.equal(torch.cat([s[0] for s in shards]), x) and torch.equal(torch.cat([s[1] for s in shards]), y)
    assert all(sampler.state_dict() == whole.state_dict() for sampler in ranks), "the cursor counts global rows"
    with pytest.raises(ValueError, match="divisible by world_size"):
        BatchSampler(ids, batch_size=6, context=7, world_size=4)
    with pytest.raises(ValueError, match="rank"):
        BatchSampler(ids, batch_size=6, context=7, rank=world_size, world_size=world_size)
    with pytest.raises(ValueError, match="world_size"):
        BatchSampler(ids, batch_size=6, context=7, world_size=0)


def test_token_nll_against_a_loop_over_windows():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, init_std=0.3))
    ids = _stream(45)
    total, count = token_nll(model, ids, batch_size=2)
    assert count == 44, "every token but the first is predicted once"
    expected = 0.0
    for start in range(0, 44, 8):
        window = ids[start: start + 9]
        logits, _ = model(window[None, :-1])
        expected += F.cross_entropy(logits[0], window[1:], reduction="sum").item()
    assert total == pytest.approx(expected, rel=1e-5)
    assert nats_per_char(model, ids, 90, batch_size=3) == pytest.approx(expected / 90, rel=1e-5)
    first_and_last = token_nll(model, ids, max_windows=2)  # evenly spaced: the first and the short last window
    assert first_and_last[1] == 8 + 4
    window = ids[40:45]
    last = F.cross_entropy(model(window[None, :-1])[0][0], window[1:], reduction="sum").item()
    first = F.cross_entropy(model(ids[None, :8])[0][0], ids[1:9], reduction="sum").item()
    assert first_and_last[0] == pytest.approx(first + last, rel=1e-5)


def test_token_nll_of_a_float64_model_is_summed_in_float64():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY, init_std=0.3)).double()
    ids = _stream(45)
    total, count = token_nll(model, ids, batch_size=2)
    expected = 0.0
    for start in range(0, 44, 8):  # the naive sum: -log softmax(row)[target] per position, in float64
        window = ids[start: start + 9]
        logits = model(window[None, :-1])[0][0]
        expected += (torch.logsumexp(logits, -1) - logits.gather(-1, window[1:, None]).squeeze(-1)).sum().item()
    assert count == 44
    assert total == pytest.approx(expected, rel=1e-12), "a float64 model's loss must not be rounded to float32"


def test_token_nll_of_a_uniform_model_is_log_vocab():
    model = GPT(GPTConfig(**TINY))
    with torch.no_grad():
        model.token_embedding.weight.zero_()
    total, count = token_nll(model, _stream(100))
    assert total / count == pytest.approx(math.log(23), rel=1e-5)
    with pytest.raises(ValueError, match="n_chars"):
        nats_per_char(model, _stream(100), 0)


def _batches(data, batch_size=4, seed=0):
    return BatchSampler(data, batch_size, TINY["context_length"], seed=seed)


def test_training_learns_a_repeating_pattern():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5]).repeat(60)
    state = train(model, _batches(pattern, 8), TrainConfig(steps=60, lr=1e-2, warmup_steps=5, eval_every=30),
                  evaluate=held_out_loss(pattern[:100]), progress=False)
    history = state.history
    assert state.step == 60 and len(history["train_loss"]) == len(history["lr"]) == 60
    losses = torch.tensor(history["train_loss"])
    assert losses[-5:].mean() < 0.5 * losses[:5].mean()
    assert history["val_step"] == [30, 60] and history["val_loss"][-1] < 1.0
    assert not model.training


def test_train_clips_the_gradient_before_each_step():
    """The gradient AdamW receives has norm grad_clip whenever the raw gradient is larger."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    data = _stream(700)
    x = data[:9][None]
    _, loss = model(x[:, :-1], x[:, 1:])
    loss.backward()
    raw = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters()])).item()
    model.zero_grad(set_to_none=True)
    clip = 1e-3
    assert raw > 10 * clip, "the test needs a raw gradient larger than the clip"
    norms = []

    def record(optimizer, args, kwargs):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        norms.append(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item())

    handle = register_optimizer_step_pre_hook(record)  # every optimizer, the one train builds included
    try:
        train(model, _batches(data), TrainConfig(steps=5, warmup_steps=1, grad_clip=clip), progress=False)
    finally:
        handle.remove()
    assert len(norms) == 5
    assert norms == pytest.approx([clip] * 5, rel=1e-3), f"gradient norms at the optimizer: {norms} (clip {clip})"


def test_the_default_loop_is_the_bare_loop():
    """train with lm_loss takes the steps of the ten-line loop of chapter 07, bit for bit."""
    config = TrainConfig(steps=7, warmup_steps=2, lr=5e-3)
    data = _stream(700)
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    optimizer = build_optimizer(model, config.lr)
    scheduler = build_scheduler(optimizer, config.warmup_steps, config.steps)
    batches, expected = _batches(data), []
    for _ in range(config.steps):
        x, y = next(batches)
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        expected.append(loss.item())
    torch.manual_seed(0)
    ours = GPT(GPTConfig(**TINY))
    assert train(ours, _batches(data), config, progress=False).history["train_loss"] == expected
    assert all(torch.equal(a, b) for a, b in zip(ours.state_dict().values(), model.state_dict().values()))


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path):
    config = GPTConfig(**TINY, dropout=0.2)  # dropout: the random generators must be restored too
    train_config = TrainConfig(steps=24, warmup_steps=4, eval_every=8, checkpoint_every=5)
    data, evaluate = _stream(700), held_out_loss(_stream(100, seed=1))
    torch.manual_seed(0)
    whole = train(GPT(config), _batches(data), train_config, evaluate=evaluate, progress=False).history

    path = tmp_path / "run.pt"
    torch.manual_seed(0)
    first = train(GPT(config), _batches(data), train_config, evaluate=evaluate, checkpoint_path=path, stop_after=11,
                  progress=False)
    assert first.step == 11 and len(first.history["train_loss"]) == 11
    torch.manual_seed(123)  # a different initialization and generator state: the checkpoint must restore all
    torch.rand(5)
    model = GPT(config)
    state = TrainState.load(path, model, train_config)
    assert state.step == 11
    resumed = train(model, _batches(data), train_config, evaluate=evaluate, state=state, checkpoint_path=path,
                    progress=False).history
    assert torch.equal(torch.tensor(resumed["train_loss"]), torch.tensor(whole["train_loss"]))
    assert resumed["val_loss"] == whole["val_loss"] and resumed["lr"] == whole["lr"]
    assert resumed["val_step"] == [8, 16, 24]
    final = load_model(path)
    assert final.config == config and not final.training


def test_a_state_saves_and_resumes_outside_the_loop(tmp_path):
    """The state train returns continues the run, in memory or through a file written after the loop."""
    config, train_config = GPTConfig(**TINY, dropout=0.1), TrainConfig(steps=12, warmup_steps=2)
    data = _stream(700)
    torch.manual_seed(0)
    whole_model = GPT(config)
    whole = train(whole_model, _batches(data), train_config, progress=False).history["train_loss"]

    torch.manual_seed(0)
    model, batches = GPT(config), _batches(data)
    state = train(model, batches, train_config, stop_after=5, progress=False)
    assert state.batches == batches.state_dict() and len(state.rng) == 1
    assert state.save(tmp_path / "after-5.pt", model, train_config, note="saved by hand") == tmp_path / "after-5.pt"
    in_memory = train(model, batches, train_config, state=state, progress=False)
    assert in_memory.history["train_loss"] == whole
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), whole_model.state_dict().values()))

    torch.manual_seed(7)
    again = GPT(config)
    from_file = train(again, _batches(data), train_config, state=TrainState.load(tmp_path / "after-5.pt", again,
                                                                                 train_config), progress=False)
    assert from_file.history["train_loss"] == whole
    assert load_checkpoint(tmp_path / "after-5.pt")["note"] == "saved by hand"
    with pytest.raises(ValueError, match="own keys"):
        state.save(tmp_path / "x.pt", model, train_config, step=3)


class _WithAuxLoss(torch.nn.Module):
    """A model that reports the parts of its auxiliary loss in ``last_aux_losses``, as a GPT
    with chapter 11's MoE layers does."""

    def __init__(self, config):
        super().__init__()
        self.gpt, self.last_aux_losses = GPT(config), {}

    def forward(self, ids, targets=None):
        self.last_aux_losses = {"balance": 0.25, "z": float(ids.shape[0])}
        return self.gpt(ids, targets)


def test_a_custom_loss_fn_trains_and_its_metrics_land_in_the_history():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    data, seen = _stream(700), []

    def loss_with_accuracy(model, batch):
        x, y = batch
        logits, loss = model(x, y)
        seen.append(x.shape)
        return loss, {"metric": (logits.argmax(-1) == y).float().mean(), "rows": len(x)}

    state = train(model, _batches(data), TrainConfig(steps=6, warmup_steps=1), loss_fn=loss_with_accuracy,
                  evaluate=lambda m: {"val_metric": float(m.training)}, progress=False)
    history = state.history
    assert len(seen) == 6 and history["rows"] == [4] * 6
    assert len(history["metric"]) == 6 and all(isinstance(v, float) and 0 <= v <= 1 for v in history["metric"])
    assert history["val_step"] == [6] and history["val_metric"] == [0.0], "evaluate runs once, in eval mode"

    aux = train(_WithAuxLoss(GPTConfig(**TINY)), _batches(data), TrainConfig(steps=3, warmup_steps=1),
                progress=False).history
    assert aux["balance"] == [0.25] * 3 and aux["z"] == [4.0] * 3, "lm_loss logs the model's auxiliary losses"
    assert isinstance(lm_loss(GPT(GPTConfig(**TINY)), next(_batches(data))), torch.Tensor)


def test_any_iterator_trains_but_only_a_resumable_one_resumes(tmp_path):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    config = TrainConfig(steps=6, warmup_steps=1, checkpoint_every=2)
    sampler = _batches(_stream(700))
    plain = (next(sampler) for _ in range(6))  # a generator: no state_dict
    state = train(model, plain, config, stop_after=3, checkpoint_path=tmp_path / "run.pt", progress=False)
    assert state.step == 3 and state.batches is None
    with pytest.raises(TypeError, match="batches \\(a generator\\).*cannot resume a TrainState at step 3"):
        train(model, plain, config, state=state, progress=False)
    with pytest.raises(ValueError, match="holds no position of the batches"):
        train(model, _batches(_stream(700)), config, state=state, progress=False)
    with pytest.raises(TypeError, match="cannot resume"):
        train(model, iter([]), config, state=TrainState.load(tmp_path / "run.pt", model, config), progress=False)
    with pytest.raises(ValueError, match="ran out after step 2 of 6"):
        train(model, iter([next(sampler)] * 2), config, progress=False)


def test_bad_arguments_of_train():
    model, data = GPT(GPTConfig(**TINY)), _stream(700)
    config = TrainConfig(steps=2, warmup_steps=1)
    with pytest.raises(TypeError, match="model"):
        train("gpt", _batches(data), config)
    with pytest.raises(TypeError, match="config"):
        train(model, _batches(data), {"steps": 2})
    with pytest.raises(TypeError, match="state"):
        train(model, _batches(data), config, state={"step": 0})
    with pytest.raises(ValueError, match="0-dim"):
        train(model, _batches(data), config, loss_fn=lambda m, b: m(*b)[0], progress=False)
    with pytest.raises(ValueError, match="reserve|keeps those"):
        train(model, _batches(data), config, loss_fn=lambda m, b: (lm_loss(m, b), {"lr": 1.0}), progress=False)
    with pytest.raises(ValueError, match="tuple of 3"):
        train(model, _batches(data), config, loss_fn=lambda m, b: (lm_loss(m, b), {}, 1), progress=False)
    with pytest.raises(ValueError, match="stop_after"):
        train(model, _batches(data), config, stop_after=-1)


def test_unwrap_reaches_the_model_inside_a_wrapper(tmp_path):
    model = GPT(GPTConfig(**TINY))
    assert unwrap(torch.nn.DataParallel(model)) is model and unwrap(model) is model
    save_model(tmp_path / "wrapped.pt", torch.nn.DataParallel(model))
    assert set(load_checkpoint(tmp_path / "wrapped.pt")["model"]) == set(model.state_dict()), "no 'module.' prefix"


def test_checkpoint_errors(tmp_path):
    model = GPT(GPTConfig(**TINY))
    train_config = TrainConfig(steps=4, warmup_steps=1)
    with pytest.raises(CheckpointError, match="does not exist"):
        TrainState.load(tmp_path / "missing.pt", model, train_config)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(corrupt)
    path = tmp_path / "run.pt"
    train(model, _batches(_stream()), train_config, checkpoint_path=path, stop_after=2, progress=False)
    other = GPT(GPTConfig(**TINY))  # another initialization than the checkpoint's weights
    before = {k: v.clone() for k, v in other.state_dict().items()}
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(CheckpointError, match="TrainConfig"):
        TrainState.load(path, other, TrainConfig(steps=5, warmup_steps=1))
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in before.items()), \
        "a refused resume must leave the caller's model as it was"
    with pytest.raises(CheckpointError, match="another model"):
        TrainState.load(path, GPT(GPTConfig(**{**TINY, "d_ff": 48})), train_config)
    save_model(tmp_path / "model.pt", model, note="hello")
    loaded = load_model(tmp_path / "model.pt")
    ids = _stream(8)[None]
    assert torch.equal(loaded(ids)[0], model.eval()(ids)[0])
    bad = {"config": {**model.config.to_dict(), "d_model": 32, "d_ff": 32}, "model": model.state_dict()}
    torch.save(bad, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="config"):
        load_model(tmp_path / "bad.pt")


@pytest.mark.parametrize("kwargs, name", [
    (dict(steps=0), "steps"), (dict(warmup_steps=5000), "warmup_steps"), (dict(lr=0.0), "lr"),
    (dict(grad_clip=-1.0), "grad_clip"), (dict(min_lr_ratio=2.0), "min_lr_ratio"), (dict(eval_every=1.5), "eval_every"),
    (dict(beta2=1.0), "beta2"), (dict(weight_decay=-0.1), "weight_decay"),
])
def test_bad_train_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TrainConfig(**kwargs)


def test_train_config_round_trips_through_a_dict_and_names_unknown_keys():
    config = TrainConfig(steps=40, warmup_steps=3, lr=1e-2)
    assert TrainConfig.from_dict(asdict(config)) == config
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['epochs'\]"):
        TrainConfig.from_dict({**asdict(config), "epochs": 3})
