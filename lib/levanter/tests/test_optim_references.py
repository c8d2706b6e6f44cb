"""The element-wise optimizers against their reference implementations: 20 steps of one tiny
network on the same batches on both sides, parameters compared after every step.

The network (an embedding, a norm scale, per-head query and value projections, an MLP with a bias,
an output head; f32) has every kind of parameter the optimizers treat differently. Both sides get
their gradients from the same JAX function, evaluated at that side's own parameters, so the only
difference between the runs is the optimizers' arithmetic. Weight decay applies to matrices only
on both sides (the reference gets vectors in a parameter group without decay). Clipping is off
(``max_grad_norm=None``) and the rate constant unless a case says otherwise.

Tolerance: the two sides order each step's arithmetic differently (decay before or after the
step, ``p * (1 - lr wd) - lr u`` against ``p - lr (u + wd p)``), so a parameter may round to a
neighbouring float32 at every step: one ulp of the parameters' size (all stay below 2 in size,
where an ulp is 2**-22 = 2.4e-7) per step, ``ATOL = 20 * 2**-22 = 4.8e-6`` after 20 steps. The
updates' own rounding (~1e-6 relative, times ``lr = 1e-2``) is two orders below that. Measured:
at most 8e-7.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from haliax.axes import Axes
from levanter.optim import (
    AdamConfig,
    AdamMiniConfig,
    AdoptConfig,
    LionConfig,
    MarsConfig,
    ScheduleFreeAdamConfig,
    SophiaConfig,
)

torch = pytest.importorskip("torch")

VOCAB, D, H, HD, F, B = 11, 8, 2, 4, 12, 6
STEPS = 20
LR = 1e-2
ATOL = STEPS * 2.0**-22

AXES = {
    "embed": Axes(("vocab", "embed")),
    "norm": Axes(("embed",)),
    "q_proj": Axes(("embed", "heads", "head_dim")),
    "v_proj": Axes(("embed", "kv_heads", "head_dim")),
    "mlp_up": Axes(("embed", "mlp")),
    "mlp_bias": Axes(("mlp",)),
    "mlp_down": Axes(("mlp", "embed")),
    "lm_head": Axes(("embed", "vocab")),
}
SHAPES = {
    "embed": (VOCAB, D), "norm": (D,), "q_proj": (D, H, HD), "v_proj": (D, H, HD),
    "mlp_up": (D, F), "mlp_bias": (F,), "mlp_down": (F, D), "lm_head": (D, VOCAB),
}


def initial_params() -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    params = {name: (rng.normal(size=shape) / math.sqrt(shape[0])).astype(np.float32) for name, shape in SHAPES.items()}
    params["norm"] = np.ones(D, np.float32)
    params["mlp_bias"] = np.zeros(F, np.float32)
    return params


def network_loss(p, tokens, targets):
    h = p["embed"][tokens] * p["norm"]
    q = jnp.einsum("bd,dhk->bhk", h, p["q_proj"])
    v = jnp.einsum("bd,dhk->bhk", h, p["v_proj"])
    a = h + jnp.tanh(q * v).reshape(B, D)
    m = a + jnp.tanh(a @ p["mlp_up"] + p["mlp_bias"]) @ p["mlp_down"]
    logits = m @ p["lm_head"]
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets))


def separable_loss(p, tokens, targets):
    """A sum of one smooth convex function per entry: its Hessian is diagonal, so Hutchinson's
    estimate ``z * Hz`` equals the diagonal exactly for any sign vector ``z`` and two
    implementations drawing different random signs still agree."""
    del targets
    total = 0.0
    for i, name in enumerate(sorted(p)):
        shift = jnp.sin(jnp.arange(p[name].size, dtype=jnp.float32) + i + tokens[0]).reshape(p[name].shape)
        total += jnp.sum(jax.nn.softplus(3.0 * (p[name] - shift)) + 0.5 * jnp.square(p[name]))
    return total / 50.0


def batches():
    rng = np.random.RandomState(1)
    return [(rng.randint(0, VOCAB, size=B).astype(np.int32), rng.randint(0, VOCAB, size=B).astype(np.int32)) for _ in range(STEPS)]


_GRADS = {loss: jax.jit(jax.grad(loss)) for loss in (network_loss, separable_loss)}


# --- our side ------------------------------------------------------------------------------------


def run_ours(config, loss=network_loss):
    params = {k: jnp.asarray(v) for k, v in initial_params().items()}
    tx = config.build(STEPS, param_axes=AXES)
    state = tx.init(params)

    @jax.jit
    def step(params, state, tokens, targets):
        grads = jax.grad(loss)(params, tokens, targets)
        extra = {"obj_fn": lambda p: loss(p, tokens, targets)} if config.needs_objective else {}
        updates, state = tx.update(grads, state, params, **extra)
        return optax.apply_updates(params, updates), state

    trajectory = []
    for tokens, targets in batches():
        params, state = step(params, state, tokens, targets)
        trajectory.append(jax.tree.map(np.asarray, params))
    return trajectory, (params, state)


# --- the reference's side --------------------------------------------------------------------------

# Torch keeps a linear layer's weight as [out, in]: the layout the references' per-row rules
# (Adam-mini's blocks) read.
_AS_OUT_IN = {"mlp_up", "mlp_down", "lm_head"}
_HEADS = {"q_proj", "v_proj"}
VECTORS = ("norm", "mlp_bias")


def to_torch(name, x):
    x = np.asarray(x)
    if name in _HEADS:
        return torch.tensor(np.ascontiguousarray(x.reshape(D, H * HD).T))
    return torch.tensor(np.ascontiguousarray(x.T if name in _AS_OUT_IN else x))


def from_torch(name, t):
    x = t.detach().numpy()
    if name in _HEADS:
        return x.T.reshape(D, H, HD)
    return x.T if name in _AS_OUT_IN else x


def run_reference(make_optimizer, loss=network_loss, hessian=None):
    """``make_optimizer(named_tensors)``; ``hessian(params, step)``: a list to pass as ``step(hessian=)``, or None."""
    tensors = {name: torch.nn.Parameter(to_torch(name, value)) for name, value in initial_params().items()}
    optimizer = make_optimizer(tensors)
    trajectory = []
    for i, (tokens, targets) in enumerate(batches()):
        current = {name: jnp.asarray(from_torch(name, t)) for name, t in tensors.items()}
        grads = _GRADS[loss](current, tokens, targets)
        for name, t in tensors.items():
            t.grad = to_torch(name, grads[name])
        estimate = None if hessian is None else hessian(current, tokens, targets, i)
        if estimate is None:
            optimizer.step()
        else:
            names = {id(t): name for name, t in tensors.items()}
            in_group_order = [names[id(t)] for group in optimizer.param_groups for t in group["params"]]
            optimizer.step(hessian=[to_torch(name, estimate[name]) for name in in_group_order])
        trajectory.append({name: from_torch(name, t).copy() for name, t in tensors.items()})
    return trajectory, optimizer, tensors


def decay_groups(tensors, weight_decay, **extra):
    """Matrices decayed, vectors not: our mask's rule, as parameter groups."""
    return [
        {"params": [t for n, t in tensors.items() if n not in VECTORS], "weight_decay": weight_decay, **extra},
        {"params": [t for n, t in tensors.items() if n in VECTORS], "weight_decay": 0.0, **extra},
    ]


