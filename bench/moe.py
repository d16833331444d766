"""Training throughput of a mixture of experts against the dense model of equal active size.

Three models of the course's shape (``minillm.recipe``: 4 layers, d_model 128, 4 heads,
context 128, vocabulary 2048, RoPE, RMSNorm, no biases), in one run:

- "dense": the recipe's SwiGLU FFN, d_ff 352 (1,066,112 parameters);
- "MoE, sorted dispatch": 8 SwiGLU experts of d_ff 176, top-2, capacity factor 1.25
  (``dispatch="sorted"``: one sort, one gather, each expert once on a contiguous slice,
  one scatter); the same active FFN parameters as "dense" plus the routers
  (1,070,208 active, 2,692,224 in all);
- "MoE, masked loop": the same weights, ``dispatch="masked"``: for each expert a boolean
  mask, a nonzero, a gather and a scatter of its own.

Each step is forward, backward and an AdamW step on a fixed batch. The models are timed in
short interleaved rounds, so that a change in the machine's load hits all alike; the table
gives each model's median tokens per second and the median over the rounds of each round's
ratio to "dense", with its range. The dense model is also timed against a second copy of
itself: the spread of that ratio around 1 is the noise floor. ``--forward`` times forward
passes without gradients instead (inference over a batch). Usage:
python bench/moe.py [--rounds 7] [--steps 3] [--threads 1] [--batch-size 8] [--forward]
"""
import argparse
import statistics

import torch

from minillm.model import GPT, count_parameters
from minillm.recipe import recipe_config
from train import Runner  # bench/train.py, beside this script: a model, its AdamW, a fixed batch, timed steps

MOE = dict(ffn="moe", d_ff=176, ffn_options={"n_experts": 8, "top_k": 2, "capacity_factor": 1.25})


class ForwardRunner(Runner):
    """``Runner`` timing forward passes without gradients (inference over a batch) instead of training steps."""

    def step(self):
        with torch.no_grad():
            self.model(self.x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default: %(default)s)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default: %(default)s)")
    parser.add_argument("--forward", action="store_true", help="time forward passes without gradients")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dense, moe = recipe_config(2048), recipe_config(2048, **MOE)
    masked = recipe_config(2048, **{**MOE, "ffn_options": {**MOE["ffn_options"], "dispatch": "masked"}})
    assert count_parameters(moe, active=True) - count_parameters(dense) == dense.n_layers * 8 * dense.d_model  # routers
    models = {"dense": GPT(dense), "dense, again": GPT(dense), "MoE, sorted dispatch": GPT(moe)}
    models["MoE, masked loop"] = GPT(masked)
    models["MoE, masked loop"].load_state_dict(models["MoE, sorted dispatch"].state_dict())
    batch = torch.randint(0, dense.vocab_size, (args.batch_size, dense.context_length + 1))
    runners = {name: (ForwardRunner if args.forward else Runner)(model, batch) for name, model in models.items()}
    times = {name: [] for name in runners}
    for round_ in range(args.rounds):
        order = list(runners) if round_ % 2 == 0 else list(reversed(runners))  # no model always goes first
        for name in order:
            times[name].append(runners[name].seconds(args.steps))
    tokens = args.batch_size * dense.context_length
    base = times["dense"]
    what = "forward passes without gradients" if args.forward else "training steps (forward, backward, AdamW)"
    print(f"threads {torch.get_num_threads()} · batch {args.batch_size} × context {dense.context_length} · "
          f"{args.rounds} rounds of {args.steps} {what}")
    print(f"parameters: dense {count_parameters(dense):,d}; MoE {count_parameters(moe):,d} in all, "
          f"{count_parameters(moe, active=True):,d} active (8 experts of d_ff 176, top-2, capacity factor 1.25)")
    print(f"{'model':22s} {'tokens/s':>10s} {'vs dense (median)':>18s} {'range over rounds':>19s}")
    for name, values in times.items():
        ratios = [b / t for b, t in zip(base, values)]  # above 1: faster than dense in that round
        spread = "" if name == "dense" else f"{min(ratios):.2f}–{max(ratios):.2f}"
        print(f"{name:22s} {tokens / statistics.median(values):10,.0f} {statistics.median(ratios):18.2f} {spread:>19s}")
    print("ratio: dense's step time over the model's, per round; 'dense, again' is the noise floor")


if __name__ == "__main__":
    main()
