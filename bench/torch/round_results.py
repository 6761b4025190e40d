#!/usr/bin/env python3
"""round_results: the figures of one `scripts/gpu-round` run, read from its raw logs, as
results.json; every figure with the log file (its path inside logs.tgz) and line it came from.

    python3 bench/torch/round_results.py assemble WORK     # WORK holds logs/: prints the JSON
    python3 bench/torch/round_results.py ceiling BENCH_TXT # the GEMM ceiling in TFLOP/s, or nothing

Only the standard library: it runs wherever the logs are (the GPU machine after every
section, or here on a fetched logs.tgz). The shape of "round" (docs/gpu-round.md):

  {"commit", "suite": {passed, failed, skipped}, "gpt2_forward_ms": {tessel, torch_eager,
   torch_compile}, "gpt2_train_tokens_per_s": {tessel, torch_eager, torch_compile},
   "attention_tflops": {forward, backward}, "nccl_two_process": {gpt, gpt_train, kill}}

each object with a sibling "sources" map (the same keys: "logs/FILE:LINE"), "commit" in the
round's own "sources"; null where a section did not run or its line is missing. Medians:
tessel's forward and attention are the `_median` aggregates of tessel-bench-gpu
--benchmark_repetitions=3; tessel's training figure is the median of gpt_train's per-step
tokens/s over steps 2..N; torch's are the median lines of bench/torch/gpt2_forward.py
(--median, --train). "details" beside "round" keeps what else was read (MFU, the sections'
status, the statistics' wording).
"""
import json
import os
import re
import statistics
import sys

SI = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "m": 1e-3, "u": 1e-6, "n": 1e-9}
TIME_MS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}
BENCH_LINE = re.compile(r"^(BM_\S+?)\s+([0-9.eE+-]+) (ns|us|ms|s)\s+([0-9.eE+-]+) (ns|us|ms|s)\s+(\d+)\s*(.*)$")
COUNTER = re.compile(r"([A-Za-z_][\w/.]*)=([0-9.eE+-]+)([kMGTPmun]?)(?:/s)?(?=\s|$)")
STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+)\s+loss\s+(\S+).*?\s([0-9.]+) ms\s+([0-9.]+) tokens/s")
TEST_LINE = re.compile(r"^(PASS|FAIL|SKIP)  (test\d+)\b")
# The causal attention [8,12,1024,64] FLOP count, when BM_Attention gives no FLOP/s counter:
# forward 4*B*H*S^2*D/2 (QK^T and PV, half of them under the mask), backward 2.5x the forward
# (FlashAttention's convention: 5 matrix products against the forward's 2).
ATT_B, ATT_H, ATT_S, ATT_D = 8, 12, 1024, 64
ATT_FWD_FLOPS = 4 * ATT_B * ATT_H * ATT_S * ATT_S * ATT_D // 2
ATT_BWD_FLOPS = ATT_FWD_FLOPS * 5 // 2