def max_difference(ours, theirs):
    return max(float(np.max(np.abs(a[name] - b[name]))) for a, b in zip(ours, theirs) for name in a)


def assert_same_trajectory(ours, theirs, atol=ATOL):
    assert len(ours) == len(theirs) == STEPS
    for step, (a, b) in enumerate(zip(ours, theirs), 1):
        for name in a:
            np.testing.assert_allclose(a[name], b[name], rtol=0, atol=atol, err_msg=f"{name} after step {step}")
    assert max(float(np.max(np.abs(p[n]))) for p in ours for n in p) < 2  # the tolerance's premise
    moved = max(float(np.max(np.abs(ours[-1][n] - initial_params()[n]))) for n in ours[-1])
    assert moved > 100 * atol  # the comparison is not between two runs that stood still


# --- the cases -------------------------------------------------------------------------------------

WD = 0.1
# The references decay the embedding and the head like any matrix (MARS and Adam-mini by their own
# rules), so ours is told to as well: only vectors are left alone here.
COMMON = dict(learning_rate=LR, weight_decay=WD, max_grad_norm=None, lr_schedule="constant", weight_decay_exclude=("vector",))


def test_adopt_matches_pytorch_optimizer():
    """Reference: pytorch_optimizer 4.1.0 ``ADOPT`` (a port of the authors' code; their own is not
    packaged), with decoupled weight decay as ours. optax's ``scale_by_adopt`` clips the normalised
    gradient at ``count**0.25`` with ``count`` the steps before this one; the authors (and the
    reference) at the 1-based step number: we pass theirs (``(count + 1)**0.25``)."""
    from pytorch_optimizer import ADOPT

    ours, _ = run_ours(AdoptConfig(**COMMON, beta1=0.9, beta2=0.999, epsilon=1e-6))
    theirs, _, _ = run_reference(
        lambda t: ADOPT(decay_groups(t, WD), lr=LR, betas=(0.9, 0.999), eps=1e-6, weight_decouple=True)
    )
    assert_same_trajectory(ours, theirs)


