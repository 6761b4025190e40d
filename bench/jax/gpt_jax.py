"""The JAX side of bench/jax/run_side_by_side.sh: the same GPT forward as tessel's
src/models/gpt.cpp, and the dispatch cost of a tiny jitted function, timed on CPU.

  gpt_jax.py gpt --config example|gpt2 --mesh 1|data2|model2 [--min-time 2] [--repeats 3]
  gpt_jax.py overhead --devices N [--min-time 1] [--repeats 3]

Prints one JSON object per line: {"bench": ..., "median_s": ..., "tokens_per_s": ...}.
The device count and XLA's threading come from XLA_FLAGS, set by the caller before Python
starts (--xla_force_host_platform_device_count=N, --xla_cpu_multi_thread_eigen=false).

The model is tessel's GPT op for op (models/gpt.hpp): token + position embedding; per layer
pre-norm layer_norm (eps 1e-5, biased variance), q/k/v = einsum bsd,dhk->bshk, scores =
einsum bqhk,bshk->bhqs times 1/sqrt(Dh), causal mask (-inf above the diagonal), softmax,
einsum bhqs,bshk->bqhk, einsum bqhk,hkd->bqd, residual; layer_norm, gelu (tanh
approximation) of (h2 @ w1 + b1), @ w2 + b2, residual; final layer_norm, tied LM head
einsum bsd,vd->bsv, mean cross-entropy. f32 throughout. The timed call is the jitted loss on
device-resident inputs (jax.block_until_ready), as tessel's LoadedExecutable::run is timed
on device-resident ShardedArrays.
"""
import argparse
import json
import math
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

CONFIGS = {
    # examples/gpt.cpp's defaults (GptConfig)
    "example": dict(batch=8, seq=64, d_model=128, heads=4, layers=2, vocab=512),
    # a GPT-2-small-sized block
    "gpt2": dict(batch=4, seq=256, d_model=768, heads=12, layers=2, vocab=8192),
}


def init_params(cfg, key):
    D, H, V, S = cfg["d_model"], cfg["heads"], cfg["vocab"], cfg["seq"]
    K, F = D // H, 4 * D
    scale = 0.02 * math.sqrt(3.0)  # gpt_init: U(-1, 1) * 0.02 * sqrt(3)
    keys = iter(jax.random.split(key, 64))

    def w(shape):
        return jax.random.uniform(next(keys), shape, jnp.float32, -1.0, 1.0) * scale

    p = {"wte": w((V, D)), "wpe": w((S, D)), "layers": []}
    for _ in range(cfg["layers"]):
        p["layers"].append({
            "ln1_g": jnp.ones((D,)), "ln1_b": jnp.zeros((D,)),
            "wq": w((D, H, K)), "wk": w((D, H, K)), "wv": w((D, H, K)), "wo": w((H, K, D)),
            "ln2_g": jnp.ones((D,)), "ln2_b": jnp.zeros((D,)),
            "w1": w((D, F)), "b1": jnp.zeros((F,)), "w2": w((F, D)), "b2": jnp.zeros((D,)),
        })
    p["lnf_g"], p["lnf_b"] = jnp.ones((D,)), jnp.zeros((D,))
    return p


def layer_norm(x, g, b, eps=1e-5):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)  # biased
    return (x - mean) * jax.lax.rsqrt(var + eps) * g + b


def gelu(x):  # GPT-2's tanh approximation, as tessel's kernel
    return jax.nn.gelu(x, approximate=True)


def loss_fn(p, tokens, labels):
    S = tokens.shape[1]
    x = p["wte"][tokens] + p["wpe"]
    for l in p["layers"]:
        K = l["wq"].shape[2]
        h = layer_norm(x, l["ln1_g"], l["ln1_b"])
        q = jnp.einsum("bsd,dhk->bshk", h, l["wq"])
        k = jnp.einsum("bsd,dhk->bshk", h, l["wk"])
        v = jnp.einsum("bsd,dhk->bshk", h, l["wv"])
        s = jnp.einsum("bqhk,bshk->bhqs", q, k) * (1.0 / math.sqrt(K))
        mask = jnp.tril(jnp.ones((S, S), dtype=bool))
        s = jnp.where(mask, s, -jnp.inf)
        pr = jax.nn.softmax(s, axis=-1)
        o = jnp.einsum("bhqs,bshk->bqhk", pr, v)
        x = x + jnp.einsum("bqhk,hkd->bqd", o, l["wo"])
        h2 = layer_norm(x, l["ln2_g"], l["ln2_b"])
        u = gelu(jnp.einsum("bsd,df->bsf", h2, l["w1"]) + l["b1"])
        x = x + jnp.einsum("bsf,fd->bsd", u, l["w2"]) + l["b2"]
    xf = layer_norm(x, p["lnf_g"], p["lnf_b"])
    logits = jnp.einsum("bsd,vd->bsv", xf, p["wte"])
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    return jnp.mean(lse - picked)


