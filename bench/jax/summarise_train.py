"""Writes SUMMARY.md for a run of bench/jax/run_train_side_by_side.sh from its raw outputs.

  summarise_train.py bench/results/<stamp>-2core-cpu-train-jax > SUMMARY.md

Every ratio is tessel / JAX in tokens/s of the training step (>= 1.2 is issue 26's target); all
figures come from the files of that one run (each the median over its rounds).
"""
import json
import pathlib
import sys

import results
from results import fmt_ratio, machine_and_load

d = pathlib.Path(sys.argv[1])
out = [f"# tessel vs JAX, the CPU training step — {d.name}\n"]
out.append("Recorded by `bench/jax/run_train_side_by_side.sh` (run from the repository root; docs/training.md). One step = forward, "
           "backward, global-norm clipping and AdamW, parameters and moments on the devices and donated. "
           "Ratios are tessel/JAX in tokens/s (bold: below 1.2x), all from this one run: tessel and JAX "
           "alternate in rounds and each figure is the median over the rounds. The machine is shared with "
           "other engineers' builds: the load average before each step is below.\n")
out += machine_and_load(d)

out.append("## The comparison's check: JAX's step on tessel's inputs\n")
out.append("`tessel-bench --dump-train-step` writes one step's inputs and outputs on one device; "
           "`gpt_jax.py train-check` runs JAX's step on those inputs. Moments: max |JAX - tessel| over max "
           "|tessel|, the worst parameter. Parameters: the difference in units of the step size lr, the largest "
           "(AdamW's m/sqrt(v) is about +-1 for any gradient not 0, so a near-0 gradient rounded differently "
           "moves by up to lr) and the share of elements off by more than 1% of lr.\n")
out.append("| config | loss tessel | loss JAX | grad norm tessel | grad norm JAX | next m | next v | next params, max (lr) | share > 0.01 lr |")
out.append("|---|---|---|---|---|---|---|---|---|")
for c, name in (("0", "example"), ("1", "gpt2")):
    p = d / f"check-{c}.json"
    if not p.exists() or not p.read_text().strip():
        out.append(f"| {name} | n/a | | | | | | |")
        continue
    r = json.loads(p.read_text())
    e = r["errors"]
    out.append(f"| {name} | {r['loss_tessel']:.6f} | {r['loss_jax']:.6f} | {r['grad_norm_tessel']:.6f} | "
               f"{r['grad_norm_jax']:.6f} | {e['m']:.1e} | {e['v']:.1e} | {e['params_in_lr']:.2f} | "
               f"{e['params_share_off_1pct_lr']:.1e} |")
out.append("")

t = {**results.gbench(d, "train-1dev"), **results.gbench(d, "train-2dev")}
j = {**results.jaxres(d, "train-1dev"), **results.jaxres(d, "train-2dev")}
out.append("## Training step, tokens/s\n")
out.append("The last columns divide by process CPU seconds instead (tokens per CPU-second, every thread "
           "of the process), which waiting for a core on a loaded machine does not inflate.\n")
out.append("tessel runs the model with its fused attention op and the flash backward (docs/attention.md); the "
           "last two columns are the same step with the long-form attention (einsum, scale, mask, softmax, einsum "
           "and their separate backwards) measured in the same run, and its ratio to JAX: the before and after of "
           "the op.\n")
out.append("| model | mesh (cores) | tessel tokens/s | JAX tokens/s | tessel/JAX | tessel tokens/CPU-s | JAX tokens/CPU-s | tessel/JAX by CPU time | long-form tessel tokens/s | long-form tessel/JAX |")
out.append("|---|---|---|---|---|---|---|---|---|---|")
names = {"0": ("example", "gpt example (B8 S64 D128 H4 L2 V512)"),
         "1": ("gpt2", "GPT-2-small block (B4 S256 D768 H12 L2 V8192)")}
meshes = {"0": ("1", "1 device (core 0)"), "1": ("data2", "data=2 (cores 0,1)"),
          "2": ("model2", "model=2 (cores 0,1)"), "3": ("data2-zero2", "data=2, ZeRO-2 (cores 0,1)")}
for c, (cj, cname) in names.items():
    for m, (mj, mname) in meshes.items():
        tb, jb = t.get(f"BM_TrainSide/config:{c}/mesh:{m}/attn:1"), j.get(f"jax_train/{cj}/{mj}")
        lb = t.get(f"BM_TrainSide/config:{c}/mesh:{m}/attn:0")
        if not tb or not jb or "error" in tb:
            out.append(f"| {cname} | {mname} | {tb and tb.get('tokens/s', tb.get('error'))} | "
                       f"{jb and jb['tokens_per_s']} | n/a | | | | | |")
            continue
        tt, jt = tb["tokens/s"], jb["tokens_per_s"]
        tokens = jt * jb["median_s"]
        tc, jc = tokens / tb["proc_cpu_s"], tokens / jb["proc_cpu_s"]
        lt = lb["tokens/s"] if lb and "error" not in lb else None
        long_cols = f"{lt:,.0f} | {fmt_ratio(lt / jt, 1.2)}" if lt else "n/a | n/a"
        out.append(f"| {cname} | {mname} | {tt:,.0f} | {jt:,.0f} | {fmt_ratio(tt / jt, 1.2)} | {tc:,.0f} | "
                   f"{jc:,.0f} | {fmt_ratio(tc / jc, 1.2)} | {long_cols} |")
out.append("")


# Optional: before/after of tessel's changes in the same session (before-after-<state>-<1dev|2dev>-r<i>.json
# from before-after.sh in the folder: tessel-bench built at several commits, run alternately).
states = sorted({p.name.split("-")[2] for p in d.glob("before-after-*-r*.json")})
if states:
    ba = {st: {**results.gbench(d, f"{st}-1dev", prefix="before-after"),
               **results.gbench(d, f"{st}-2dev", prefix="before-after")} for st in states}
    out.append("## tessel before and after its changes, in one run\n")
    out.append("`before-after.sh` (in this folder) ran tessel-bench built at each state alternately, three rounds, "
               "pinned as above; each figure is the median over the rounds, tokens/s (tokens per CPU-second in "
               "brackets). Load: before-after-load.txt.\n")
    out.append("| model | mesh | " + " | ".join(f"state {st}" for st in states) + " | last/first |")
    out.append("|---|---|" + "---|" * (len(states) + 1))
    for c, (cj, cname) in names.items():
        for m, (mj, mname) in meshes.items():
            key = f"BM_TrainSide/config:{c}/mesh:{m}"
            row = [ba[st].get(key) for st in states]
            if not all(row) or any("error" in b for b in row):
                continue
            tokens = [b["tokens/s"] * b["real_time"] / {"ms": 1e3, "s": 1.0}[b["time_unit"]] for b in row]
            cells = [f"{b['tokens/s']:,.0f} ({n / b['proc_cpu_s']:,.0f})" for b, n in zip(row, tokens)]
            out.append(f"| {cname} | {mname} | " + " | ".join(cells) +
                       f" | {row[-1]['tokens/s'] / row[0]['tokens/s']:.2f}x ({row[0]['proc_cpu_s'] / row[-1]['proc_cpu_s']:.2f}x) |")
    out.append("")
print("\n".join(out))