def test_mars_matches_pytorch_optimizer():
    """Reference: pytorch_optimizer 4.1.0 ``MARS`` (``mars_type="adamw"``, ``optimize_1d=False``:
    vectors get AdamW with their own betas, the authors' default), ``lr_1d`` = our single rate.
    It adds ``eps`` to ``sqrt(v)`` before the bias correction, we after (as Adam does): with
    ``eps = 1e-12`` the two differ by far less than f32 rounding."""
    from pytorch_optimizer import MARS

    ours, _ = run_ours(MarsConfig(**COMMON, gamma=0.025, epsilon=1e-12))
    theirs, _, _ = run_reference(
        lambda t: MARS(
            list(t.values()), lr=LR, betas=(0.95, 0.99), gamma=0.025, mars_type="adamw", optimize_1d=False,
            lr_1d=LR, betas_1d=(0.9, 0.95), weight_decay=WD, weight_decay_1d=0.0, eps=1e-12,
        )
    )
    assert_same_trajectory(ours, theirs)


def test_cautious_adamw_matches_pytorch_optimizer():
    """Reference: pytorch_optimizer 4.1.0 ``AdEMAMix`` with ``alpha=0`` (then exactly AdamW: the
    slow momentum's weight is 0) and ``cautious=True``: the mask of Liang et al. with their scale
    ``n / (kept + 1)``, applied to the momentum before the division (the same signs as our
    Adam step's)."""
    from pytorch_optimizer import AdEMAMix

    ours, _ = run_ours(AdamConfig(**COMMON, beta1=0.9, beta2=0.95, cautious=True))
    theirs, _, _ = run_reference(
        lambda t: AdEMAMix(decay_groups(t, WD), lr=LR, betas=(0.9, 0.95, 0.999), alpha=0.0, eps=1e-8,
                           weight_decouple=True, cautious=True)
    )
    assert_same_trajectory(ours, theirs)
    plain, _ = run_ours(AdamConfig(**COMMON, beta1=0.9, beta2=0.95))
    assert max_difference(plain, ours) > 100 * ATOL  # the mask changed the run


def test_cautious_lion_matches_pytorch_optimizer():
    """Reference: pytorch_optimizer 4.1.0 ``Lion(cautious=True)``, the same mask on Lion's sign step."""
    from pytorch_optimizer import Lion

    ours, _ = run_ours(LionConfig(**COMMON, beta1=0.9, beta2=0.99, cautious=True))
    theirs, _, _ = run_reference(lambda t: Lion(decay_groups(t, WD), lr=LR, betas=(0.9, 0.99), cautious=True))
    assert_same_trajectory(ours, theirs)