def read_lines(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None


def src(rel, line):
    return f"{rel}:{line}" if isinstance(line, int) else f"{rel}:{','.join(str(x) for x in line)}"


def bench_rows(lines):
    """[(line number, name, real time in ms, counters, label)] of Google Benchmark's console output."""
    rows = []
    for i, l in enumerate(lines or [], 1):
        m = BENCH_LINE.match(l.strip())
        if not m:
            continue
        counters = {k: float(v) * SI[p] for k, v, p in COUNTER.findall(m.group(7))}
        label = COUNTER.sub("", m.group(7)).strip()
        rows.append((i, m.group(1), float(m.group(2)) * TIME_MS[m.group(3)], counters, label))
    return rows


def pick(rows, prefix, want_median=True):
    """The `_median` aggregate row of the first benchmark named prefix..., else its only row."""
    med = [r for r in rows if r[1].startswith(prefix) and r[1].endswith("_median")]
    if med:
        return med[0], "median of the repetitions (Google Benchmark _median aggregate)"
    plain = [r for r in rows if r[1].startswith(prefix) and not re.search(r"_(mean|median|stddev|cv)$", r[1])]
    if plain:
        return plain[0], "one run (no _median aggregate in the log)" if want_median else "one run"
    return None, None


def ceiling_tflops(lines):
    """BM_GemmCeiling's FLOP/s in TFLOP/s, else BM_Gpt2Forward's gemm_ceiling_FLOP/s counter (the same
    measurement, made once per process), with its line."""
    rows = bench_rows(lines)
    row, _ = pick(rows, "BM_GemmCeiling")
    if row and "FLOP/s" in row[3]:
        return row[3]["FLOP/s"] / 1e12, row[0]
    row, _ = pick(rows, "BM_Gpt2Forward")
    if row and "gemm_ceiling_FLOP/s" in row[3]:
        return row[3]["gemm_ceiling_FLOP/s"] / 1e12, row[0]
    return None, None


def json_lines(lines):
    """[(line number, object)] of the lines that are JSON objects."""
    out = []
    for i, l in enumerate(lines or [], 1):
        s = l.strip()
        if s.startswith("{") and s.endswith("}"):
            try:
                out.append((i, json.loads(s)))
            except ValueError:
                pass
    return out


def torch_modes(lines, what):
    """{mode: (line, object)} of gpt2_forward.py's JSON lines for `what` (forward or train)."""
    return {o["mode"]: (i, o) for i, o in json_lines(lines) if o.get("what") == what and "mode" in o}


def median_line(values):
    """The median of [(value, line)] and the line(s) it came from (two for an even count)."""
    vs = sorted(values)
    n = len(vs)
    if n % 2:
        v, l = vs[n // 2]
        return v, l
    (a, la), (b, lb) = vs[n // 2 - 1], vs[n // 2]
    return (a + b) / 2, sorted({la, lb})


def assemble(work):
    logs = os.path.join(work, "logs")
    rel = lambda name: f"logs/{name}"
    get = lambda name: read_lines(os.path.join(logs, name))
    details = {"sections": {}, "notes": []}

    def shaped(*keys):  # one figure object: every key present, null until read, with its sources
        return dict({k: None for k in keys}, sources={k: None for k in keys})

    rnd = {"commit": None, "suite": shaped("passed", "failed", "skipped"),
           "gpt2_forward_ms": shaped("tessel", "torch_eager", "torch_compile"),
           "gpt2_train_tokens_per_s": shaped("tessel", "torch_eager", "torch_compile"),
           "attention_tflops": shaped("forward", "backward"),
           "nccl_two_process": shaped("gpt", "gpt_train", "kill"), "sources": {"commit": None}}

    for i, l in enumerate(get("sections.txt") or [], 1):
        parts = l.split(None, 2)
        if len(parts) >= 2:
            details["sections"][parts[0]] = {"status": parts[1].rstrip(":"), "text": l, "source": src(rel("sections.txt"), i)}

    # Commit: the build's BUILD_INFO (what was built), else the checkout's (gpu-check preflight).
    for name, key in (("A-BUILD_INFO.txt", "commit:"), ("A-preflight/machine.txt", "commit:")):
        for i, l in enumerate(get(name) or [], 1):
            if l.startswith(key):
                rnd["commit"] = l[len(key):].strip()
                rnd["sources"]["commit"] = src(rel(name), i)
                break
        if rnd["commit"]:
            break
    for i, l in enumerate(get("A-BUILD_INFO.txt") or [], 1):
        if l.startswith("describe:"):
            details["describe"] = {"value": l.split(":", 1)[1].strip(), "source": src(rel("A-BUILD_INFO.txt"), i)}

    # B: the GPU suite, one test case per process (gpu-check phase 1's summary).
    name = "B-gpu-check-1/summary.txt"
    lines = get(name)
    if lines is not None:
        counts = {"PASS": [], "FAIL": [], "SKIP": []}
        other = []
        for i, l in enumerate(lines, 1):
            m = TEST_LINE.match(l)
            if m:
                counts[m.group(1)].append(i)
            elif re.match(r"^(PASS|FAIL|SKIP)  ", l):
                other.append(src(rel(name), i) + " " + l.strip())
        if any(counts.values()):  # counts of 0 cite the file without a line
            for key, word in (("passed", "PASS"), ("failed", "FAIL"), ("skipped", "SKIP")):
                rnd["suite"][key] = len(counts[word])
                rnd["suite"]["sources"][key] = src(rel(name), counts[word]) if counts[word] else rel(name)
        details["suite_other_checks"] = other

    # C: speed.
    bench = get("C-bench.txt")
    rows = bench_rows(bench)
    fwd = rnd["gpt2_forward_ms"]
    ceiling, ceiling_line = ceiling_tflops(bench)
    if ceiling:
        details["gemm_ceiling_tflops"] = {"value": ceiling, "source": src(rel("C-bench.txt"), ceiling_line)}
    row, how = pick(rows, "BM_Gpt2Forward/1")
    if row:
        fwd["tessel"] = row[2]
        fwd["sources"]["tessel"] = src(rel("C-bench.txt"), row[0])
        details["tessel_forward"] = {"statistic": how, "counters": row[3]}
    tf = torch_modes(get("C-torch-forward.log"), "forward")
    for mode in ("eager", "compile"):
        if mode in tf:
            i, o = tf[mode]
            fwd[f"torch_{mode}"] = o["median_s"] * 1e3
            fwd["sources"][f"torch_{mode}"] = src(rel("C-torch-forward.log"), i)
            details[f"torch_forward_{mode}"] = {k: o.get(k) for k in ("statistic", "tokens_per_s", "mfu_vs_peak",
                                                                     "mfu_vs_ceiling", "mfu_formula", "loss")}

    att = rnd["attention_tflops"]
    att_rows = [r for r in rows if r[1].startswith("BM_Attention")]
    for direction, pattern, flops in (("forward", r"forward|fwd", ATT_FWD_FLOPS),
                                      ("backward", r"backward|bwd|grad", ATT_BWD_FLOPS)):
        # by the benchmark's name, else by its label (e.g. BM_Attention/0 labelled "forward ...")
        cands = [r for r in att_rows if re.search(pattern, r[1], re.IGNORECASE)]
        cands = cands or [r for r in att_rows if re.search(pattern, r[4], re.IGNORECASE)]
        row, how = pick(cands, "BM_Attention")
        if not row:
            continue
        # A FLOP/s counter: "FLOP/s" in FLOP/s, or "TFLOP/s", "GFLOP/s", ... in those units.
        scale = {"FLOP/s": 1e-12, "TFLOP/s": 1.0, "GFLOP/s": 1e-3, "MFLOP/s": 1e-6, "PFLOP/s": 1e3}
        counter = next((k for k in scale if k in row[3]), None)
        if counter:
            value = row[3][counter] * scale[counter]
            basis = f"counter {counter}"
        else:
            value = flops / (row[2] * 1e-3) / 1e12
            basis = (f"{flops} FLOP (causal [8,12,1024,64], {'4BHS^2D/2' if direction == 'forward' else '2.5x forward'})"
                     f" / real time")
        att[direction] = value
        att["sources"][direction] = src(rel("C-bench.txt"), row[0])
        details[f"attention_{direction}"] = {"benchmark": row[1], "statistic": how, "basis": basis,
                                             "ms": row[2]}
    if att_rows and att["forward"] is None and att["backward"] is None:
        details["notes"].append("BM_Attention rows found but none named forward/fwd or backward/bwd/grad: "
                                + ", ".join(r[1] for r in att_rows))

    train = rnd["gpt2_train_tokens_per_s"]
    steps, shape = [], None
    for i, l in enumerate(get("C-gpt_train.log") or [], 1):
        h = re.match(r"^gpt_train: batch=(\d+).* seq=(\d+) d_model=(\d+) heads=\d+ layers=(\d+) vocab=\d+ params=(\d+)", l)
        if h:
            shape = {"batch": int(h.group(1)), "seq": int(h.group(2)), "d_model": int(h.group(3)),
                     "layers": int(h.group(4)), "params": int(h.group(5)), "source": src(rel("C-gpt_train.log"), i)}
        m = STEP_LINE.match(l.strip())
        if m and int(m.group(1)) >= 2:  # step 1 builds the cuBLASLt plans and the JIT kernels
            steps.append((float(m.group(5)), i))
    if steps:
        v, line = median_line(steps)
        train["tessel"] = v
        train["sources"]["tessel"] = src(rel("C-gpt_train.log"), line)
        details["tessel_train"] = {"statistic": f"median of the per-step tokens/s of steps 2..{len(steps) + 1} "
                                                f"({len(steps)} steps) of gpt_train"}
    tt = torch_modes(get("C-torch-train.log"), "train")
    for mode in ("eager", "compile"):
        if mode in tt:
            i, o = tt[mode]
            train[f"torch_{mode}"] = o["tokens_per_s"]
            train["sources"][f"torch_{mode}"] = src(rel("C-torch-train.log"), i)
            details[f"torch_train_{mode}"] = {k: o.get(k) for k in ("statistic", "median_ms", "mfu_vs_peak",
                                                                   "mfu_vs_ceiling", "mfu_formula", "precision",
                                                                   "optimizer", "first_loss", "loss")}
    if train["tessel"] and shape:  # the same formula as torch's lines: llm.c's 6N + 6LCT per token
        fpt = 6 * shape["params"] + 6 * shape["layers"] * shape["d_model"] * shape["seq"]
        details["tessel_train"].update({"mfu_formula": "llm.c 6*N + 6*L*C*T FLOP per token", "model": shape,
                                        "mfu_vs_peak": train["tessel"] * fpt / 989e12,
                                        "mfu_vs_ceiling": train["tessel"] * fpt / (ceiling * 1e12) if ceiling else None})

    # D: NCCL, two processes on GPU 0 (the verdict lines gpu-round wrote).
    nccl = rnd["nccl_two_process"]
    for i, l in enumerate(get("D-nccl.txt") or [], 1):
        m = re.match(r"^(gpt|gpt_train|kill): (pass|fail)\b", l)
        if m:
            nccl[m.group(1)] = m.group(2)
            nccl["sources"][m.group(1)] = src(rel("D-nccl.txt"), i)
    return {"round": rnd, "details": details}


def main(argv):
    if len(argv) == 3 and argv[1] == "assemble":
        print(json.dumps(assemble(argv[2]), indent=2))
        return 0
    if len(argv) == 3 and argv[1] == "ceiling":
        value, _ = ceiling_tflops(read_lines(argv[2]))
        if value:
            print(f"{value:.3f}")
        return 0
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
