#!/usr/bin/env bash
# Runs every `build/bin/tessel-plan ...` line of docs/planner.md exactly as written, from a
# scratch copy of the repository root (so the files it writes land there): build/bin points at
# this build's binaries and ../shared at the shared benchmarks, as on a developer's machine.
# Checks each prints a plan first, then where its figures come from (and the baselines, and the
# run's report, where it asks for them), then the files the first one writes.
# With a fourth argument "mpi": the `mpirun ... build/bin/tessel-plan ...` lines instead (one
# process per device), each of which must run the plan with one process per device.
set -euo pipefail
bin_dir=$1 src=$2 work=$3 form=${4:-threads}
rm -rf "$work"
mkdir -p "$work/root/build"
ln -s "$bin_dir" "$work/root/build/bin"
cp -r "$src/examples" "$work/root/examples"
ln -s "$(cd "$src/../shared" && pwd)" "$work/shared"
cd "$work/root"
if [ "$form" = mpi ]; then
  mapfile -t cmds < <(grep -E '^mpirun .*build/bin/tessel-plan ' "$src/docs/planner.md")
  [ ${#cmds[@]} -ge 1 ] || { echo "found no mpirun tessel-plan command in docs/planner.md"; exit 1; }
else
  mapfile -t cmds < <(grep -E '^build/bin/tessel-plan ' "$src/docs/planner.md")
  [ ${#cmds[@]} -ge 3 ] || { echo "found ${#cmds[@]} tessel-plan commands in docs/planner.md, expected 3"; exit 1; }
fi
for c in "${cmds[@]}"; do
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  echo "$out" | tail -8
  grep -q "^makespan " <<<"$out" || { echo "no makespan line"; exit 1; }
  if [ "$form" != mpi ]; then
    # The output starts with the plan (the candidate tables only with --verbose), and says
    # where its figures come from.
    head -1 <<<"$out" | grep -Eq '^[0-9]+ jobs on [0-9]+ node\(s\) x [0-9]+ devices$' ||
      { echo "the output does not start with the plan"; exit 1; }
    grep -q "^step times: " <<<"$out" || { echo "no step times line"; exit 1; }
    grep -q "^predicted: " <<<"$out" || { echo "no predicted line"; exit 1; }
    ! grep -q "candidates priced" <<<"$out" || { echo "candidate tables without --verbose"; exit 1; }
  fi
  if [[ $c == *--baselines* ]]; then
    grep -q "each alone on all it can use" <<<"$out" || { echo "no baselines"; exit 1; }
  fi
  if [[ $c == *--run* ]]; then
    grep -q "^makespan: planned " <<<"$out" || { echo "no run report"; exit 1; }
  fi
  if [ "$form" = mpi ]; then
    grep -q "CPU virtual devices (one process each)" <<<"$out" || { echo "not run with one process per device"; exit 1; }
    # Every job ran all its steps: the report's segments end at the job's step count.
    python3 - "$out" "$src/examples/planner" <<'PY'
import json, re, sys
out = sys.argv[1]
for j in json.load(open(sys.argv[2] + "/gpt_jobs.json"))["jobs"]:
    m = re.search(r"^%s .*steps (\d+)-(\d+)\s*$" % re.escape(j["name"]), out, re.M)
    assert m and int(m.group(2)) == j["steps"], (j["name"], m and m.group(0))
print("every job ran all its steps")
PY
  fi
done
[ "$form" = mpi ] && exit 0
python3 - <<'PY'
import json
p = json.load(open("plan.json"))
assert p["makespan_s"] > 0 and len(p["jobs"]) == 6, p
for j in p["jobs"]:
    assert j["end_s"] > j["start_s"] >= 0 and len(j["devices"]) == j["num_devices"], j
t = json.load(open("tessel-plan.trace.json"))
assert any(e["ph"] == "X" for e in t["traceEvents"])
svg = open("tessel-plan.svg").read()
assert svg.startswith("<svg") and "<rect x=" in svg
print("plan.json, the trace and the Gantt chart check out")
PY