def test_adam_mini_matches_the_authors_package():
    """Reference: the authors' ``adam-mini`` 1.1.1 ``Adam_mini``, which finds its blocks by
    parameter name (``embed``, ``q_proj``, ``v_proj``, ``mlp``, ``lm_head``, ``norm``, ``bias``): the
    names here are chosen so its partition and ours (from axis names) meet: per head for the
    query, per output neuron for the value and the MLP, per token for the embedding and the head,
    one block for the norm scale, Adam for the bias. It decays every parameter whose name has no
    ``norm``/``bias``, as our mask does here."""
    from adam_mini import Adam_mini

    ours, (_, state) = run_ours(AdamMiniConfig(**COMMON, beta1=0.9, beta2=0.95, epsilon=1e-8))
    theirs, _, _ = run_reference(
        lambda t: Adam_mini(list(t.items()), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=WD,
                            dim=D, n_heads=H, n_kv_heads=H, verbose=False)
    )
    assert_same_trajectory(ours, theirs)
    nu = state[1].nu  # the blocks, as stored
    assert {k: v.shape for k, v in nu.items()} == {
        "embed": (VOCAB, 1), "norm": (1,), "q_proj": (1, H, 1), "v_proj": (1, H, HD),
        "mlp_up": (1, F), "mlp_bias": (F,), "mlp_down": (1, D), "lm_head": (1, VOCAB),
    }


def test_sophia_matches_pytorch_optimizer():
    """Reference: pytorch_optimizer 4.1.0 ``SophiaH``, given the Hessian estimate of each
    refresh step through ``step(hessian=)`` (it would otherwise draw its own random signs), on a
    loss whose Hessian is diagonal (see ``separable_loss``), where every sign vector gives the
    exact diagonal. Its update ``clip(m / max(h, eps), -p, p)`` is ours,
    ``clip(m / max(gamma h, epsilon), -1, 1)``, times ``gamma`` when ``p = gamma`` and
    ``eps = epsilon / gamma``: it gets ``lr / gamma`` and ``weight_decay * gamma``. Both follow
    the paper: no bias correction of the momentum, the estimate of a refresh step used by that step
    (optax's ``contrib.sophia`` does both differently)."""
    from pytorch_optimizer import SophiaH

    gamma, interval = 0.05, 4
    config = SophiaConfig(**COMMON, beta1=0.9, beta2=0.95, gamma=gamma, epsilon=1e-12, update_interval=interval)
    ours, _ = run_ours(config, loss=separable_loss)

    hessian_diagonal = jax.jit(lambda p, tokens, targets: jax.jvp(
        jax.grad(lambda q: separable_loss(q, tokens, targets)), (p,), (jax.tree.map(jnp.ones_like, p),))[1])

    def hessian(params, tokens, targets, i):
        return hessian_diagonal(params, tokens, targets) if i % interval == 0 else None

    theirs, _, _ = run_reference(
        lambda t: SophiaH(decay_groups(t, WD * gamma), lr=LR / gamma, betas=(0.9, 0.95), p=gamma, eps=1e-12 / gamma,
                          update_period=interval, weight_decouple=True),
        loss=separable_loss, hessian=hessian,
    )
    assert_same_trajectory(ours, theirs)


def test_schedule_free_adamw_matches_the_authors_package():
    """Reference: Meta's ``schedulefree`` 1.4.1 ``AdamWScheduleFree`` (warm-up 5 steps, weight decay
    at ``y``), compared at the training point ``y`` after every step and, at the end, at the point
    it evaluates (``optimizer.eval()``) against our ``evaluation_params``."""
    from schedulefree import AdamWScheduleFree

    config = ScheduleFreeAdamConfig(**{**COMMON, "warmup": 5}, beta1=0.9, beta2=0.999, epsilon=1e-8)
    ours, (params, state) = run_ours(config)
    theirs, optimizer, tensors = run_reference(
        lambda t: _train_mode(AdamWScheduleFree(decay_groups(t, WD), lr=LR, betas=(0.9, 0.999), eps=1e-8,
                                                warmup_steps=5, foreach=False))
    )
    assert_same_trajectory(ours, theirs)

    optimizer.eval()
    evaluated = config.evaluation_params(params, state)
    for name, t in tensors.items():
        np.testing.assert_allclose(np.asarray(evaluated[name]), from_torch(name, t), rtol=0, atol=ATOL, err_msg=name)
    assert max(float(np.max(np.abs(evaluated[n] - params[n]))) for n in params) > 100 * ATOL  # x is not y


def _train_mode(optimizer):
    optimizer.train()
    return optimizer
