#!/bin/sh
# Re-runs this record from the repository root, with a Release build in build/ (and, for the
# "before" column, main's tessel-plan at the commit named in README.md as $BEFORE).
set -e
G=../shared/benchmarks/multijob-gavel
OUT=$(dirname "$0")
for case in "16 1x8" "16 2x8" "20 1x8" "20 2x8"; do
  set -- $case
  /usr/bin/time -f "%e s wall, %U s user, %M KB" build/bin/tessel-plan --gavel $G --pool-shape $2 --jobs $1 \
    --method bnb --seconds 600 --no-pictures --json $OUT/bnb-$1-$2.json > $OUT/bnb-$1-$2.txt 2>&1
  build/bin/tessel-plan --gavel $G --pool-shape $2 --jobs $1 --method fast --no-pictures \
    --json $OUT/fast-$1-$2.json > $OUT/fast-$1-$2.txt 2>&1
  if [ -n "$BEFORE" ]; then
    "$BEFORE" --gavel $G --pool-shape $2 --jobs $1 --method fast --no-pictures \
      --json $OUT/fast-before-$1-$2.json > $OUT/fast-before-$1-$2.txt 2>&1
  fi
done
for shape in 1x8 2x8; do
  for clamp in "" --no-clamp; do
    build/bin/tessel-plan --gavel $G --pool-shape $shape $clamp --method fast --baselines --no-pictures \
      --json $OUT/fast-100-$shape$clamp.json > $OUT/fast-100-$shape$clamp.txt 2>&1
  done
done
