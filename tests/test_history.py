"""minillm.history: the recurrent network and the parameter-free attention of chapter 00."""
import pytest
import torch
import torch.nn.functional as F

from minillm.coursemap import CHAPTERS
from minillm.history import MILESTONES, rnn_forward, self_attention


def rnn_weights(d_in: int, d_hidden: int, seed: int = 0, dtype=torch.float64):
    """torch.nn.RNN with random weights and both of its bias vectors non-zero."""
    torch.manual_seed(seed)
    reference = torch.nn.RNN(d_in, d_hidden, batch_first=True, dtype=dtype)
    weights = (reference.weight_ih_l0.detach(), reference.weight_hh_l0.detach(),
               (reference.bias_ih_l0 + reference.bias_hh_l0).detach())  # the two biases act as one
    return reference, weights


@pytest.mark.parametrize("batch, seq_len, d_in, d_hidden", [(2, 5, 3, 4), (1, 1, 6, 2), (3, 40, 8, 8)])
def test_rnn_forward_matches_torch_rnn(batch, seq_len, d_in, d_hidden):
    reference, weights = rnn_weights(d_in, d_hidden)
    x = torch.randn(batch, seq_len, d_in, dtype=torch.float64)
    expected, last = reference(x)
    got = rnn_forward(x, *weights)
    torch.testing.assert_close(got, expected.detach(), atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(got[:, -1], last[0].detach(), atol=1e-12, rtol=1e-10)


def test_rnn_forward_keeps_dtype_and_inputs():
    _, weights = rnn_weights(3, 4, dtype=torch.float32)
    x = torch.randn(2, 6, 3)
    copies = [x.clone()] + [w.clone() for w in weights]
    assert rnn_forward(x, *weights).dtype == torch.float32
    for before, after in zip(copies, (x, *weights)):
        assert torch.equal(before, after)  # nothing changed in place


def test_rnn_forward_is_causal():
    _, weights = rnn_weights(4, 5)
    x = torch.randn(2, 9, 4, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6] += 1.0
    before, after = rnn_forward(x, *weights), rnn_forward(changed, *weights)
    assert torch.equal(before[:, :6], after[:, :6])
    assert not torch.allclose(before[:, 6:], after[:, 6:])


@pytest.mark.parametrize("which, shape, argument", [
    ("x", (5, 3), "x"), ("W_xh", (4, 2), "W_xh"), ("W_hh", (4, 5), "W_hh"), ("b_h", (5,), "b_h"),
])
def test_rnn_forward_bad_shapes_name_the_argument(which, shape, argument):
    arguments = {"x": torch.randn(2, 5, 3), "W_xh": torch.randn(4, 3), "W_hh": torch.randn(4, 4), "b_h": torch.randn(4)}
    arguments[which] = torch.randn(*shape)
    with pytest.raises(ValueError, match=argument):
        rnn_forward(**arguments)


@pytest.mark.parametrize("shape, dtype", [((2, 7, 8), torch.float64), ((1, 1, 4), torch.float32),
                                          ((3, 2, 5, 16), torch.float32)])
def test_self_attention_matches_sdpa(shape, dtype):
    torch.manual_seed(1)
    x = torch.randn(*shape, dtype=dtype)
    expected = F.scaled_dot_product_attention(x, x, x)
    torch.testing.assert_close(self_attention(x), expected)


def test_self_attention_by_hand():
    # Two positions in d = 2: scores [[1, 0], [0, 4]] / sqrt(2); each output averages the
    # two vectors with the softmax weights of its row.
    x = torch.tensor([[[1.0, 0.0], [0.0, 2.0]]], dtype=torch.float64)
    w0 = torch.softmax(torch.tensor([1.0, 0.0], dtype=torch.float64) / 2**0.5, 0)
    w1 = torch.softmax(torch.tensor([0.0, 4.0], dtype=torch.float64) / 2**0.5, 0)
    expected = torch.stack([w0[0] * x[0, 0] + w0[1] * x[0, 1], w1[0] * x[0, 0] + w1[1] * x[0, 1]])[None]
    torch.testing.assert_close(self_attention(x), expected)


def test_self_attention_large_inputs_and_order():
    torch.manual_seed(2)
    x = 30 * torch.randn(2, 6, 8, dtype=torch.float64)  # scores in the thousands: exp() overflows float64
    before = x.clone()
    out = self_attention(x)
    assert torch.isfinite(out).all()
    assert torch.equal(x, before)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(x, x, x))
    perm = torch.randperm(6)
    torch.testing.assert_close(self_attention(x[:, perm]), out[:, perm])  # permutation-equivariant


def test_self_attention_rejects_a_vector():
    with pytest.raises(ValueError, match="x"):
        self_attention(torch.randn(5))


def test_milestones_are_dated_and_point_at_chapters():
    numbers = {chapter.slug[:2] for chapter in CHAPTERS}
    years = [year for year, *_ in MILESTONES]
    assert years == sorted(years) and 2017 <= years[0] and years[-1] <= 2023
    for year, name, what, chapter in MILESTONES:
        assert name and what and chapter in numbers, name
