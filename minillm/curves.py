"""Loss curves for figures (infrastructure; no chapter teaches this module).

- ``smooth``: an exponential moving average of a curve.
- ``plot_history``: the loss curves of a training history (``minillm.train.TrainState.history``).
- ``plot_frontier``: chapter 13's figure of a DPO sweep (``bench/dpo_frontier.py``).
"""
from __future__ import annotations

from typing import Mapping

def smooth(values, weight: float = 0.9) -> list[float]:
    """An exponential moving average of a loss curve, for plotting: each point is
    ``weight`` times the previous smoothed point plus ``1 - weight`` times the new value."""
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"weight must be in [0, 1), got {weight!r}")
    out, running = [], values[0]
    for value in values:
        running = weight * running + (1 - weight) * value
        out.append(running)
    return out


def plot_history(history: Mapping, title: str = "Training the mini-LLM"):
    """The loss curves of a training history (``minillm.train.TrainState.history``, or a
    checkpoint that keeps one): the training loss of every step, smoothed by ``smooth``
    over about a fiftieth of the run, and the validation loss at each evaluation, in nats
    per token. Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    losses = [float(value) for value in history["train_loss"]]
    if not losses:
        raise ValueError("history holds no training loss to plot")
    span = max(1, len(losses) // 50)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(range(1, len(losses) + 1), smooth(losses, 1 - 1 / span), label=f"training (smoothed over ~{span} steps)")
    if history.get("val_loss"):
        ax.plot(history["val_step"], history["val_loss"], "o-", label="validation (windows of the held-out 10%)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def plot_frontier(document: dict):
    """The figure of a sweep document of ``bench/dpo_frontier.py``: on the left each run's
    attribute rate against its KL to the reference at every evaluation; on the right the
    policy's logged log-probabilities of the training pairs (chosen, and rejected for DPO),
    smoothed (``smooth``). Returns the matplotlib figure."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    for run in document["runs"]:
        sft = run["method"] == "sft"
        label = "SFT on the chosen" if sft else f"DPO β = {run['beta']:g}"
        style = dict(color="black", linestyle="--") if sft else {}
        left.plot([p["kl"] for p in run["points"]], [100 * p["attribute_rate"] for p in run["points"]],
                  marker="s" if sft else "o", label=label, **style)
        steps = range(1, len(run["history"]["chosen_logp"]) + 1)
        line, = right.plot(steps, smooth(run["history"]["chosen_logp"]), label=f"{label}: chosen", **style)
        if not sft:
            right.plot(steps, smooth(run["history"]["rejected_logp"]), color=line.get_color(), linestyle=":",
                       label=f"{label}: rejected")
    base = document["runs"][0]["points"][0]
    left.axhline(100 * base["attribute_rate"], color="grey", linestyle=":", label="the shipped model")
    left.axhline(30, color="grey", linestyle="-.", linewidth=0.8, label="target: 30%")
    left.axvline(5, color="grey", linestyle="--", linewidth=0.8, label="KL of 5 nats")
    left.set(xlabel="KL to the reference (nats per 32-token response, from samples)",
             ylabel="held-out responses that speak of love (%)",
             title=f"Attribute against drift (a point every {document['settings']['eval_every']} steps)")
    left.legend(fontsize=7)
    right.set(xlabel="training step", ylabel="log-probability of a training response (nats, smoothed)",
              title="The policy's log-probabilities of the training pairs")
    right.legend(fontsize=6, ncol=2)
    return fig
