#!/usr/bin/env bash
# Issue 44, Must show 7: the stage hop and wasm/native, before and after,
# alternating on the same machine; the ratios must stay within 0.05 of
# before.
#
# Usage: run.sh [-r ROUNDS] [-s "SECTION ..."] [-o OUT_DIR] [BEFORE_DIR] [AFTER_DIR]
#
#   BEFORE_DIR, AFTER_DIR  each holds `pipeline` (the bench binary, built by
#                          `cargo bench -p sluice --bench pipeline --no-run`)
#                          and `src/` (that commit's source tree, whose
#                          target/plugins/*.wasm the bench loads; see below).
#                          Defaults: $SLUICE_BENCH_DIR/before and /after (SLUICE_BENCH_DIR: /tmp/sluice-bench-revisions).
#   -r ROUNDS    rounds (default 3; use at least 3 for the real comparison).
#                A round runs each section once per side: before, then after.
#   -s SECTIONS  the bench sections (default "stage-hop wasm-vs-native").
#   -o OUT_DIR   where each run's full output goes (default
#                $SLUICE_BENCH_DIR/results/<date>).
#
# Each run is one process: `<side>/pipeline --bench <section>`, which takes
# 5 samples of each side of its A/B pair (fixed in pipeline.rs, SAMPLES)
# and prints `| name | A | B | ratio B/A |` rows. This script collects each
# run's ratios and prints, per row, every run's ratio and the medians of
# before and after side by side, with the difference.
#
# How the binary finds its plugins: `sluice_harness::plugin(name)` takes the
# repository root from $CARGO_MANIFEST_DIR's parent (cargo sets it under
# `cargo bench`; here we set it to <side>/src/runtime), builds the plugins
# with `cargo build --release --target wasm32-wasip2 --manifest-path
# <root>/plugins/Cargo.toml` into <root>/target/plugins-build (a no-op when
# they are built already), and loads <root>/target/plugins/<name>.wasm.
# That happens before any sample is timed.
set -euo pipefail

rounds=3
sections="stage-hop wasm-vs-native"
out=""
while getopts "r:s:o:h" opt; do
    case $opt in
        r) rounds=$OPTARG ;;
        s) sections=$OPTARG ;;
        o) out=$OPTARG ;;
        h) sed -n '2,30p' "$0"; exit 0 ;;
        *) sed -n '2,30p' "$0" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
before=$(realpath "${1:-${SLUICE_BENCH_DIR:-/tmp/sluice-bench-revisions}/before}")
after=$(realpath "${2:-${SLUICE_BENCH_DIR:-/tmp/sluice-bench-revisions}/after}")
out=${out:-${SLUICE_BENCH_DIR:-/tmp/sluice-bench-revisions}/results/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"

for side in "$before" "$after"; do
    if [[ ! -x $side/pipeline || ! -f $side/src/plugins/Cargo.toml ]]; then
        echo "error: $side needs an executable \`pipeline\` and the source tree \`src/\`" >&2
        exit 2
    fi
done

echo "before: $before ($(cat "$before/REV" 2>/dev/null || echo '?'))"
echo "after:  $after ($(cat "$after/REV" 2>/dev/null || echo '?'))"
echo "rounds: $rounds; sections: $sections; logs: $out"
echo "machine: $(nproc) cores; load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
echo

results="$out/ratios.tsv"
: >"$results"

# The rows of a run's table, `| name | A | B | ratio |`, as
# `label<TAB>round<TAB>section<TAB>row<TAB>name<TAB>A<TAB>B<TAB>ratio`. A
# name may hold a `|` itself ("raw broker loop | identity stage"), so the
# last three cells are read from the right.
rows() {
    python3 - "$@" <<'PY'
import sys
label, rnd, section, log = sys.argv[1:5]
n = 0
for line in open(log, encoding="utf-8", errors="replace"):
    line = line.strip()
    if not (line.startswith("|") and line.endswith("|")):
        continue
    cells = [c.strip() for c in line[1:-1].split("|")]
    if len(cells) < 4 or cells[0] == "benchmark" or set(cells[0]) <= set("-"):
        continue
    name = " | ".join(cells[:-3])
    a, b, ratio = cells[-3:]
    n += 1
    print("\t".join([label, rnd, section, str(n), name, a, b, ratio]))
PY
}

# One run of one section on one side; its rows go to $results.
run_one() {
    local side_dir=$1 label=$2 section=$3 round=$4
    local log="$out/$section.$label.$round.log"
    local load started
    load=$(cut -d' ' -f1 /proc/loadavg)
    started=$(date +%s)
    if ! (
        cd "$side_dir/src"
        env -u CARGO_TARGET_DIR -u STAGE_HOP_SIDE -u POISON_ONLY -u BENCH_CONFLICTS \
            CARGO_MANIFEST_DIR="$side_dir/src/runtime" \
            "$side_dir/pipeline" --bench "$section"
    ) >"$log" 2>"$log.stderr"; then
        echo "error: $label $section round $round failed; see $log.stderr" >&2
        tail -20 "$log.stderr" >&2
        exit 1
    fi
    echo "round $round, $section, $label ($(($(date +%s) - started)) s, load $load at start):"
    rows "$label" "$round" "$section" "$log" | tee -a "$results" |
        awk -F'\t' '{ printf "    %-6s %s | %s | %s | ratio %s\n", $1, $5, $6, $7, $8 }'
}

for round in $(seq 1 "$rounds"); do
    for section in $sections; do
        run_one "$before" before "$section" "$round"
        run_one "$after" after "$section" "$round"
    done
done

echo
echo "== ratios B/A per run, and medians (before | after | after - before) =="
python3 - "$results" <<'EOF'
import sys, statistics
rows = {}
names = {}
for line in open(sys.argv[1]):
    label, rnd, section, n, name, a, b, ratio = line.rstrip("\n").split("\t")
    key = (section, int(n))
    names.setdefault(key, name)
    rows.setdefault(key, {"before": [], "after": []})[label].append(float(ratio))
worst = 0.0
for key in sorted(rows):
    r = rows[key]
    print(f"{key[0]} #{key[1]}: {names[key]}")
    print("  before: " + " ".join(f"{x:.2f}" for x in r["before"]))
    print("  after:  " + " ".join(f"{x:.2f}" for x in r["after"]))
    if r["before"] and r["after"]:
        mb, ma = statistics.median(r["before"]), statistics.median(r["after"])
        d = ma - mb
        verdict = "within 0.05" if abs(d) <= 0.05 else "MORE THAN 0.05 APART"
        print(f"  median: {mb:.2f} | {ma:.2f} | {d:+.2f}  ({verdict})")
print()
print("(For the CPU row, a lower ratio is better; for the msgs/s rows, higher.)")
EOF
