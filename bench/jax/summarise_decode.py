"""Writes SUMMARY.md for a run of bench/jax/run_decode_side_by_side.sh from its raw outputs.

  summarise_decode.py bench/results/<stamp>-2core-cpu-decode-jax > SUMMARY.md

tessel / JAX in decode tokens/s (issue 38's target: >= 1.2), and tessel's tokens/s over the
core's memory-bandwidth bound (B x the measured read bandwidth / the bytes a step reads:
weights and cache; target at batch 1: >= 0.7). Every figure is from that one run, the median
over its rounds.
"""
import pathlib
import sys

import results
from results import fmt_ratio, machine_and_load

d = pathlib.Path(sys.argv[1])
out = [f"# tessel vs JAX, a decode step with a KV cache on one core — {d.name}\n"]
out.append("Recorded by `bench/jax/run_decode_side_by_side.sh` (docs/inference.md). One step: each sequence's "
           "token at its position -> the next logits, the cache donated and updated; tokens from the host, "
           "logits back to it. Ratios are tessel/JAX in tokens/s (bold: below 1.2x); the bound is the core's "
           "measured read bandwidth over the bytes a step must read (bold: below 0.7). tessel and JAX "
           "alternate in rounds; each figure is the median over the rounds.\n")
out += machine_and_load(d)
t = results.gbench(d, "decode")
j = results.jaxres(d, "decode")
out.append("| model | batch | tessel tokens/s | JAX tokens/s | tessel/JAX | read GB/s | bound tokens/s | tessel / bound |")
out.append("|---|---|---|---|---|---|---|---|")
names = {"0": ("example", "gpt example (S64 D128 H4 L2 V512)"),
         "1": ("gpt2", "GPT-2-small block (S256 D768 H12 L2 V8192)")}
for c, (cj, cname) in names.items():
    for b in ("1", "16"):
        tb, jb = t.get(f"BM_DecodeSide/config:{c}/batch:{b}"), j.get(f"jax_decode/{cj}/batch:{b}")
        if not tb or not jb or "error" in tb:
            out.append(f"| {cname} | {b} | {tb and tb.get('tokens/s', tb.get('error'))} | "
                       f"{jb and jb['tokens_per_s']} | n/a | | | |")
            continue
        tt, jt, bound = tb["tokens/s"], jb["tokens_per_s"], tb["bound_tokens_per_s"]
        out.append(f"| {cname} | {b} | {tt:,.1f} | {jt:,.1f} | {fmt_ratio(tt / jt, 1.2)} | {tb['read_GBps']:.2f} | "
                   f"{bound:,.1f} | {fmt_ratio(tt / bound, 0.7)} |")
out.append("")
print("\n".join(out))
