"""The JAX side of bench/jax/run_side_by_side.sh, run_train_side_by_side.sh and
run_decode_side_by_side.sh: the same GPT forward as tessel's src/models/gpt.cpp, its training
step (train_step.hpp), a decode step with a KV cache (infer/generate.hpp), and the dispatch
cost of a tiny jitted function, timed on CPU.

  gpt_jax.py gpt --config example|gpt2 --mesh 1|data2|model2 [--min-time 2] [--repeats 3]
  gpt_jax.py train --config example|gpt2 --mesh 1|data2|model2|data2-zero2 [--min-time 2] [--repeats 3]
  gpt_jax.py train-check DIR     # the step on tessel's inputs (tessel-bench --dump-train-step DIR)
  gpt_jax.py overhead --devices N [--min-time 1] [--repeats 3]
  gpt_jax.py decode --config example|gpt2 --batch B [--min-time 2] [--repeats 3]   # a KV-cache decode step

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
import functools
import json
import math
import pathlib
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


# ---- the training step: tessel's add_train_step (src/train/train_step.cpp) and adamw kernel --------
# grad_norm = sqrt(sum of every gradient squared); clip = clip_norm / (grad_norm + 1e-6) when
# grad_norm > clip_norm, else 1; per parameter p (weight decay on parameters of rank >= 2 only):
#   g' = g * clip;  m' = b1 m + (1 - b1) g';  v' = b2 v + (1 - b2) g'^2
#   p' = p - lr * ((m' * bc1) / (sqrt(v' * bc2) + eps) + wd * p)
# with lr, bc1 = 1/(1 - b1^t), bc2 = 1/(1 - b2^t) inputs (AdamWConfig's defaults below).
ADAMW = dict(beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, clip_norm=1.0)


def train_step(p, m, v, tokens, labels, lr, bc1, bc2, grad_shardings=None):
    a = ADAMW
    loss, g = jax.value_and_grad(loss_fn)(p, tokens, labels)
    if grad_shardings is not None:  # ZeRO-2: the gradients reduce-scattered like the moments
        g = jax.lax.with_sharding_constraint(g, grad_shardings)
    leaves = jax.tree_util.tree_leaves(g)
    norm = jnp.sqrt(sum(jnp.sum(x * x) for x in leaves))
    clip = jnp.where(norm > a["clip_norm"], a["clip_norm"] / (norm + 1e-6), 1.0)

    def update(p, g, m, v):
        gs = g * clip
        m2 = a["beta1"] * m + (1 - a["beta1"]) * gs
        v2 = a["beta2"] * v + (1 - a["beta2"]) * (gs * gs)
        wd = a["weight_decay"] if p.ndim >= 2 else 0.0
        return p - lr * ((m2 * bc1) / (jnp.sqrt(v2 * bc2) + a["eps"]) + wd * p), m2, v2

    out = jax.tree_util.tree_map(update, p, g, m, v)
    treedef = jax.tree_util.tree_structure(p)
    p2, m2, v2 = (jax.tree_util.tree_unflatten(treedef, [o[i] for o in treedef.flatten_up_to(out)]) for i in range(3))
    return loss, norm, p2, m2, v2


def zero_spec(spec, shape, data=2):
    """tessel's zero_layout on a mesh whose parameters use at most `model`: `data` added to the
    first dim without axes that it divides."""
    parts = list(spec) + [None] * (len(shape) - len(spec))
    for d, n in enumerate(shape):
        if parts[d] is None and n % data == 0:
            parts[d] = "data"
            return P(*parts)
    return spec


def step_inputs(cfg, mesh_kind, mesh, p):
    """Shardings of the step's arguments and the jitted, donating step."""
    to_sh = lambda spec: NamedSharding(mesh, spec)
    is_p = lambda x: isinstance(x, P)
    pspec = param_specs(p, "model2" if mesh_kind == "model2" else "1")
    p_sh = jax.tree_util.tree_map(to_sh, pspec, is_leaf=is_p)
    if mesh_kind == "data2-zero2":
        st_sh = jax.tree_util.tree_map(lambda s, x: to_sh(zero_spec(s, x.shape)), pspec, p, is_leaf=is_p)
    else:
        st_sh = p_sh
    tok_sh, rep = to_sh(P("data", None)), to_sh(P())
    step = functools.partial(train_step, grad_shardings=st_sh if mesh_kind == "data2-zero2" else None)
    f = jax.jit(step, in_shardings=(p_sh, st_sh, st_sh, tok_sh, tok_sh, rep, rep, rep),
                out_shardings=(rep, rep, p_sh, st_sh, st_sh), donate_argnums=(0, 1, 2))
    return f, p_sh, st_sh, tok_sh, rep


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


def make_mesh(mesh_kind):
    devices = jax.devices()
    want = 1 if mesh_kind == "1" else 2
    if len(devices) < want:
        raise SystemExit(f"gpt_jax: mesh {mesh_kind} needs {want} devices, JAX has {len(devices)} "
                         "(set XLA_FLAGS=--xla_force_host_platform_device_count=2)")
    shape = {"1": (1, 1), "data2": (2, 1), "model2": (1, 2), "data2-zero2": (2, 1)}[mesh_kind]
    return Mesh(np.array(devices[:want]).reshape(shape), ("data", "model")), want