def param_specs(p, mesh_kind):
    """Tessel's Megatron annotations (models/gpt.hpp) when the mesh has a model axis."""
    if mesh_kind != "model2":
        return jax.tree_util.tree_map(lambda _: P(), p)
    specs = {"wte": P(), "wpe": P(), "lnf_g": P(), "lnf_b": P(), "layers": []}
    for _ in p["layers"]:
        specs["layers"].append({
            "ln1_g": P(), "ln1_b": P(), "ln2_g": P(), "ln2_b": P(),
            "wq": P(None, "model", None), "wk": P(None, "model", None), "wv": P(None, "model", None),
            "wo": P("model", None, None),
            "w1": P(None, "model"), "b1": P("model"), "w2": P("model", None), "b2": P(),
        })
    return specs


def time_call(fn, min_time, repeats):
    """Median over `repeats` of the mean wall time per call over >= min_time seconds, and the
    median process CPU time per call (every thread; wall time on a shared machine includes
    waiting for a core)."""
    fn()  # compile + warm up
    fn()
    samples, cpu = [], []
    for _ in range(repeats):
        n, t0, c0 = 0, time.perf_counter(), time.process_time()
        while True:
            fn()
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time:
                break
        samples.append(el / n)
        cpu.append((time.process_time() - c0) / n)
    return statistics.median(samples), samples, statistics.median(cpu)


def bench_gpt(args):
    cfg = CONFIGS[args.config]
    devices = jax.devices()
    want = 1 if args.mesh == "1" else 2
    if len(devices) < want:
        raise SystemExit(f"gpt_jax: mesh {args.mesh} needs {want} devices, JAX has {len(devices)} "
                         "(set XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    shape = {"1": (1, 1), "data2": (2, 1), "model2": (1, 2)}[args.mesh]
    mesh = Mesh(np.array(devices[:want]).reshape(shape), ("data", "model"))
    p = init_params(cfg, jax.random.PRNGKey(1234))
    rng = np.random.default_rng(1234)
    B, S, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    tokens = rng.integers(0, V, size=(B, S), dtype=np.int32)
    labels = rng.integers(0, V, size=(B, S), dtype=np.int32)
    pspec = param_specs(p, args.mesh)
    to_sh = lambda spec: NamedSharding(mesh, spec)
    p_sh = jax.tree_util.tree_map(to_sh, pspec, is_leaf=lambda x: isinstance(x, P))
    tok_sh = to_sh(P("data", None))
    p = jax.device_put(p, p_sh)
    tokens = jax.device_put(tokens, tok_sh)
    labels = jax.device_put(labels, tok_sh)
    f = jax.jit(loss_fn, in_shardings=(p_sh, tok_sh, tok_sh), out_shardings=to_sh(P()))
    med, samples, cpu = time_call(lambda: jax.block_until_ready(f(p, tokens, labels)), args.min_time, args.repeats)
    print(json.dumps({"bench": f"jax_gpt/{args.config}/{args.mesh}", "median_s": med, "samples_s": samples,
                      "proc_cpu_s": cpu,
                      "tokens_per_s": B * S / med, "loss": float(f(p, tokens, labels)),
                      "jax": jax.__version__, "devices": want}), flush=True)


def bench_overhead(args):
    """tessel's BM_RunOverhead program: x f32[8*N, 16] sharded over data, relu, sum."""
    n = args.devices
    devices = jax.devices()
    if len(devices) < n:
        raise SystemExit(f"gpt_jax: {n} devices wanted, JAX has {len(devices)}")
    mesh = Mesh(np.array(devices[:n]), ("data",))
    sh = NamedSharding(mesh, P("data", None))
    x = jax.device_put(np.random.default_rng(1).uniform(-1, 1, (8 * n, 16)).astype(np.float32), sh)
    f = jax.jit(lambda x: jnp.sum(jax.nn.relu(x)), in_shardings=sh, out_shardings=NamedSharding(mesh, P()))
    med, samples, cpu = time_call(lambda: jax.block_until_ready(f(x)), args.min_time, args.repeats)
    print(json.dumps({"bench": f"jax_overhead/devices:{n}", "median_s": med, "samples_s": samples, "proc_cpu_s": cpu,
                      "jax": jax.__version__, "devices": n}), flush=True)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("gpt")
    g.add_argument("--config", choices=sorted(CONFIGS), required=True)
    g.add_argument("--mesh", choices=["1", "data2", "model2"], required=True)
    g.add_argument("--min-time", type=float, default=2.0)
    g.add_argument("--repeats", type=int, default=3)
    o = sub.add_parser("overhead")
    o.add_argument("--devices", type=int, required=True)
    o.add_argument("--min-time", type=float, default=1.0)
    o.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    bench_gpt(args) if args.cmd == "gpt" else bench_overhead(args)


if __name__ == "__main__":
    main()
