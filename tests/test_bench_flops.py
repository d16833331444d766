"""Every bench counts training FLOPs with chapter 08's formula, ``minillm.scaling.training_flops``.

bench/moe_runs.py once counted 6 x active parameters + 6 L T d_model, which put chapter 11's
compute axis at another rate than chapter 08's: these tests compare its count with the
formula on dense configs, with a mixture of experts counted by hand, and in the cache that
chapter 11 plots.
"""
import importlib.util
import json

import pytest

from coursebuild import paths
from minillm import data
from minillm.model import GPTConfig
from minillm.recipe import recipe_config
from minillm.scaling import training_flops


def _bench(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", paths.ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def moe_runs():
    return _bench("moe_runs")


@pytest.mark.parametrize("extra", [
    {},  # the bench's dense run: the recipe, tied, RoPE
    {"tie_embeddings": False},  # the head is counted, the token table is not
    {"n_kv_heads": 2, "positions": "learned"},  # the position table is not counted
])
def test_moe_runs_counts_a_dense_config_as_chapter_08_does(moe_runs, extra):
    config = recipe_config(2048, **extra)
    assert moe_runs.flops_per_token(config) == training_flops(config, 1)


def test_moe_runs_counts_the_mixture_by_hand(moe_runs):
    config = moe_runs.run_configs(2048, [0])["moe-s0"]
    d, vocab, layers, context, expert_width = 128, 2048, 4, 128, 176
    attention = 4 * d * d  # Q, K, V and the output, no biases
    router = 8 * d
    two_experts = 2 * 3 * d * expert_width  # top-2 SwiGLU experts, three matrices each
    norms = 2 * d
    n = layers * (attention + router + two_experts + norms) + d + vocab * d  # final norm, tied head
    by_hand = 6 * n + 12 * layers * context * d
    assert by_hand == 7_207_680
    assert moe_runs.flops_per_token(config) == by_hand


def test_chapter_11s_cache_holds_chapter_08s_count(moe_runs):
    cache = json.loads(data.path("moe_runs.json").read_text())
    for name, run in cache["runs"].items():
        assert run["flops_per_token"] == training_flops(GPTConfig.from_dict(run["config"]), 1), name
    assert moe_runs.recount_flops(cache) == cache, "recounting the cache changes nothing"


def test_the_scaling_sweeps_cache_holds_chapter_08s_count():
    sweep = _bench("scaling_sweep")
    cache = json.loads(data.path("scaling_sweep.json").read_text())
    runs = cache["runs"]
    assert runs
    for run in runs:
        config = sweep.config_for(run["d_model"], run["n_layers"])
        assert run["flops"] == training_flops(config, run["tokens"]), run