def model_and_batch(args):
    """The config, the mesh, the parameters (seeded) and a random batch (host arrays)."""
    cfg = CONFIGS[args.config]
    mesh, want = make_mesh(args.mesh)
    p = init_params(cfg, jax.random.PRNGKey(1234))
    rng = np.random.default_rng(1234)
    B, S, V = cfg["batch"], cfg["seq"], cfg["vocab"]
    tokens = rng.integers(0, V, size=(B, S), dtype=np.int32)
    labels = rng.integers(0, V, size=(B, S), dtype=np.int32)
    return cfg, mesh, want, p, tokens, labels


def bench_gpt(args):
    cfg, mesh, want, p, tokens, labels = model_and_batch(args)
    B, S = cfg["batch"], cfg["seq"]
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


def bench_train(args):
    """One training step per call, the parameters and moments donated and fed back (tessel's
    BM_TrainSide: LoadOptions::donate)."""
    cfg, mesh, want, p, tokens, labels = model_and_batch(args)
    B, S = cfg["batch"], cfg["seq"]
    f, p_sh, st_sh, tok_sh, rep = step_inputs(cfg, args.mesh, mesh, p)
    zeros = lambda: jax.tree_util.tree_map(np.zeros_like, p)  # m and v: two buffers (both donated)
    state = [jax.device_put(p, p_sh), jax.device_put(zeros(), st_sh), jax.device_put(zeros(), st_sh)]
    batch = [jax.device_put(tokens, tok_sh), jax.device_put(labels, tok_sh)]
    # step 1's inputs (the bias corrections of t = 1), as tessel's benchmark feeds every step
    scal = [jax.device_put(np.float32(x), rep) for x in (1e-3, 1 / (1 - ADAMW["beta1"]), 1 / (1 - ADAMW["beta2"]))]
    last = {}

    def one():
        loss, norm, *state[:] = f(*state, *batch, *scal)
        jax.block_until_ready(state)
        last["loss"] = loss

    med, samples, cpu = time_call(one, args.min_time, args.repeats)
    print(json.dumps({"bench": f"jax_train/{args.config}/{args.mesh}", "median_s": med, "samples_s": samples,
                      "proc_cpu_s": cpu, "tokens_per_s": B * S / med, "loss": float(last["loss"]),
                      "jax": jax.__version__, "devices": want}), flush=True)


def train_check(args):
    """The step on the inputs tessel-bench --dump-train-step wrote (.npy per input, by tessel's
    names), compared with tessel's outputs of that step: loss, grad_norm, every next.*."""
    d = pathlib.Path(args.dir)
    meta = json.loads((d / "config.json").read_text())
    cfg = {k: meta[k] for k in ("batch", "seq", "d_model", "heads", "layers", "vocab")}
    ld = lambda name: np.load(d / f"{name}.npy")
    names = ["wte", "wpe", "lnf_g", "lnf_b"]
    lnames = ["ln1_g", "ln1_b", "wq", "wk", "wv", "wo", "ln2_g", "ln2_b", "w1", "b1", "w2", "b2"]

    def tree(prefix):
        t = {n: ld(prefix + n) for n in names}
        t["layers"] = [{n: ld(f"{prefix}l{i}_{n}") for n in lnames} for i in range(cfg["layers"])]
        return t

    f = jax.jit(train_step)
    loss, norm, p2, m2, v2 = f(tree("in.") , tree("in.adam.m."), tree("in.adam.v."), ld("in.tokens"), ld("in.labels"),
                               ld("in.adam.lr"), ld("in.adam.bc1"), ld("in.adam.bc2"))
    # Moments: max |JAX - tessel| over max |tessel|, the worst parameter. Parameters: the step's
    # difference in units of the step size lr (AdamW's m/sqrt(v) is about +-1 wherever a gradient
    # is not 0, so a gradient near 0 whose rounding differs moves by up to lr), the largest and
    # the share of elements off by more than 1% of lr.
    lr = float(ld("in.adam.lr"))
    worst, off, total = {}, 0, 0
    for what, got, prefix in (("m", m2, "out.next.adam.m."), ("v", v2, "out.next.adam.v.")):
        errs = jax.tree_util.tree_map(lambda a, b: float(np.max(np.abs(np.asarray(a) - b)) / (np.max(np.abs(b)) + 1e-30)),
                                      got, tree(prefix))
        worst[what] = max(jax.tree_util.tree_leaves(errs))
    for a, b in zip(jax.tree_util.tree_leaves(p2), jax.tree_util.tree_leaves(tree("out.next."))):
        diff = np.abs(np.asarray(a) - b) / lr
        worst["params_in_lr"] = max(worst.get("params_in_lr", 0.0), float(diff.max()))
        off, total = off + int(np.sum(diff > 0.01)), total + diff.size
    worst["params_share_off_1pct_lr"] = off / total
    res = {"config": cfg, "loss_jax": float(loss), "loss_tessel": float(ld("out.loss")),
           "grad_norm_jax": float(norm), "grad_norm_tessel": float(ld("out.grad_norm")), "errors": worst}
    print(json.dumps(res), flush=True)
    ok = (abs(res["loss_jax"] - res["loss_tessel"]) <= 1e-4 * abs(res["loss_tessel"]) and
          abs(res["grad_norm_jax"] - res["grad_norm_tessel"]) <= 1e-3 * abs(res["grad_norm_tessel"]) and
          worst["m"] <= 1e-3 and worst["v"] <= 1e-3 and worst["params_in_lr"] <= 2 and
          worst["params_share_off_1pct_lr"] <= 1e-3)
    if not ok:
        raise SystemExit("train-check: JAX and tessel disagree")


