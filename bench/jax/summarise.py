"""Writes SUMMARY.md for a run of bench/jax/run_side_by_side.sh from its raw outputs.

  summarise.py bench/results/<stamp>-2core-cpu-jax > SUMMARY.md

Every ratio is tessel / JAX in speed (tokens/s, or JAX's time per call / tessel's), so
>= 1.0 means tessel is at least as fast; all figures come from the files of that one run
(medians of the repetitions).
"""
import pathlib
import sys

import results
from results import fmt_ratio, machine_and_load

d = pathlib.Path(sys.argv[1])


def gbench(name):
    return results.gbench(d, name)


def jaxres(name):
    return results.jaxres(d, name)


def us(b):
    scale = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}[b["time_unit"]]
    return b["real_time"] * scale


out = []
out.append(f"# tessel vs JAX on CPU — {d.name}\n")
out.append("Recorded by `bench/jax/run_side_by_side.sh` (docs/cpu-backend.md). Ratios are tessel/JAX in speed "
           "(>= 1.0: tessel at least as fast), all from this one run: tessel and JAX alternate in rounds and each "
           "figure is the median over the rounds (matmuls: over repetitions). "
           "Machine and load: machine.txt, load.txt.\n")
out += machine_and_load(d)

# (a) GPT forward
t1, t2 = gbench("gpt-1dev"), gbench("gpt-2dev")
j = {**jaxres("gpt-1dev"), **jaxres("gpt-2dev")}
out.append("## (a) GPT forward, tokens/s\n")
out.append("Wall-clock tokens/s decide the ratio; the last columns divide by process CPU seconds instead "
           "(tokens per CPU-second, every thread of the process), which waiting for a core on a loaded "
           "machine does not inflate.\n")
out.append("tessel runs the model with its fused attention op (docs/attention.md); the last two columns are the "
           "same model with the long-form attention (einsum, scale, mask, softmax, einsum) measured in the same "
           "run, and its ratio to JAX: the before and after of the op.\n")
out.append("| model | devices (cores) | tessel tokens/s | JAX tokens/s | tessel/JAX | tessel tokens/CPU-s | JAX tokens/CPU-s | tessel/JAX by CPU time | long-form tessel tokens/s | long-form tessel/JAX |")
out.append("|---|---|---|---|---|---|---|---|---|---|")
names = {"0": ("example", "gpt example (B8 S64 D128 H4 L2 V512)"), "1": ("gpt2", "GPT-2-small block (B4 S256 D768 H12 L2 V8192)")}
meshes = {"0": ("1", "1 (core 0)"), "1": ("data2", "data=2 (cores 0,1)"), "2": ("model2", "model=2 (cores 0,1)")}
for c, (cj, cname) in names.items():
    for m, (mj, mname) in meshes.items():
        tb = {**t1, **t2}.get(f"BM_GptLoaded/config:{c}/mesh:{m}/attn:1")
        lb = {**t1, **t2}.get(f"BM_GptLoaded/config:{c}/mesh:{m}/attn:0")
        jb = j.get(f"jax_gpt/{cj}/{mj}")
        if not tb or not jb or "error" in tb:
            out.append(f"| {cname} | {mname} | {tb and tb.get('tokens/s', tb.get('error'))} | {jb and jb['tokens_per_s']} | n/a | | | | | |")
            continue
        tt, jt = tb["tokens/s"], jb["tokens_per_s"]
        tokens = jt * jb["median_s"]
        tc, jc = tokens / tb["proc_cpu_s"], tokens / jb["proc_cpu_s"]
        lt = lb["tokens/s"] if lb and "error" not in lb else None
        long_cols = f"{lt:,.0f} | {fmt_ratio(lt / jt)}" if lt else "n/a | n/a"
        out.append(f"| {cname} | {mname} | {tt:,.0f} | {jt:,.0f} | {fmt_ratio(tt / jt)} | {tc:,.0f} | {jc:,.0f} | {fmt_ratio(tc / jc)} | {long_cols} |")
out.append("")

