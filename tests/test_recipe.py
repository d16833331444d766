"""minillm.recipe: the recipe builds the shipped model, its files are found through minillm.data;
minillm.curves.plot_history draws a run's history."""
import math

import pytest
import torch

from minillm import data, recipe
from minillm.checkpoint import CheckpointError, load_checkpoint
from minillm.curves import plot_history, smooth
from minillm.model import GPTConfig
from minillm.train import TrainConfig


def test_the_recipe_is_the_shipped_model():
    shipped = load_checkpoint(recipe.pretrained_paths()[0])
    assert GPTConfig.from_dict(shipped["config"]) == recipe.recipe_config(recipe.DEFAULT_RECIPE["vocab_size"])
    config = recipe.recipe_config(2048)
    assert (config.positions, config.norm, config.ffn, config.bias, config.attention_backend) == \
        ("rope", "rmsnorm", "swiglu", False, "sdpa")
    assert config.d_ff == 352, "SwiGLU's 2/3 rule for d_model 128, rounded up to a multiple of 32"
    assert recipe.recipe_config(300, ffn="gelu", d_model=32).d_ff == 128, "4 d_model for GELU"
    assert recipe.recipe_config(300, d_ff=100).d_ff == 100


def test_the_recipe_trains_as_the_shipped_run_did():
    shipped = load_checkpoint(recipe.pretrained_paths()[0])
    assert recipe.recipe_train_config() == TrainConfig(steps=3000, lr=3e-3, warmup_steps=90, eval_every=150,
                                                       checkpoint_every=300)
    assert shipped["val_step"] == list(range(150, 3001, 150)), "the shipped run evaluated every 150 steps"
    assert len(shipped["train_loss"]) == recipe.DEFAULT_RECIPE["steps"]
    short = recipe.recipe_train_config(steps=40, lr=1e-2)
    assert (short.steps, short.lr, short.warmup_steps, short.eval_every, short.checkpoint_every) == (40, 1e-2, 1, 2, 4)


def test_the_shipped_files_are_found_through_the_data_folder(tmp_path, monkeypatch):
    model_path, tokenizer_path = recipe.pretrained_paths()
    assert model_path == data.data_dir() / "minillm-shakespeare.pt"
    assert tokenizer_path == data.data_dir() / "minillm-shakespeare-tokenizer.json"
    assert recipe.tokenizer_path_for(tmp_path / "run" / "m.pt") == tmp_path / "run" / "m-tokenizer.json"
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / recipe.PRETRAINED).write_bytes(model_path.read_bytes())  # a model without its tokenizer
    monkeypatch.setenv("MINILLM_DATA", str(folder))
    with pytest.raises(CheckpointError, match="tokenizer file .*minillm-shakespeare-tokenizer.json"):
        recipe.load_pretrained()


def test_plot_history_draws_the_smoothed_training_loss_and_the_evaluations():
    losses = [8.0 - math.log1p(step) / 2 for step in range(200)]
    history = {"train_loss": losses, "val_step": [100, 200], "val_loss": [6.0, 5.5]}
    figure = plot_history(history, title="a run")
    training, validation = figure.axes[0].get_lines()
    assert list(training.get_xdata()) == list(range(1, 201))
    assert list(training.get_ydata()) == pytest.approx(smooth(losses, 1 - 1 / 4)), "smoothed over 200 / 50 steps"
    assert list(validation.get_xdata()) == [100, 200] and list(validation.get_ydata()) == [6.0, 5.5]
    assert figure.axes[0].get_title() == "a run"
    only_training = plot_history({"train_loss": torch.tensor(losses[:10]), "val_step": []})
    assert len(only_training.axes[0].get_lines()) == 1, "no evaluations, no validation curve"
    with pytest.raises(ValueError, match="no training loss"):
        plot_history({"train_loss": []})


def test_smooth_is_an_exponential_moving_average():
    assert smooth([4.0, 0.0, 2.0], weight=0.5) == [4.0, 2.0, 2.0]
    assert smooth([1.0, 3.0], weight=0.0) == [1.0, 3.0]
    with pytest.raises(ValueError, match="weight"):
        smooth([1.0], weight=1.0)
