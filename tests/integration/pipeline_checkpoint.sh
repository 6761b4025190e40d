#!/usr/bin/env bash
# Issue 39: a checkpoint saved by a pipelined gpt_train run (pipe=2,data=2) resumes on data=4
# with the uninterrupted run's losses, and one saved on data=4 resumes on pipe=2,data=2 with
# them too. Losses compared from the runs' --out CSVs (column 2), steps 3 and 4, within 1e-5 by default
# relative; every run also passes its own one-device check (exit status). A third argument is a
# launcher every run starts under (e.g. "mpirun -np 4": the pipelined runs' stages on processes
# of their own, the data=4 runs one device per process); a fourth, flags every run that starts
# from step 0 takes (e.g. --mixed: a resumed run takes them from its checkpoint), and a fifth the
# relative tolerance of the losses (default 1e-5; bf16 runs on two layouts round apart: the
# --mixed runs differed by up to 3e-5 at step 4).
set -euo pipefail
bin=$1 work=$2 launch=${3:-} flags=${4:-} tol=${5:-1e-5}
rm -rf "$work"
mkdir -p "$work"
cd "$work"
run() { echo "\$ $launch gpt_train $*"; $launch "$bin/gpt_train" "$@" | grep -E '^(step|resumed|saved|largest|pipeline:)'; }
run --mesh pipe=2,data=2 --seed 7 --steps 4 $flags --out whole_pipe
run --mesh data=4 --seed 7 --steps 4 $flags --out whole_data
run --mesh pipe=2,data=2 --seed 7 --steps 2 $flags --save-dir from_pipe --out ""
run --mesh data=4 --resume --save-dir from_pipe --steps 4 --out resumed_data
run --mesh data=4 --seed 7 --steps 2 $flags --save-dir from_data --out ""
run --mesh pipe=2,data=2 --schedule gpipe --resume --save-dir from_data --steps 4 --out resumed_pipe
same() {  # same losses at the steps both files hold
  awk -F, -v a="$1" -v b="$2" -v tol="$tol" 'FNR == 1 { next } FILENAME == a { l[$1] = $2; next }
    ($1 in l) { n++; d = l[$1] - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2);
                printf "%s step %s: %s vs %s (rel %.2e)\n", b, $1, l[$1], $2, r; if (r > tol + 0) bad = 1 }
    END { if (n < 2 || bad) exit 1 }' "$1" "$2"
}
same whole_pipe.csv whole_data.csv
same whole_pipe.csv resumed_data.csv
same whole_data.csv resumed_pipe.csv
echo "a pipelined checkpoint resumes on data=4 and back with the uninterrupted losses"
