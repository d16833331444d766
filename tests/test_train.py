"""minillm.train: schedule, weight-decay groups, batches, the held-out loss, exact resume, checkpoints."""
import math
from dataclasses import asdict

import pytest
import torch
import torch.nn.functional as F
from torch.optim.optimizer import register_optimizer_step_pre_hook

from minillm.checkpoint import CheckpointError
from minillm.model import GPT, GPTConfig
from minillm.train import (BatchSampler, TrainConfig, build_optimizer, build_scheduler, load_model, lr_schedule,
                           nats_per_char, param_groups, save_model, token_nll, train)

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


def test_token_nll_of_a_uniform_model_is_log_vocab():
    model = GPT(GPTConfig(**TINY))
    with torch.no_grad():
        model.token_embedding.weight.zero_()
    total, count = token_nll(model, _stream(100))
    assert total / count == pytest.approx(math.log(23), rel=1e-5)
    with pytest.raises(ValueError, match="n_chars"):
        nats_per_char(model, _stream(100), 0)


def test_training_learns_a_repeating_pattern():
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    pattern = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5]).repeat(60)
    history = train(model, pattern, pattern[:100], TrainConfig(steps=60, batch_size=8, lr=1e-2, warmup_steps=5,
                                                                 eval_every=30), progress=False)
    assert history["train_loss"].shape == (60,)
    assert history["train_loss"][-5:].mean() < 0.5 * history["train_loss"][:5].mean()
    assert history["val_step"] == [30, 60] and history["val_loss"][-1] < 1.0
    assert not model.training


def test_train_clips_the_gradient_before_each_step():
    """The gradient AdamW receives has norm grad_clip whenever the raw gradient is larger."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**TINY))
    data, val = _stream(700), _stream(100, seed=1)
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
        train(model, data, val, TrainConfig(steps=5, batch_size=4, warmup_steps=1, grad_clip=clip), progress=False)
    finally:
        handle.remove()
    assert len(norms) == 5
    assert norms == pytest.approx([clip] * 5, rel=1e-3), f"gradient norms at the optimizer: {norms} (clip {clip})"


def test_resume_repeats_the_uninterrupted_run_exactly(tmp_path):
    config = GPTConfig(**TINY, dropout=0.2)  # dropout: the random generators must be restored too
    train_config = TrainConfig(steps=24, batch_size=4, warmup_steps=4, eval_every=8, checkpoint_every=5)
    data, val = _stream(700), _stream(100, seed=1)
    torch.manual_seed(0)
    whole = train(GPT(config), data, val, train_config, progress=False)

    path = tmp_path / "run.pt"
    torch.manual_seed(0)
    first = train(GPT(config), data, val, train_config, checkpoint_path=path, stop_after=11, progress=False)
    assert first["train_loss"].shape == (11,)
    torch.manual_seed(123)  # a different initialization and generator state: the checkpoint must restore all
    torch.rand(5)
    resumed = train(GPT(config), data, val, train_config, checkpoint_path=path, resume=True, progress=False)
    assert torch.equal(resumed["train_loss"], whole["train_loss"])
    assert resumed["val_loss"] == whole["val_loss"] and resumed["lr"] == whole["lr"]
    final = load_model(path)
    assert final.config == config and not final.training


def test_checkpoint_errors(tmp_path):
    model = GPT(GPTConfig(**TINY))
    train_config = TrainConfig(steps=4, batch_size=2, warmup_steps=1)
    with pytest.raises(CheckpointError, match="does not exist"):
        train(model, _stream(), _stream(50), train_config, checkpoint_path=tmp_path / "missing.pt", resume=True)
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(corrupt)
    with pytest.raises(ValueError, match="checkpoint_path"):
        train(model, _stream(), _stream(50), train_config, resume=True)
    path = tmp_path / "run.pt"
    train(model, _stream(), _stream(50), train_config, checkpoint_path=path, stop_after=2, progress=False)
    other = GPT(GPTConfig(**TINY))  # another initialization than the checkpoint's weights
    before = {k: v.clone() for k, v in other.state_dict().items()}
    assert any(not torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    with pytest.raises(CheckpointError, match="TrainConfig"):
        train(other, _stream(), _stream(50), TrainConfig(steps=5, batch_size=2, warmup_steps=1), checkpoint_path=path,
              resume=True, progress=False)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in before.items()), \
        "a refused resume must leave the caller's model as it was"
    with pytest.raises(CheckpointError, match="another model"):
        train(GPT(GPTConfig(**{**TINY, "d_ff": 48})), _stream(), _stream(50), train_config, checkpoint_path=path,
              resume=True, progress=False)
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
    (dict(grad_clip=-1.0), "grad_clip"), (dict(min_lr_ratio=2.0), "min_lr_ratio"), (dict(batch_size=1.5), "batch_size"),
])
def test_bad_train_config(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TrainConfig(**kwargs)


def test_train_config_round_trips_through_a_dict_and_names_unknown_keys():
    config = TrainConfig(steps=40, batch_size=4, warmup_steps=3, lr=1e-2)
    assert TrainConfig.from_dict(asdict(config)) == config
    with pytest.raises(ValueError, match=r"unknown TrainConfig fields \['epochs'\]"):
        TrainConfig.from_dict({**asdict(config), "epochs": 3})
