"""Reading a run of bench/jax/run_side_by_side.sh or run_train_side_by_side.sh: the Google
Benchmark JSONs (tessel-*.json) and gpt_jax.py's lines (jax-*.jsonl) of one results folder,
medians over its rounds. Used by summarise.py and summarise_train.py."""
import json
import pathlib


def median_entry(entries, key):
    entries = sorted(entries, key=key)
    return entries[(len(entries) - 1) // 2]


def gbench(d: pathlib.Path, name, prefix="tessel"):
    """{benchmark name without /real_time: entry} from the Google Benchmark JSONs of `name`
    (<prefix>-<name>.json, or one per round <prefix>-<name>-r<i>.json): the median aggregate of
    repetitions, and over rounds the entry with the median real time."""
    runs = {}
    for p in sorted(d.glob(f"{prefix}-{name}.json")) + sorted(d.glob(f"{prefix}-{name}-r*.json")):
        for b in json.loads(p.read_text())["benchmarks"]:
            key = b.get("run_name", b["name"]).replace("/real_time", "")
            if b.get("error_occurred"):
                runs.setdefault(key, []).append({"error": b.get("error_message", "error"), "real_time": 0})
                continue
            if b.get("run_type") == "aggregate" and b.get("aggregate_name") != "median":
                continue
            runs.setdefault(key, []).append(b)
    return {k: median_entry(v, lambda b: b["real_time"]) for k, v in runs.items()}


def jaxres(d: pathlib.Path, name):
    """{bench: the round with the median wall time} from jax-<name>.jsonl (one line a round)."""
    p = d / f"jax-{name}.jsonl"
    if not p.exists():
        return {}
    runs = {}
    for r in (json.loads(l) for l in p.read_text().splitlines() if l.strip()):
        runs.setdefault(r["bench"], []).append(r)
    return {k: median_entry(v, lambda r: r["median_s"]) for k, v in runs.items()}


def fmt_ratio(r, bar=1.0):
    """The ratio, in bold when below `bar`."""
    return f"**{r:.2f}x**" if r < bar else f"{r:.2f}x"


def machine_and_load(d: pathlib.Path):
    """machine.txt and load.txt of the run as Markdown lines."""
    out = []
    machine = (d / "machine.txt").read_text() if (d / "machine.txt").exists() else ""
    out.append("```\n" + machine + "```\n")
    if (d / "load.txt").exists():
        out.append("Load average (1, 5, 15 min) before each step:\n\n```\n" + (d / "load.txt").read_text() + "```\n")
    return out
