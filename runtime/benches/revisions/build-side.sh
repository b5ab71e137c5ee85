#!/usr/bin/env bash
# Builds one side of a before/after comparison (first made for issue 44) into DIR:
#   DIR/src       the source tree of REV (git archive of REPO)
#   DIR/pipeline  the bench binary (`cargo bench -p sluice --bench pipeline --no-run`,
#                 the bench profile), built from DIR/src with
#                 CARGO_TARGET_DIR=${SLUICE_BENCH_DIR:-/tmp/sluice-bench-revisions}/target so dependencies are shared
#   DIR/src/target/plugins/*.wasm  the plugins, built the way the harness
#                 builds them (release, wasm32-wasip2, in DIR/src/target/plugins-build)
#   DIR/REV       the commit
# Usage: build-side.sh REV DIR [REPO]   (REPO defaults to this repository)
set -euo pipefail
rev=$1
dir=$2
repo=${3:-$(git -C "$(dirname "$(realpath "$0")")" rev-parse --show-toplevel)}
bench=${SLUICE_BENCH_DIR:-/tmp/sluice-bench-revisions}
sha=$(git -C "$repo" rev-parse --verify "$rev^{commit}")
mkdir -p "$dir"
dir=$(realpath "$dir")
log="$dir/build.log"
echo "building $sha into $dir (log: $log)"

# A fresh source tree, but keep an earlier plugin build's cache.
if [[ -d $dir/src/target/plugins-build ]]; then
    mv "$dir/src/target/plugins-build" "$dir/plugins-build.keep"
fi
rm -rf "$dir/src"
mkdir -p "$dir/src"
git -C "$repo" archive "$sha" | tar -x -C "$dir/src"
mkdir -p "$dir/src/target"
if [[ -d $dir/plugins-build.keep ]]; then
    mv "$dir/plugins-build.keep" "$dir/src/target/plugins-build"
elif [[ -d $bench/before/src/target/plugins-build && $dir != "$bench/before" ]]; then
    cp -a "$bench/before/src/target/plugins-build" "$dir/src/target/plugins-build"
fi

cd "$dir/src"
CARGO_TARGET_DIR=$bench/target cargo bench -p sluice --bench pipeline --no-run \
    --message-format=json-render-diagnostics >"$dir/build.json" 2>"$log"
exe=$(python3 - "$dir/build.json" <<'PY'
import json, sys
exe = None
for line in open(sys.argv[1]):
    if not line.startswith("{"):
        continue
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "pipeline" \
            and "bench" in m["target"]["kind"] and m.get("executable"):
        exe = m["executable"]
print(exe or "")
PY
)
if [[ -z $exe ]]; then
    echo "error: cargo reported no pipeline bench executable; see $log" >&2
    exit 1
fi
cp "$exe" "$dir/pipeline"

# The plugins, with the harness's own command, so that the bench's build at
# start is a no-op.
env -u RUSTFLAGS -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_RUSTFLAGS -u RUSTC_WRAPPER \
    -u RUSTC_WORKSPACE_WRAPPER -u CARGO_BUILD_TARGET -u CARGO_MAKEFLAGS \
    CARGO_TARGET_DIR="$dir/src/target/plugins-build" \
    cargo build --release --target wasm32-wasip2 --manifest-path "$dir/src/plugins/Cargo.toml" \
    >>"$log" 2>&1
mkdir -p "$dir/src/target/plugins"
for name in uppercase identity; do
    cp "$dir/src/target/plugins-build/wasm32-wasip2/release/$name.wasm" "$dir/src/target/plugins/$name.wasm"
done
echo "$sha" >"$dir/REV"
echo "done: $dir/pipeline ($(git -C "$repo" log -1 --format='%h %s' "$sha" | cut -c1-100))"