def decode_step(p, caches, token, pos):
    """One decode step with a KV cache (tessel's build_gpt_infer decode program): each sequence's
    newest token at its position -> the next token's logits; each layer's cache [B, T, H, K] gets
    the sequence's key and value at `pos` (a scatter), the attention masks positions after it."""
    B = token.shape[0]
    T = p["wpe"].shape[0]
    x = p["wte"][token] + p["wpe"][pos]
    rows = jnp.arange(B)
    seen = jnp.arange(T)[None, :] <= pos[:, None]  # [B, T]
    new = []
    for l, (kc, vc) in zip(p["layers"], caches):
        K = l["wq"].shape[2]
        h = layer_norm(x, l["ln1_g"], l["ln1_b"])
        q = jnp.einsum("bd,dhk->bhk", h, l["wq"])
        kc = kc.at[rows, pos].set(jnp.einsum("bd,dhk->bhk", h, l["wk"]))
        vc = vc.at[rows, pos].set(jnp.einsum("bd,dhk->bhk", h, l["wv"]))
        s = jnp.einsum("bhk,bthk->bht", q, kc) * (1.0 / math.sqrt(K))
        s = jnp.where(seen[:, None, :], s, -jnp.inf)
        o = jnp.einsum("bht,bthk->bhk", jax.nn.softmax(s, axis=-1), vc)
        x = x + jnp.einsum("bhk,hkd->bd", o, l["wo"])
        h2 = layer_norm(x, l["ln2_g"], l["ln2_b"])
        u = gelu(jnp.einsum("bd,df->bf", h2, l["w1"]) + l["b1"])
        x = x + jnp.einsum("bf,fd->bd", u, l["w2"]) + l["b2"]
        new.append((kc, vc))
    xf = layer_norm(x, p["lnf_g"], p["lnf_b"])
    return jnp.einsum("bd,vd->bv", xf, p["wte"]), new


def bench_decode(args):
    """Decode steps at batch B on one device: the cache donated and fed back, each step's tokens
    and positions from the host and its logits waited for (as tessel's BM_DecodeSide)."""
    cfg = CONFIGS[args.config]
    B, T, D, H = args.batch, cfg["seq"], cfg["d_model"], cfg["heads"]
    p = jax.device_put(init_params(cfg, jax.random.PRNGKey(1234)))
    caches = [(jnp.zeros((B, T, H, D // H), jnp.float32), jnp.zeros((B, T, H, D // H), jnp.float32))
              for _ in range(cfg["layers"])]
    f = jax.jit(decode_step, donate_argnums=(1,))
    rng = np.random.default_rng(1234)
    token = rng.integers(0, cfg["vocab"], size=(B,), dtype=np.int32)
    pos = np.full((B,), T // 2, dtype=np.int32)  # tessel attends over all T positions, masked
    state = {"c": caches}

    def step():
        logits, state["c"] = f(p, state["c"], token, pos)
        jax.block_until_ready(logits)

    med, samples, cpu = time_call(step, args.min_time, args.repeats)
    print(json.dumps({"bench": f"jax_decode/{args.config}/batch:{B}", "median_s": med, "samples_s": samples,
                      "proc_cpu_s": cpu, "tokens_per_s": B / med, "jax": jax.__version__, "devices": 1}), flush=True)


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
    t = sub.add_parser("train")
    t.add_argument("--config", choices=sorted(CONFIGS), required=True)
    t.add_argument("--mesh", choices=["1", "data2", "model2", "data2-zero2"], required=True)
    t.add_argument("--min-time", type=float, default=2.0)
    t.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("train-check")
    c.add_argument("dir")
    d = sub.add_parser("decode")
    d.add_argument("--config", choices=sorted(CONFIGS), required=True)
    d.add_argument("--batch", type=int, required=True)
    d.add_argument("--min-time", type=float, default=2.0)
    d.add_argument("--repeats", type=int, default=3)
    o = sub.add_parser("overhead")
    o.add_argument("--devices", type=int, required=True)
    o.add_argument("--min-time", type=float, default=1.0)
    o.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    {"gpt": bench_gpt, "train": bench_train, "train-check": train_check, "overhead": bench_overhead,
     "decode": bench_decode}[args.cmd](args)


if __name__ == "__main__":
    main()
