#!/usr/bin/env python3
"""Automatic layouts against the hand layouts on CPU devices, measured side by side (issue 40 item 4).

For each mesh, `rounds` rounds, each running in turn (so both see the same load):
  build/bin/gpt_train --mesh M --steps S --no-reference --out ''           (hand: Megatron, --zero 0)
  build/bin/gpt_train --mesh M --auto --steps S --no-reference --out ''    (auto; prints its prediction)
  build/bin/gpt --mesh M --layouts megatron --iters I
  build/bin/gpt --mesh M --layouts auto --iters I                          (prints its prediction)
Every command's whole output goes to OUT/raw/<tool>-<mesh>-<layouts>-r<k>.txt; OUT/runs.csv has one
row per run: tool, mesh, layouts, round, measured_ms (gpt_train's "step time" mean, gpt's best
forward: auto against hand), measured_beside_prediction_ms (what the tool sets beside its prediction:
gpt_train's median step, gpt's median forward), predicted_ms and the layouts that ran (auto's "is not predicted at least" line
says the hand ones did: the plan was not predicted 10% faster), each with the raw file. OUT/summary.csv has per tool and mesh the medians
of auto and hand over the rounds, auto/hand, and the median measured/predicted of the auto runs.

--launcher "mpirun -np 2": every command run under that launcher (each process a block of the devices).

usage: bench/autoshard/auto_vs_hand.py OUT [--rounds 5] [--steps 100] [--iters 50] [--meshes data=2,model=2 data=4 model=4]
                                           [--launcher CMD]
"""
import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run(cmd, path):
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    with open(path, "w") as f:
        f.write("$ " + " ".join(cmd if all(c for c in cmd) else [c if c else "''" for c in cmd]) + "\n")
        f.write(p.stdout)
        f.write(p.stderr)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}); see {path}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--meshes", nargs="+", default=["data=2,model=2", "data=4", "model=4"])
    ap.add_argument("--launcher", default="")
    a = ap.parse_args()
    raw = os.path.join(a.out, "raw")
    os.makedirs(raw, exist_ok=True)
    rows = []
    for mesh in a.meshes:
        for k in range(1, a.rounds + 1):
            for tool, layouts in (("gpt_train", "hand"), ("gpt_train", "auto"), ("gpt", "megatron"), ("gpt", "auto")):
                if tool == "gpt_train":
                    cmd = ["build/bin/gpt_train", "--mesh", mesh] + (["--auto"] if layouts == "auto" else []) + [
                        "--steps", str(a.steps), "--no-reference", "--out", ""]
                else:
                    cmd = ["build/bin/gpt", "--mesh", mesh, "--layouts", layouts, "--iters", str(a.iters)]
                cmd = a.launcher.split() + cmd
                name = f"{tool}-{mesh.replace(',', '_')}-{layouts}-r{k}.txt"
                text = run(cmd, os.path.join(raw, name))
                if tool == "gpt_train":
                    measured = float(re.search(r"^step time: ([0-9.]+) ms", text, re.M).group(1))
                else:
                    measured = float(re.search(r"^forward: ([0-9.]+) ms", text, re.M).group(1))
                m = re.search(r"against the prediction: ([0-9.]+) ms measured.*?([0-9.]+) ms predicted", text)
                # What the tool set beside its prediction (gpt: the median forward; gpt_train: the
                # step time above), and the prediction.
                measured_vs = float(m.group(1)) if m else ""
                predicted = float(m.group(2)) if m else ""
                ran = layouts
                if layouts == "auto" and re.search(r"is not predicted at least", text):
                    ran = "hand (auto not predicted 10% faster)"
                rows.append(dict(tool=tool, mesh=mesh, layouts=layouts, round=k, measured_ms=measured,
                                 measured_beside_prediction_ms=measured_vs, predicted_ms=predicted, ran=ran, raw="raw/" + name))
    with open(os.path.join(a.out, "runs.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    with open(os.path.join(a.out, "summary.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["tool", "mesh", "auto_median_ms", "hand_median_ms", "auto_over_hand", "auto_measured_over_predicted",
                    "auto_ran_hand_rounds"])
        for tool in ("gpt_train", "gpt"):
            for mesh in a.meshes:
                auto = [r for r in rows if r["tool"] == tool and r["mesh"] == mesh and r["layouts"] == "auto"]
                hand = [r for r in rows if r["tool"] == tool and r["mesh"] == mesh and r["layouts"] != "auto"]
                am = statistics.median(r["measured_ms"] for r in auto)
                hm = statistics.median(r["measured_ms"] for r in hand)
                ratio = statistics.median(r["measured_beside_prediction_ms"] / r["predicted_ms"] for r in auto)
                w.writerow([tool, mesh, f"{am:.3f}", f"{hm:.3f}", f"{am / hm:.3f}", f"{ratio:.3f}",
                            sum(1 for r in auto if r["ran"] != "auto")])
    print(open(os.path.join(a.out, "summary.csv")).read(), end="")


if __name__ == "__main__":
    main()
