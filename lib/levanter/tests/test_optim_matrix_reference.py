"""Muon, Scion, SOAP and Kron against PyTorch references: 20 steps of the same tiny model on the
same data, parameters compared after every step.

The model is a miniature language model with one parameter of each role the optimizers tell apart
(see ``levanter.optim.matrix_layout``): an embedding table, two hidden matrices, a bias vector and
an output head. Both sides compute their own gradients in float32 from their own parameters; the
PyTorch side stores linear weights as ``[out, in]`` as PyTorch does, ours as ``[in, out]``.

Tolerances. Gradients agree to a few float32 ulps (relative ~1e-7). Each optimizer then maps them
through its own arithmetic, and what matters is how much that arithmetic can grow a relative
error per step (its amplification ``A``), times the update size ``lr * scale``, summed over 20
steps: ``tol = 20 * lr * scale * A * 1e-6`` (1e-6 is ~10 ulps of float32, the slack for the
different summation orders of both sides). Each test states its ``A``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from haliax.axes import Axes
from levanter.optim.muon import MuonConfig

torch = pytest.importorskip("torch")

STEPS = 20
VOCAB, EMBED, HIDDEN, BATCH = 8, 4, 6, 32
ULPS = 1e-6

AXES = {
    "embedding": Axes(("vocab", "embed")),
    "w_in": Axes(("embed", "mlp")),
    "bias": Axes(("mlp",)),
    "w_out": Axes(("mlp", "embed")),
    "head": Axes(("embed", "vocab")),
}
LINEAR = ("w_in", "w_out", "head")  # stored transposed on the PyTorch side


def initial_params(dims=(VOCAB, EMBED, HIDDEN)):
    vocab, embed, hidden = dims
    rng = np.random.RandomState(0)
    shapes = {"embedding": (vocab, embed), "w_in": (embed, hidden), "bias": (hidden,), "w_out": (hidden, embed), "head": (embed, vocab)}
    return {name: (0.5 * rng.randn(*shape)).astype(np.float32) for name, shape in shapes.items()}


def batches(vocab=VOCAB):
    rng = np.random.RandomState(1)
    return [(rng.randint(0, vocab, BATCH), rng.randint(0, vocab, BATCH)) for _ in range(STEPS)]


def loss_jax(params, tokens, targets):
    x = params["embedding"][tokens]
    h = jnp.tanh(x @ params["w_in"] + params["bias"])
    logits = (h @ params["w_out"]) @ params["head"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


def loss_torch(params, tokens, targets):
    x = params["embedding"][tokens]
    h = torch.tanh(x @ params["w_in"].T + params["bias"])
    logits = (h @ params["w_out"].T) @ params["head"].T
    return torch.nn.functional.cross_entropy(logits, targets)


def run_ours(config, param_axes=AXES, dims=(VOCAB, EMBED, HIDDEN)) -> list[dict[str, np.ndarray]]:
    params = jax.tree.map(jnp.asarray, initial_params(dims))
    tx = config.build(STEPS, param_axes=param_axes)
    state = tx.init(params)

    @jax.jit
    def step(params, state, tokens, targets):
        grads = jax.grad(loss_jax)(params, tokens, targets)
        updates, state = tx.update(grads, state, params)
        return optax.apply_updates(params, updates), state

    history = []
    for tokens, targets in batches(dims[0]):
        params, state = step(params, state, tokens, targets)
        history.append(jax.tree.map(np.asarray, params))
    return history


def run_reference(make_optimizers, before_step=None, dims=(VOCAB, EMBED, HIDDEN)) -> list[dict[str, np.ndarray]]:
    """``make_optimizers(params)``: the PyTorch optimizers over the dict of PyTorch tensors;
    ``before_step(step)`` runs after the gradients are computed, before the optimizers step."""
    params = {
        name: torch.tensor(value.T.copy() if name in LINEAR else value, requires_grad=True)
        for name, value in initial_params(dims).items()
    }
    optimizers = make_optimizers(params)
    history = []
    for step, (tokens, targets) in enumerate(batches(dims[0])):
        for opt in optimizers:
            opt.zero_grad()
        loss_torch(params, torch.tensor(tokens), torch.tensor(targets)).backward()
        if before_step is not None:
            before_step(step)
        for opt in optimizers:
            opt.step()
        history.append(
            {name: p.detach().numpy().T.copy() if name in LINEAR else p.detach().numpy().copy() for name, p in params.items()}
        )
    return history


def max_difference(ours, theirs) -> float:
    return max(float(np.max(np.abs(a[name] - b[name]))) for a, b in zip(ours, theirs, strict=True) for name in a)


def assert_step_by_step_close(ours, theirs, tol, dims=(VOCAB, EMBED, HIDDEN)):
    for step, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=0, atol=tol, err_msg=f"step {step}, {name}")
    # The runs moved: equal histories of unchanged parameters would prove nothing.
    assert max(float(np.max(np.abs(ours[-1][n] - initial_params(dims)[n]))) for n in ours[-1]) > 100 * tol


@pytest.fixture
def float32_newton_schulz(monkeypatch):
    """PyTorch's Muon runs Newton-Schulz in bfloat16 (``grad.bfloat16()``); ours in float32. For the
    comparison its own iteration runs in float32: ``Tensor.bfloat16`` returns a float32 copy."""
    monkeypatch.setattr(torch.Tensor, "bfloat16", lambda self: self.clone())


@pytest.mark.parametrize("update_scale, torch_rule", [("fan_ratio", "original"), ("adamw_rms", "match_rms_adamw")])
def test_muon_matches_torch_optim_muon(float32_newton_schulz, update_scale, torch_rule):
    """Reference: torch.optim.Muon (torch 2.13) on the hidden matrices, torch.optim.AdamW on the
    embedding, bias and head, as its documentation prescribes.

    Definitions: torch keeps momentum as an average (``buf.lerp_(g, 1 - mu)``, Nesterov
    ``g.lerp(buf, mu)``), we as a sum (``optax.trace``): the two differ by the factor ``1 - mu``,
    which Newton-Schulz's normalisation removes. No bias correction on either side (optax.contrib's
    ``scale_by_muon`` bias-corrects its Nesterov average, which changes the direction in early
    steps; torch and Keller Jordan's original do not, and we follow them). Weight decay: both
    ``p * (1 - lr * wd)`` with the unscaled rate, on the hidden matrices only (our default mask
    leaves the embedding, the head and vectors alone). ``update_scale`` is torch's ``adjust_lr_fn``.

    Amplification: five Newton-Schulz steps multiply a small singular value by at most
    ``3.4445**5 ~ 500``, so a relative error of the momentum can grow 500-fold: ``A = 500``.
    """
    lr, adam_lr, wd = 0.02, 0.01, 0.1
    config = MuonConfig(
        lr, wd, max_grad_norm=None, lr_schedule="constant", momentum=0.95, update_scale=update_scale,
        adam_learning_rate=adam_lr, adam_beta1=0.9, adam_beta2=0.99, adam_epsilon=1e-8,
    )
    ours = run_ours(config)

    def optimizers(p):
        return [
            torch.optim.Muon([p["w_in"], p["w_out"]], lr=lr, weight_decay=wd, momentum=0.95, nesterov=True, adjust_lr_fn=torch_rule),
            torch.optim.AdamW(
                [{"params": [p["embedding"], p["head"], p["bias"]], "weight_decay": 0.0}],  # as our default mask
                lr=adam_lr, betas=(0.9, 0.99), eps=1e-8,
            ),
        ]

    theirs = run_reference(optimizers)
    scale = 0.2 * HIDDEN**0.5 if update_scale == "adamw_rms" else (HIDDEN / EMBED) ** 0.5
    assert_step_by_step_close(ours, theirs, tol=STEPS * lr * scale * 500 * ULPS)


def test_scion_matches_pytorch_optimizer_scion(monkeypatch):
    """Reference: pytorch-optimizer 4.1.0's ``SCION`` (the authors' code is not on PyPI), with the
    paper's GPT recipe as parameter groups: spectral LMO for hidden matrices, column norm for the
    embedding (``Col(transpose=True)`` on PyTorch's ``[vocab, embed]`` table), sign for the head,
    RMS for the bias. Same momentum (weight of the new gradient), radii and decoupled weight decay
    (``p * (1 - lr * wd)`` before the step; on the hidden matrices only, as our default mask decides).
    pytorch-optimizer runs Newton-Schulz in bfloat16 by default; its function takes ``dtype=``,
    set to float32 here.

    Amplification: Newton-Schulz as for Muon (500) on a radius-50 step; the sign LMO flips only
    where a momentum entry is within rounding of 0, which these gradients are not: ``A = 500``.
    """
    import pytorch_optimizer.optimizer.scion as reference
    from levanter.optim.scion import ScionConfig

    monkeypatch.setattr(
        reference, "zero_power_via_newton_schulz_5",
        functools.partial(reference.zero_power_via_newton_schulz_5, dtype=torch.float32),
    )
    lr, wd, radius, head_radius = 1e-3, 0.1, 50.0, 3000.0
    config = ScionConfig(
        lr, wd, max_grad_norm=None, lr_schedule="constant", momentum=0.1,
        hidden_radius=radius, embedding_radius=radius, head_radius=head_radius, vector_radius=radius,
    )
    ours = run_ours(config)

    def optimizers(p):
        norm = reference.LMONorm
        groups = [
            {"params": [p["w_in"], p["w_out"]], "norm_type": norm.SPECTRAL, "scale": radius},
            {"params": [p["embedding"]], "norm_type": norm.COL, "norm_kwargs": {"transpose": True}, "scale": radius,
             "weight_decay": 0.0},
            {"params": [p["head"]], "norm_type": norm.SIGN, "scale": head_radius, "weight_decay": 0.0},
            {"params": [p["bias"]], "norm_type": norm.BIAS, "scale": radius, "weight_decay": 0.0},
        ]
        return [reference.SCION(groups, lr=lr, momentum=0.1, weight_decay=wd, foreach=False)]

    theirs = run_reference(optimizers)
    assert_step_by_step_close(ours, theirs, tol=STEPS * lr * radius * 500 * ULPS)


def test_soap_matches_pytorch_optimizer_soap():
    """Reference: pytorch-optimizer 4.1.0's ``SOAP`` (a port of the authors' code), configured as
    ours: betas (0.95, 0.95), shampoo_beta = beta2, eps 1e-8, bases refreshed every 5 steps (so 20
    steps cover three refreshes), no dimension merging, vectors not preconditioned. Both skip the
    first step (it only sets up the bases) and bias-correct from the second.

    Differences, kept out of the comparison: the reference decays the weights *after* the step
    (``p - lr * u`` then ``* (1 - lr * wd)``) and not on the first step; ours decays the weights
    before it, like AdamW, on every step (a difference of ``lr**2 * wd * |u|`` per step), so this
    runs without weight decay.

    The statistics must be well conditioned for two correct implementations to agree: an
    eigenvector is only as precise as float32 rounding over its eigengap, and the first statistic
    of an ``[m, n]`` gradient has rank ``min(m, n)`` (its null space's eigenvectors are arbitrary).
    A head's gradient is also orthogonal to the all-ones vocabulary vector (softmax ignores a
    constant shift). Hence 5 x 5 hidden matrices, 24 tokens (so every first statistic has its
    smallest eigenvalue above 1e-3 of its largest) and ``max_precond_dim=5``, which leaves the
    vocabulary side in the identity basis, as a real vocabulary (above the default 10000) is.
    Eigenvector signs differ between LAPACK calls but cancel: the basis enters once rotating in
    and once rotating out, and Adam's second moment is squared.

    Amplification: the rotation back multiplies by orthogonal matrices (norm 1); Adam's
    ``m / sqrt(v)`` is bounded by ``1 / (1 - beta1)`` per entry; an eigenvector's error is the
    rounding of its matrix over the eigengap, here a thousandth of the matrix's norm or more:
    ``A = 1000`` (``tol`` 2e-4; measured: 4e-7).
    """
    from pytorch_optimizer import SOAP

    from levanter.optim.soap import SOAPConfig

    lr = 0.01
    config = SOAPConfig(
        lr, 0.0, max_grad_norm=None, lr_schedule="constant", beta1=0.95, beta2=0.95, precondition_frequency=5, max_precond_dim=5
    )
    square = (24, 5, 5)
    ours = run_ours(config, dims=square)
    theirs = run_reference(
        lambda p: [
            SOAP(list(p.values()), lr=lr, betas=(0.95, 0.95), weight_decay=0.0, precondition_frequency=5, eps=1e-8,
                 max_precondition_dim=5)
        ],
        dims=square,
    )
    assert_step_by_step_close(ours, theirs, tol=STEPS * lr * 1000 * ULPS, dims=square)


def test_kron_matches_pytorch_optimizer_kron(monkeypatch):
    """Reference: pytorch-optimizer 4.1.0's ``Kron``, configured as ours: momentum 0.9, a
    preconditioner update every step (``pre_conditioner_update_probability=1``), its fixed
    preconditioner step 0.1 and initial scale 1, decoupled weight decay on 2-D parameters (ours
    told to do the same with ``weight_decay_exclude=("vector",)``: by default it would leave the
    embedding and the head alone).

    Made deterministic on both sides: the reference draws its probes with ``torch.randn_like``,
    replaced here by ours (:func:`levanter.optim.kron.kron_probe`, transposed to PyTorch's
    ``[out, in]``), and rebalances its factors with probability ``balance_prob``, set to 0 (we
    rebalance every 100th update; rebalancing leaves the preconditioner unchanged in exact
    arithmetic anyway).

    Amplification: each factor moves by at most ``0.1 * |Q|`` per update, normalised by a norm
    bound of its own statistics, and the step is capped at RMS 1.1; a relative error of the
    momentum reaches the step through two factor products and the cap: ``A = 100``.
    """
    from pytorch_optimizer import Kron

    import levanter.optim.kron as kron
    from levanter.optim.kron import KronConfig
    from levanter.optim.matrix_layout import matrix_layouts

    lr, wd, seed = 0.01, 0.1, 3
    config = KronConfig(
        lr, wd, max_grad_norm=None, lr_schedule="constant", beta1=0.9, preconditioner_update_probability=1.0, seed=seed,
        weight_decay_exclude=("vector",),
    )
    ours = run_ours(config)

    params = initial_params()
    names = list(params)  # the reference's parameter order; ours draws probes by leaf index
    leaf_index = {name: i for i, name in enumerate(sorted(params))}
    layouts = matrix_layouts(params, AXES)
    probes: list = []

    def draw_probes(step):
        for name in names:
            probe = np.asarray(kron.kron_probe(jax.random.PRNGKey(seed), step, leaf_index[name], layouts[name]))[0]
            probes.append(torch.tensor(probe.T.copy() if name in LINEAR else probe))

    def shared_probe(like, dtype=None):
        probe = probes.pop(0)
        assert probe.shape == like.shape
        return probe.to(dtype or like.dtype)

    monkeypatch.setattr(torch, "randn_like", shared_probe)
    theirs = run_reference(
        lambda p: [
            Kron(
                [p[name] for name in names], lr=lr, momentum=0.9, weight_decay=wd, pre_conditioner_update_probability=1.0,
                balance_prob=0.0,
            )
        ],
        before_step=draw_probes,
    )
    assert not probes  # every probe was drawn by the reference
    assert_step_by_step_close(ours, theirs, tol=STEPS * lr * 100 * ULPS)
