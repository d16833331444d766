"""Load Hugging Face ``transformers`` GPT-2 weights into ``minillm.model.GPT`` (infrastructure; no chapter teaches this module).

GPT-2 is the course's ``GPTConfig`` with learned positions, pre-norm LayerNorm (eps 1e-5),
biases everywhere, tied embeddings and the tanh approximation of GELU ("gelu_new").
Its projections are ``Conv1D`` layers, which store weights as (in, out): the transpose of
``torch.nn.Linear``'s (out, in). ``from_hf_gpt2`` needs no download: it takes a model
object, for example ``GPT2LMHeadModel(GPT2Config(...))`` with random weights, or one the
caller loaded.
"""
import torch

from minillm.model import GPT, GPTConfig

_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}


def gpt2_config(hf_config) -> GPTConfig:
    """The ``GPTConfig`` of a ``transformers.GPT2Config``; ``ValueError`` for variants GPT can't express."""
    if hf_config.activation_function not in _ACTIVATIONS:
        raise ValueError(f"activation_function {hf_config.activation_function!r} is not supported; "
                         f"supported: {sorted(_ACTIVATIONS)}")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if getattr(hf_config, flag, False):
            raise ValueError(f"GPT2Config.{flag}=True is not supported")
    if not getattr(hf_config, "scale_attn_weights", True):
        raise ValueError("GPT2Config.scale_attn_weights=False is not supported (attention divides by sqrt(head_dim))")
    return GPTConfig(
        name="gpt2-converted", vocab_size=hf_config.vocab_size, context_length=hf_config.n_positions,
        d_model=hf_config.n_embd, n_layers=hf_config.n_layer, n_heads=hf_config.n_head,
        d_ff=hf_config.n_inner or 4 * hf_config.n_embd, ffn=_ACTIVATIONS[hf_config.activation_function],
        eps=hf_config.layer_norm_epsilon, bias=True, tie_embeddings=True,
    )


@torch.no_grad()
def from_hf_gpt2(hf_model) -> GPT:
    """A ``GPT`` with the weights of a ``transformers`` ``GPT2LMHeadModel``, in eval mode.

    The logits match the Hugging Face model's (within float32 rounding) for any ids.
    """
    config = getattr(hf_model, "config", None)
    if getattr(config, "model_type", None) != "gpt2" or not hasattr(hf_model, "transformer"):
        raise TypeError(f"hf_model must be a transformers GPT2LMHeadModel, got {type(hf_model).__name__}")
    hf = hf_model.transformer
    model = GPT(gpt2_config(config))
    model.token_embedding.weight.copy_(hf.wte.weight)
    model.position_embedding.weight.copy_(hf.wpe.weight)
    for block, layer in zip(model.blocks, hf.h):
        for ours, theirs in ((block.norm1, layer.ln_1), (block.norm2, layer.ln_2)):
            ours.weight.copy_(theirs.weight)
            ours.bias.copy_(theirs.bias)
        for ours, theirs in ((block.attn.qkv, layer.attn.c_attn), (block.attn.out, layer.attn.c_proj),
                             (block.ffn.w1, layer.mlp.c_fc), (block.ffn.w2, layer.mlp.c_proj)):
            ours.weight.copy_(theirs.weight.T)  # Conv1D stores (in, out)
            ours.bias.copy_(theirs.bias)
    model.final_norm.weight.copy_(hf.ln_f.weight)
    model.final_norm.bias.copy_(hf.ln_f.bias)
    head = getattr(hf_model, "lm_head", None)
    if head is not None and not torch.equal(head.weight, hf.wte.weight):
        raise ValueError("the Hugging Face model's lm_head is not tied to its token embedding; GPT-2's is")
    return model.eval()
