"""A learned per-request policy: a small flax MLP of each request's features sets how
much its predicted output length is inflated (or deflated) before a bucketed system
reserves KV memory for it (``target="inflation"``), or the request's scheduling
priority (``target="priority"``).

For ODMA the reservation of request ``i`` becomes ``pred_i m_i (1 + gamma u_i)`` with
``m_i = exp(M tanh(mlp(f_i)))`` in ``[e^-M, e^M]``: a per-request inflation, where the
system's own parameters (``gamma``, ``tau``, the quantile levels) give one rule for
every request. The features ``f_i`` are what the server knows at admission: the prompt
length, the predicted output length and its uncertainty ``u`` (log lengths over
log ``max_len``). The last layer starts at zero, so the start policy is the system's
default exactly (``m_i = 1``).

With ``target="priority"`` the MLP's output is request ``i``'s priority as vLLM V1's
``--scheduling-policy priority`` reads it (lower first, ties by arrival;
``Workload.priority``, ``models.bucketed.admission``): the zero start gives every request
the same priority, first-come-first-served, the system's default. The order is a hard
decision in both modes, so the relaxed gradient of the weights is zero: a priority
policy is for the black-box searches and the gradient-free guided steps.

:class:`LearnedProblem` is a :class:`tuner.objective.problem.Problem` whose theta is the
MLP's weights (hundreds of coordinates): the same exact and relaxed evaluation, rate
ladder, CRN stack and cost accounting, so the black-box searches of
:mod:`tuner.search.blackbox` and :func:`tuner.search.descend.descend` run on it as they
are. The weights enter the run only through the workload's ``pred_tokens``, which the
bucketed family reads at admission alone (``models.bucketed.admission``); the window
prior is built on the host from the original predictions.
"""

from __future__ import annotations

from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from models.simulate import note_trace
from tuner.objective.problem import Problem, _counted, _value_impl
from tuner.objective.space import Space

__all__ = ["FEATURES", "MLPSpace", "LearnedProblem", "TARGETS", "multipliers",
           "priorities"]

FEATURES = ("log prompt / log max_len", "log predicted output / log max_len", "u")
MAX_LOG_MULT = float(np.log(4.0))  # m_i in [1/4, 4]
TARGETS = ("inflation", "priority")  # what the MLP's output sets


class _MLP(nn.Module):
    hidden: tuple

    @nn.compact
    def __call__(self, f):
        for h in self.hidden:
            f = nn.tanh(nn.Dense(h)(f))
        return nn.Dense(1, kernel_init=nn.initializers.zeros)(f)[..., 0]


class MLPSpace:
    """Theta of a learned policy: the MLP's weights by flat name (``Dense_0/kernel``,
    ...), with the interface of :class:`tuner.objective.space.Space` that the searches
    use (``names``, ``base``, ``coords``, ``to_theta``, ``to_params``, ``human``).
    Hashable by structure: a static argument of the jitted functions."""

    def __init__(self, hidden=(12, 12), seed: int = 0, target: str = "inflation"):
        self.hidden = tuple(int(h) for h in hidden)
        if not self.hidden or min(self.hidden) < 1:
            raise ValueError(f"learned policy: hidden layer sizes must be >= 1, got "
                             f"{hidden}")
        if target not in TARGETS:
            raise ValueError(f"learned policy: target {target!r}: one of "
                             f"{', '.join(TARGETS)}")
        self.target = target
        self.module = _MLP(self.hidden)
        tree = self.module.init(jax.random.PRNGKey(seed),
                                jnp.zeros((1, len(FEATURES)), jnp.float32))["params"]
        self._paths = [(a, b) for a in sorted(tree) for b in sorted(tree[a])]
        self.base = {f"{a}/{b}": jnp.asarray(tree[a][b], jnp.float32)
                     for a, b in self._paths}
        self.seed = int(seed)

    def _key(self):
        return ("mlp", self.hidden, self.seed, self.target)

    def __hash__(self):
        return hash(self._key())

    def __eq__(self, other):
        return isinstance(other, MLPSpace) and self._key() == other._key()

    @property
    def names(self) -> list[str]:
        return [f"{a}/{b}" for a, b in self._paths]

    def coords(self) -> list[tuple[str, int]]:
        return [(n, i) for n in self.names for i in range(int(np.size(self.base[n])))]

    def to_theta(self, params: dict) -> dict:
        return {n: jnp.asarray(params[n], jnp.float32) for n in self.names}

    def to_params(self, theta: dict, base: dict | None = None) -> dict:
        return dict(theta)

    def human(self, params: dict) -> dict:
        return {k: np.asarray(v).tolist() for k, v in params.items()}

    def apply(self, theta: dict, feats):
        tree: dict = {}
        for a, b in self._paths:
            tree.setdefault(a, {})[b] = theta[f"{a}/{b}"]
        return self.module.apply({"params": tree}, feats)


