#!/bin/sh
# A gpt_train run killed mid-training keeps the loss curve of its finished steps in --out's CSV
# (issue 36 item 7: the CSV used to be written only at the end). Usage: gpt_train_killed_csv.sh GPT_TRAIN DIR
set -u
exe=$1
dir=$2
rm -f "$dir/killed.csv"
"$exe" --steps 100000 --no-reference --out "$dir/killed" > "$dir/killed.log" 2>&1 &
pid=$!
i=0
# Wait (up to 120 s) for at least 3 finished steps in the CSV (a header and 3 rows).
while [ "$i" -lt 1200 ]; do
  if [ -f "$dir/killed.csv" ] && [ "$(wc -l < "$dir/killed.csv")" -ge 4 ]; then break; fi
  if ! kill -0 "$pid" 2>/dev/null; then echo "gpt_train ended before 3 steps were in the CSV"; cat "$dir/killed.log"; exit 1; fi
  sleep 0.1
  i=$((i + 1))
done
if [ "$i" -ge 1200 ]; then echo "no 3 steps in the CSV after 120 s of training"; kill -9 "$pid"; exit 1; fi
kill -9 "$pid" || { echo "gpt_train was not running any more"; exit 1; }
wait "$pid" 2>/dev/null
rows=$(wc -l < "$dir/killed.csv")
head -n 1 "$dir/killed.csv" | grep -q '^step,loss,' || { echo "no CSV header"; exit 1; }
[ "$rows" -ge 4 ] || { echo "the killed run left $rows lines in its CSV"; exit 1; }
# Every row is whole: 8 fields.
awk -F, 'NR > 1 && NF != 8 { bad = 1 } END { exit bad }' "$dir/killed.csv" || { echo "a torn row"; exit 1; }
echo "killed after $((rows - 1)) steps; the CSV kept them"
