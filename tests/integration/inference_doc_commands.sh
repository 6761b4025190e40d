#!/usr/bin/env bash
# Runs the commands of docs/inference.md ("Run it": the indented `build/bin/...` and `mpirun ...`
# lines) exactly as written, in order, from a scratch folder where build/bin points at this
# build's binaries (and examples/ points at the source's). Each gpt_generate must print one
# `text: ` line per --prompt, each starting with its prompt; the greedy "The " line must be the
# same on every mesh and process count. A --serve command must report every request of its
# trace served and every generated token counted (with --static: both modes, the same tokens).
set -euo pipefail
bin_dir=$1 src=$2 work=$3
rm -rf "$work"
mkdir -p "$work/build"
ln -s "$bin_dir" "$work/build/bin"
ln -s "$src/examples" "$work/examples"
cd "$work"
mapfile -t cmds < <(sed -n '/^## Run it/,/^## /p' "$src/docs/inference.md" | grep -E '^    (build/bin/|mpirun )' | sed 's/^    //')
[ ${#cmds[@]} -ge 10 ] || { echo "found ${#cmds[@]} commands in docs/inference.md, expected 10"; exit 1; }
first=""
for c in "${cmds[@]}"; do
  if [[ $c == mpirun* && -n ${TESSEL_DOC_SKIP_MPIRUN:-} ]]; then
    echo "(skipped under the sanitizers, libmpi not being instrumented: $c)"
    continue
  fi
  echo "\$ $c"
  out=$(bash -c "$c" 2>&1) || { echo "$out"; echo "FAILED: $c"; exit 1; }
  if [[ $c == *tessel-explain* ]]; then
    echo "$out" | tail -3
    grep -q '^collectives: ' <<<"$out" || { echo "FAILED: tessel-explain printed no collectives line"; exit 1; }
    continue
  fi
  [[ $c == *gpt_generate* ]] || continue
  echo "$out"
  if [[ $c == *--write-graphs* ]]; then
    [ "$(grep -c '^wrote the \(prefill\|decode\) graph' <<<"$out")" = 2 ] || { echo "FAILED: not two graphs written"; exit 1; }
    continue
  fi
  if [[ $c == *--serve* ]]; then
    trace=$(grep -o -- '--serve [^ ]*' <<<"$c" | cut -d' ' -f2)
    n=$(grep -c '"prompt"' "$src/$trace")
    grep -Eq "^continuous batching: $n requests, [0-9]+ tokens in [0-9.]+ s = [0-9.]+ tokens/s; latency p50" <<<"$out" ||
      { echo "FAILED: no 'continuous batching: $n requests' line"; exit 1; }
    if [[ $c == *--static* ]]; then
      tokens=$(grep -o '^continuous batching: [0-9]* requests, [0-9]* tokens' <<<"$out" | grep -o '[0-9]* tokens')
      grep -q "^static batches: $n requests, $tokens in" <<<"$out" ||
        { echo "FAILED: static batches did not generate the same $tokens"; exit 1; }
      grep -Eq '^continuous / static: [0-9.]+x the tokens/s' <<<"$out" || { echo "FAILED: no ratio line"; exit 1; }
    fi
    continue
  fi
  texts=$(grep -c '^text: ' <<<"$out" || true)
  prompts=$(grep -o -- '--prompt' <<<"$c" | wc -l)
  [ "$texts" = "$prompts" ] || { echo "FAILED: $texts text lines for $prompts prompts"; exit 1; }
  line=$(grep '^text: The ' <<<"$out") || { echo "FAILED: no line starts with the prompt 'The '"; exit 1; }
  [ ${#line} -gt 12 ] || { echo "FAILED: nothing generated after 'The '"; exit 1; }
  # The same greedy bytes everywhere (the shorter of two runs is a prefix of the longer).
  if [ -z "$first" ]; then first=$line
  else
    short=$line long=$first
    [ ${#first} -lt ${#line} ] && short=$first long=$line
    [[ $long == "$short"* ]] || { echo "FAILED: '$line' differs from the first run's '$first'"; exit 1; }
  fi
  grep -q "A cat" <<<"$c" && { grep -q '^text: A cat' <<<"$out" || { echo "FAILED: no 'A cat' line"; exit 1; }; }
done
echo "all ${#cmds[@]} commands of docs/inference.md ran as written"
