"""minillm.embedding against torch built-ins, autograd, naive formulas and numpy."""
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minillm.embedding import (
    TokenEmbedding,
    check_ids,
    embedding_weight_grad,
    nearest_neighbours,
    one_hot_embed,
    pca_project,
)


@pytest.mark.parametrize("shape,vocab,d,dtype", [((5,), 7, 3, torch.float32), ((2, 6), 40, 8, torch.float64), ((2, 3, 4), 3, 5, torch.float32)])
def test_one_hot_embed_equals_indexing(shape, vocab, d, dtype):
    generator = torch.Generator().manual_seed(0)
    weight = torch.randn(vocab, d, dtype=dtype, generator=generator)
    ids = torch.randint(vocab, shape, generator=generator)
    got = one_hot_embed(ids, weight)
    assert got.dtype == dtype
    torch.testing.assert_close(got, F.embedding(ids, weight))
    # the naive product, written out
    one_hot = torch.zeros(*shape, vocab, dtype=dtype)
    for index in np.ndindex(*shape):
        one_hot[index + (int(ids[index]),)] = 1
    torch.testing.assert_close(got, one_hot @ weight)


@pytest.mark.parametrize("ids,error", [
    (torch.tensor([0, 5]), ValueError), (torch.tensor([-1]), ValueError), (torch.tensor([0.0]), TypeError), ([1, 2], TypeError),
    (torch.tensor([True]), TypeError),
])
def test_bad_ids_are_refused(ids, error):
    with pytest.raises(error, match="ids"):
        check_ids(ids, 5)
    with pytest.raises(error, match="ids"):
        one_hot_embed(ids, torch.randn(5, 2))
    with pytest.raises(error, match="ids"):
        TokenEmbedding(5, 2)(ids)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8])
def test_token_embedding_is_a_lookup_for_every_integer_dtype(dtype):
    layer = TokenEmbedding(11, 6)
    ids = torch.tensor([[3, 3, 10], [0, 1, 2]], dtype=dtype)
    torch.testing.assert_close(layer(ids), layer.weight[ids.long()])
    assert layer(ids).shape == (2, 3, 6)
    torch.testing.assert_close(one_hot_embed(ids, layer.weight.detach()), layer.weight.detach()[ids.long()])


def test_scale_multiplies_by_sqrt_d_model():
    torch.manual_seed(0)
    plain, scaled = TokenEmbedding(20, 64), TokenEmbedding(20, 64, scale=True)
    scaled.load_state_dict(plain.state_dict())
    ids = torch.arange(20)
    torch.testing.assert_close(scaled(ids), plain(ids) * 8.0)
    assert not plain.scale and "scale=True" in repr(scaled)


def test_initial_rows_have_length_near_one():
    torch.manual_seed(0)
    layer = TokenEmbedding(2000, 256)
    assert abs(layer.weight.std().item() - 1 / 16) < 0.002
    assert abs(layer.weight.norm(dim=1).mean().item() - 1.0) < 0.02
    assert abs(TokenEmbedding(500, 64, init_std=0.02).weight.std().item() - 0.02) < 0.002


def test_tied_logits_match_a_linear_layer_sharing_the_weight():
    torch.manual_seed(0)
    layer = TokenEmbedding(13, 8)
    head = torch.nn.Linear(8, 13, bias=False)
    head.weight = layer.weight  # the tie, done the torch.nn way
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(layer.logits(x), head(x))
    with pytest.raises(ValueError, match="d_model"):
        layer.logits(torch.randn(2, 7))


def test_the_tied_head_adds_no_parameters_and_trains_the_same_matrix():
    vocab, d = 100, 16
    layer = TokenEmbedding(vocab, d)
    assert [tuple(p.shape) for p in layer.parameters()] == [(vocab, d)]
    x = torch.randn(3, 5, d, dtype=torch.float32)
    layer.logits(x).sum().backward()
    # d/dW of sum(x @ W.T) is, for every row, the sum of the hidden states
    torch.testing.assert_close(layer.weight.grad, x.reshape(-1, d).sum(dim=0).expand(vocab, d))


def test_gradient_touches_only_the_used_rows_and_repeats_add_up():
    torch.manual_seed(0)
    layer = TokenEmbedding(10, 4)
    ids = torch.tensor([2, 7, 2, 2])
    layer(ids).sum().backward()
    expected = torch.zeros(10, 4)
    expected[2], expected[7] = 3.0, 1.0
    torch.testing.assert_close(layer.weight.grad, expected)


def test_tied_gradient_reaches_every_row():
    torch.manual_seed(0)
    layer = TokenEmbedding(10, 4)
    ids = torch.tensor([1, 2, 3])
    F.cross_entropy(layer.logits(layer(ids)), torch.tensor([2, 3, 1])).backward()
    assert (layer.weight.grad.abs().sum(dim=1) > 0).all()


@pytest.mark.parametrize("shape,vocab,d", [((6,), 4, 3), ((3, 5), 30, 2), ((2, 2, 2), 2, 7)])
def test_embedding_weight_grad_equals_autograd(shape, vocab, d):
    generator = torch.Generator().manual_seed(1)
    reference = torch.nn.Embedding(vocab, d).double()
    ids = torch.randint(vocab, shape, generator=generator)
    grad_output = torch.randn(*shape, d, dtype=torch.float64, generator=generator)
    reference(ids).backward(grad_output)
    got = embedding_weight_grad(ids, grad_output, vocab)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, reference.weight.grad)


