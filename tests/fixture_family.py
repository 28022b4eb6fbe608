"""A tiny family for plug-in tests (like brax's ``envs/fast.py``): one server that serves
the head request alone, ``output * 0.02 / speed`` seconds per request, and drops a
request whose KV (prompt + output) exceeds capacity. Importing registers family ``toy``
and its system ``toy`` (one tunable parameter, ``speed``)."""

import jax.numpy as jnp
from flax import struct

from models import Inputs, ParamSpec, SystemSpec, register_family, register_system
from models.outcomes import CORE_METRICS, core_metrics
from models.server import Acc, Finished, Record, init_acc, init_record, pack_bits


@struct.dataclass
class ToyState:
    head: jnp.ndarray
    clock: jnp.ndarray
    it: jnp.ndarray
    acc: Acc
    rec: Record | None


class Toy:
    name = "toy"
    metrics_spec = CORE_METRICS

    def options(self, system, **settings):
        if settings:
            raise ValueError(f"toy takes no options, got {sorted(settings)}")

    def extra(self, wl, cfg, opts, history=None, deployment=None):
        return None

    def init(self, inputs: Inputs, params, t, opts):
        rec = init_record(inputs.wl.size) if opts.record else None
        return ToyState(head=jnp.int32(0), clock=jnp.float32(0.0), it=jnp.int32(0),
                        acc=init_acc(), rec=rec)

    def step(self, st, inputs, params, *, hw, t, opts):
        wl, cfg, a = inputs.wl, inputs.cfg, st.acc
        i = jnp.minimum(st.head, wl.size - 1)
        live = (st.head < wl.size) & wl.valid[i]
        out, need = wl.output_tokens[i], wl.prompt_tokens[i] + wl.output_tokens[i]
        serve = live & (need <= cfg.capacity_tokens)
        start = jnp.maximum(st.clock, wl.arrival_s[i])
        tpot = 0.02 / params["speed"]
        clock = jnp.where(serve, start + out * tpot, st.clock)
        ttft = start + tpot - wl.arrival_s[i]
        w = serve.astype(jnp.float32)
        acc = a.replace(
            completed=a.completed + w, tokens=a.tokens + w * out,
            actual_kv=a.actual_kv + w * need, dropped=a.dropped + (live & ~serve),
            queue_s=a.queue_s + w * (start - wl.arrival_s[i]),
            ttft_ok=a.ttft_ok + w * (ttft <= cfg.ttft_slo_s),
            tpot_ok=a.tpot_ok + w * (tpot <= cfg.tpot_slo_s),
            slo_ok=a.slo_ok + w * (ttft <= cfg.ttft_slo_s) * (tpot <= cfg.tpot_slo_s),
            peak_kv=jnp.maximum(a.peak_kv, w * need),
            max_use=jnp.maximum(a.max_use, w * need / cfg.capacity_tokens),
            busy_s=a.busy_s + w * out * tpot, iters=a.iters + w,
            res_token_s=a.res_token_s + w * need * out * tpot)
        rec = st.rec
        if rec is not None:
            j = jnp.where(serve, i, wl.size)
            rec = rec.replace(admit_iter=rec.admit_iter.at[j].set(st.it, mode="drop"),
                              finish_iter=rec.finish_iter.at[j].set(st.it, mode="drop"),
                              first_s=rec.first_s.at[j].set(start + tpot, mode="drop"),
                              finish_s=rec.finish_s.at[j].set(clock, mode="drop"))
        fin = Finished(length=jnp.where(serve, out, 0)[None], ttft=ttft[None],
                       tpot=jnp.broadcast_to(tpot, (1,)), bits=pack_bits(serve[None]))
        new = ToyState(head=st.head + (st.head < wl.size), clock=clock, it=st.it + 1,
                       acc=acc, rec=rec)
        return new, (w * need, fin)

    def sink(self, opts):
        return None

    def end_block(self, state, inputs, params, *, t, opts):
        return state

    def done(self, state, inputs):
        return state.head >= jnp.sum(inputs.wl.valid)

    def metrics(self, state, inputs):
        return core_metrics(state, inputs)


register_family(Toy())
TOY = register_system(SystemSpec(
    name="toy", family="toy", doc="fixture: one request at a time",
    params=(ParamSpec("speed", "interval", "1", "service speed", 0.5, 2.0),),
    defaults=lambda max_len, hw=None: {"speed": 1.0}, baselines=("toy",)))
