"""Loss curves for figures (infrastructure; no chapter teaches this module).

- ``smooth``: an exponential moving average of a curve.
- ``plot_history``: the loss curves of a training history (``minillm.train.TrainState.history``).
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