def features(wl, max_len) -> jax.Array:
    """[..., N, 3] features of every request (see :data:`FEATURES`)."""
    lm = jnp.log(jnp.float32(max_len))
    return jnp.stack([jnp.log(jnp.maximum(wl.prompt_tokens.astype(jnp.float32), 1.0)) / lm,
                      jnp.log(jnp.maximum(wl.pred_tokens, 1.0)) / lm,
                      wl.pred_u.astype(jnp.float32)], -1)


def multipliers(space: MLPSpace, theta: dict, wl, max_len) -> jax.Array:
    """[..., N] each request's multiplier ``m_i`` of its predicted length."""
    return jnp.exp(MAX_LOG_MULT * jnp.tanh(space.apply(theta, features(wl, max_len))))


def priorities(space: MLPSpace, theta: dict, wl, max_len) -> jax.Array:
    """[..., N] each request's priority (lower first); padding rows last."""
    return jnp.where(wl.valid, space.apply(theta, features(wl, max_len)), jnp.inf)


def _apply_policy(space, theta, x):
    """The inputs with each request's prediction scaled by its multiplier, or (target
    ``priority``) with its priority set (elementwise over requests, so a CRN stack of
    inputs is transformed as it is)."""
    wl = x.wl
    if space.target == "priority":
        return x.replace(wl=wl.replace(priority=priorities(space, theta, wl,
                                                           x.cfg.max_len)))
    m = multipliers(space, theta, wl, x.cfg.max_len)
    return x.replace(wl=wl.replace(pred_tokens=wl.pred_tokens * m))


def _learned_impl(theta, t, base, inputs, hw, lad, *, space, plain, opts, n_steps,
                  objective):
    """``tuner.objective.problem``'s objective of the system's fixed parameters
    (``plain``: a space with nothing to tune, ``base`` its parameters) on the inputs
    with the policy applied."""
    return _value_impl({}, t, base, _apply_policy(space, theta, inputs), hw, lad,
                       space=plain, opts=opts, n_steps=n_steps, objective=objective)


_STATIC = ("space", "plain", "opts", "n_steps", "objective")
_value = jax.jit(_counted("LearnedProblem.value", _learned_impl), static_argnames=_STATIC)
_grad = jax.jit(_counted("LearnedProblem.grad",
                         jax.value_and_grad(_learned_impl, has_aux=True)),
                static_argnames=_STATIC)


@partial(jax.jit, static_argnames=_STATIC)
def _batch(thetas, t, base, inputs, hw, lad, *, space, plain, opts, n_steps, objective):
    note_trace("LearnedProblem.batch", opts, thetas, t, base, inputs, hw, lad)

    def one(th):
        lv, (v, _) = _learned_impl(th, t, base, inputs, hw, lad, space=space, plain=plain,
                                   opts=opts, n_steps=n_steps, objective=objective)
        return lv, v

    return jax.vmap(one)(thetas)


class LearnedProblem(Problem):
    """A :class:`Problem` whose theta is a learned per-request policy's weights (over
    ``system``'s parameters ``params``, held fixed)."""

    def __init__(self, scenarios, system: str, params: dict, objective, n_steps: int,
                 rates=None, space: MLPSpace | None = None):
        from models import get_system

        spec = get_system(system)
        if spec.family != "bucketed":
            raise ValueError(f"learned policy: system {system!r} is not a bucketed system "
                             "(the policy scales the predictions they reserve by, or "
                             "sets the priorities they admit by)")
        super().__init__(scenarios, system, Space(spec, params, names=()), objective,
                         n_steps, rates)
        # the parent's args and statics (its space's base = the fixed parameters), with
        # the MLP as the space theta belongs to
        self._static = dict(self._static, space=space or MLPSpace(),
                            plain=self._static["space"])
        self.space = self._static["space"]

    def grad(self, theta, t):
        self._spend(1, backward=True)
        (lv, (v, m)), g = _grad(theta, jnp.float32(t), *self._args, **self._static)
        out = {k: float(x) for k, x in m.items()}
        out["log_objective"] = float(lv)
        return float(v), g, out

    def value(self, theta, t=0.0):
        self._spend(1)
        lv, (v, m) = _value(theta, jnp.float32(t), *self._args, **self._static)
        self._report([theta], [float(v)], t)
        out = {k: float(x) for k, x in m.items()}
        out["log_objective"] = float(lv)
        return float(v), out

    def batch(self, thetas: list[dict], t=0.0, log: bool = False) -> np.ndarray:
        self._spend(len(thetas))
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *thetas)
        lv, v = _batch(stacked, jnp.float32(t), *self._args, **self._static)
        v = np.asarray(v)
        self._report(thetas, v, t)
        return np.asarray(lv) if log else v