def test_embedding_weight_grad_refuses_mismatched_shapes():
    with pytest.raises(ValueError, match="grad_output"):
        embedding_weight_grad(torch.tensor([0, 1]), torch.randn(3, 4), 5)
    with pytest.raises(ValueError, match="ids"):
        embedding_weight_grad(torch.tensor([0, 9]), torch.randn(2, 4), 5)


def _naive_neighbours(weight, index, k):
    rows = weight.tolist()
    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    scored = [(cosine(rows[index], row), j) for j, row in enumerate(rows) if j != index]
    return [j for _, j in sorted(scored, reverse=True)[:k]]


@pytest.mark.parametrize("vocab,d,k", [(30, 5, 4), (8, 2, 7), (2, 3, 1)])
def test_nearest_neighbours_against_a_naive_cosine(vocab, d, k):
    generator = torch.Generator().manual_seed(vocab)
    weight = torch.randn(vocab, d, generator=generator) * torch.rand(vocab, 1, generator=generator) * 10
    for index in range(vocab):
        got = nearest_neighbours(weight, index, k)
        assert got.dtype == torch.int64 and index not in got.tolist()
        assert got.tolist() == _naive_neighbours(weight, index, k)


def test_nearest_neighbours_uses_angles_not_lengths():
    weight = torch.tensor([[1.0, 0.0], [0.5, 0.05], [100.0, 60.0]])
    assert nearest_neighbours(weight, 0, 2).tolist() == [1, 2]


def test_nearest_neighbours_ranks_negative_cosines_below_every_other_row_and_leaves_weight_alone():
    weight = torch.tensor([[1.0, 0.0], [-1.0, 0.1], [-1.0, -0.5], [-0.9, 0.0]])
    before = weight.clone()
    assert nearest_neighbours(weight, 0, 3).tolist() == [2, 1, 3]  # all negative: the query must not rank among them
    assert torch.equal(weight, before)


@pytest.mark.parametrize("index,k", [(3, 1), (-1, 1), (0, 0), (0, 3)])
def test_nearest_neighbours_refuses_bad_arguments(index, k):
    with pytest.raises(ValueError, match="index|k"):
        nearest_neighbours(torch.randn(3, 2), index, k)
    with pytest.raises(ValueError, match="weight"):
        nearest_neighbours(torch.randn(3), 0, 1)


@pytest.mark.parametrize("n,d,k", [(40, 6, 2), (7, 12, 3), (25, 3, 1)])
def test_pca_project_against_numpy_eigendecomposition(n, d, k):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, d)) * np.linspace(4, 0.3, d) + 5
    centred = x - x.mean(axis=0)
    eigenvalues, eigenvectors = np.linalg.eigh(np.cov(centred, rowvar=False))
    expected = centred @ eigenvectors[:, ::-1][:, :k]
    got = pca_project(torch.tensor(x), k).numpy()
    assert got.shape == (n, k)
    # the sign convention: each column's largest-magnitude entry is positive
    for column in range(k):
        assert got[np.abs(got[:, column]).argmax(), column] > 0
        sign = np.sign(expected[np.abs(expected[:, column]).argmax(), column])
        np.testing.assert_allclose(got[:, column], sign * expected[:, column], atol=1e-8)
    # variances come out in decreasing order and equal the top eigenvalues
    np.testing.assert_allclose(got.var(axis=0, ddof=1), eigenvalues[::-1][:k], rtol=1e-8)


def test_pca_project_leaves_x_alone_and_ignores_a_translation():
    x = torch.randn(12, 4, dtype=torch.float64)
    before = x.clone()
    first = pca_project(x, 2)
    assert torch.equal(x, before)
    torch.testing.assert_close(pca_project(x + 50.0, 2), first)


def test_one_hot_embed_refuses_a_weight_that_is_not_a_matrix():
    with pytest.raises(ValueError, match="weight"):
        one_hot_embed(torch.tensor([0, 1]), torch.randn(4))


def test_pca_project_refuses_bad_arguments():
    with pytest.raises(ValueError, match="k"):
        pca_project(torch.randn(5, 3), 4)
    with pytest.raises(ValueError, match="k"):
        pca_project(torch.randn(5, 3), 0)
    with pytest.raises(ValueError, match="x"):
        pca_project(torch.randn(5), 1)


@pytest.mark.parametrize("name,value", [("vocab_size", 0), ("d_model", 2.5)])
def test_token_embedding_refuses_bad_sizes(name, value):
    kwargs = {"vocab_size": 4, "d_model": 3, name: value}
    with pytest.raises(ValueError, match=name):
        TokenEmbedding(**kwargs)
    with pytest.raises(ValueError, match="init_std"):
        TokenEmbedding(4, 3, init_std=0.0)


def test_token_embedding_scale_is_a_flag():
    with pytest.raises(TypeError, match="scale"):
        TokenEmbedding(4, 3, scale=1)
