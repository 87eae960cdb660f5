#!/bin/bash
# A first run as a new user meets it, on a machine made busy on purpose (two CPU-burning
# processes beside whatever else runs): (A) a new data folder on a machine that ran ragspec
# before (its cache folder holds the kernels and the converted bundled model: `ragspec ingest`
# of the bundled documents, then `ragspec ask`); (B) a machine that never ran ragspec (an empty
# cache folder, RAGSPEC_CACHE_DIR): make demo's steps, ingest, `calibrate --if-missing`,
# then the same `ask`. Prints each line of the commands with a clock time, and the seconds of
# each step; docs/results/first-run-new-home.md records a run. Usage: [BURNERS=2] bash benchmarks/first_run.sh
cd "$(dirname "$0")/.." || exit 1
work=$(mktemp -d)
ts() { while IFS= read -r l; do echo "$(date +%T.%N | cut -c1-10) $l"; done; }
for _ in $(seq "${BURNERS:-2}"); do python3 -c "while True: pass" & done
hogs=$(jobs -p)
trap 'kill $hogs 2>/dev/null; rm -rf "$work"' EXIT
sleep 5
q="What is the default port of the Larkspur HTTP API?"
shown() { grep -v "^.\{11\}$" | grep -v "^.\{11\} \[\|highlighted\|Passages"; }
secs() { echo "$2 - $1" | bc; }
echo "== A: a new data folder on a machine that ran ragspec before (kernels built, the bundled model converted in its cache; commit $(git rev-parse --short HEAD))"
RAGSPEC_HOME=$work/before .venv/bin/ragspec calibrate --if-missing > /dev/null 2>&1  # what an earlier run left
uptime
export RAGSPEC_HOME=$work/homeA
s=$(date +%s.%N)
.venv/bin/ragspec ingest data/corpus 2>&1 | tail -1 | ts
m=$(date +%s.%N)
.venv/bin/ragspec ask "$q" 2>&1 | ts | shown
e=$(date +%s.%N)
echo "A: ingest $(secs "$s" "$m") s; ask, to its exit $(secs "$m" "$e") s"; uptime
echo "== B: a machine that never ran ragspec (an empty cache folder: no kernels, no conversion): make demo's steps"
export RAGSPEC_HOME=$work/homeB RAGSPEC_CACHE_DIR=$work/cacheB
unset RAGSPEC_KERNELS_DIR RAGSPEC_MODEL_CACHE
s=$(date +%s.%N)
.venv/bin/ragspec ingest data/corpus 2>&1 | tail -1 | ts
m=$(date +%s.%N)
.venv/bin/ragspec calibrate --if-missing 2>&1 | ts
c=$(date +%s.%N)
.venv/bin/ragspec ask "$q" 2>&1 | ts | shown
e=$(date +%s.%N)
echo "B: ingest $(secs "$s" "$m") s; calibrate --if-missing $(secs "$m" "$c") s; ask, to its exit $(secs "$c" "$e") s"
uptime