# (b) matmuls
mm = gbench("matmul")
out.append("## (b) matmul GFLOP/s, one thread on core 0\n")
out.append("GFLOP/s over the thread's CPU time (Google Benchmark's cpu_time: a single-threaded call, so "
           "this is the core's rate while it ran, not diluted by waiting for the shared core); the "
           "wall-clock rates are in tessel-matmul.txt.\n")


def cpu_flops(b):
    """FLOP/s over CPU time: the counter is over real time; scale by real/cpu."""
    return b["FLOP/s"] * b["real_time"] / b["cpu_time"]


peak = mm.get("BM_FmaPeak")
peak_g = cpu_flops(peak) / 1e9 if peak and "FLOP/s" in peak else None
out.append(f"Core peak, measured (AVX2 FMA loop, `BM_FmaPeak`: 12 chains of 8-float FMAs): "
           f"{peak_g:.1f} GFLOP/s.\n" if peak_g else "Core peak: not measured.\n")
out.append("| product | tessel einsum | dnnl_sgemm | OpenBLAS sgemm | tessel/dnnl | tessel/best library | tessel % of peak | best library % of peak |")
out.append("|---|---|---|---|---|---|---|---|")
shapes = sorted({k.split("/lib:")[0] for k in mm if k.startswith("BM_Matmul")}, key=lambda s: int(s.split(":")[1]))
for s in shapes:
    g = {}
    label = s
    for lib in range(3):
        b = mm.get(f"{s}/lib:{lib}")
        if b and "FLOP/s" in b:
            g[lib] = cpu_flops(b) / 1e9
            label = b.get("label", s).rsplit(" tessel einsum", 1)[0] if lib == 0 else label
    if 0 not in g:
        continue
    best = max([g[l] for l in (1, 2) if l in g], default=None)
    cell = lambda l: f"{g[l]:.1f}" if l in g else "skipped"
    out.append(f"| {label} | {cell(0)} | {cell(1)} | {cell(2)} | "
               f"{fmt_ratio(g[0] / g[1]) if 1 in g else 'n/a'} | {fmt_ratio(g[0] / best) if best else 'n/a'} | "
               f"{100 * g[0] / peak_g:.0f}% | {100 * best / peak_g:.0f}% |" if peak_g and best else
               f"| {label} | {cell(0)} | {cell(1)} | {cell(2)} | n/a | n/a | n/a | n/a |")
out.append("")

# (c) overhead
to, jo = gbench("overhead"), jaxres("overhead")
out.append("## (c) per-run cost of a tiny program (relu + sum over N devices), cores 0,1\n")
out.append("| devices | tessel LoadedExecutable::run (µs) | JAX jitted call (µs) | tessel/JAX |")
out.append("|---|---|---|---|")
for n in (1, 2, 8):
    tb, jb = to.get(f"BM_RunOverhead/devices:{n}/async:1"), jo.get(f"jax_overhead/devices:{n}")
    if not tb or not jb or "error" in tb:
        out.append(f"| {n} | n/a | n/a | n/a |")
        continue
    tu, ju = us(tb), jb["median_s"] * 1e6
    out.append(f"| {n} | {tu:.1f} | {ju:.1f} | {fmt_ratio(ju / tu)} |")
out.append("")

# (d) row ops
ro = gbench("rowops")
if ro:
    out.append("## (d) tessel's softmax / layer_norm / GELU kernels: hand-written vs oneDNN, one thread on core 0\n")
    out.append("| op | hand-written (µs) | oneDNN (µs) | oneDNN speed-up |")
    out.append("|---|---|---|---|")
    for op in range(3):
        for shape in range(2):
            h, o = ro.get(f"BM_RowOp/op:{op}/shape:{shape}/impl:0"), ro.get(f"BM_RowOp/op:{op}/shape:{shape}/impl:1")
            if not h or not o or "error" in h or "error" in o:
                continue
            label = h.get("label", "").replace(" hand-written", "")
            out.append(f"| {label} | {us(h):.1f} | {us(o):.1f} | {us(h) / us(o):.2f}x |")
    out.append("")
print("\n".join(out))
