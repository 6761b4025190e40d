#!/bin/bash
# usage: run.sh LABEL N [extra tessel-plan args]
cd /tmp/pp3
B=/work/main/build/bin; E=/work/main/examples/planner
label=$1; n=$2; shift 2
for i in $(seq 1 $n); do
  for form in threads processes; do
    if [ $form = threads ]; then pre=""; extra="--progress-every 0"; else pre="mpirun --allow-run-as-root --oversubscribe -np 8"; extra=""; fi
    f=$label-$form-$i
    /usr/bin/time -v $pre $B/tessel-plan $E/gpt_jobs.json --pool $E/cpu_pool.json --run $extra --no-pictures "$@" > $f.txt 2> $f.time
    python3 - "$f" <<'PY'
import sys,re
f=sys.argv[1]
t=open(f+'.txt').read().split('running the plan')[-1]
ends=[float(l.split()[7]) for l in t.splitlines() if re.match(r'^(tiny|small|wide|deep)',l)]
mk=re.search(r'makespan: planned ([\d.]+) s, measured ([\d.]+) s',t)
tm=open(f+'.time').read()
g=lambda k: float(re.search(k+r'[^:]*: ([\d.]+)',tm).group(1))
print(f"{f}: planned {mk.group(1)} measured {mk.group(2)} sum_ends {sum(ends):.2f} cpu {g('User time')+g('System time'):.2f} (sys {g('System time'):.2f}) vcs {int(g('Voluntary context switches'))} ics {int(g('Involuntary context switches'))}")
PY
  done
done
