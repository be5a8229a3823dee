#!/usr/bin/env bash
# The GPU checks of the device path and `joader bench train`, in one prepared run: what only a
# machine with CUDA can show (CI never has one). Two steps:
#
#   bash server/tools/gpu/check.sh prepare   # here: builds what travels into .gpu/ (ignored)
#   bash server/tools/gpu/check.sh run       # there: writes everything to $OUT (or ./gpu-out)
#   bash server/tools/gpu/check.sh ab A.whl B.whl   # there: two builds of the Python package
#   bash server/tools/gpu/check.sh depth            # there: joader's prefetch and ring depth
#   bash server/tools/gpu/check.sh probe            # there: where joader's K = 1 run waits
#
# `ab` measures a change of the Python package before and after in one call: the tests with B,
# then `joader bench train` (ResNet-18, K = 1 and K = 4, joader and joader-device; the
# synthetic limit once) with A and with B in turn, on the same machine and data.
#
# `prepare` builds the stripped release `joader`, the stripped fixture writer of the Python
# tests, the abi3 wheel of the Python package and the nine photos the bench's images are made
# of (about 42 MiB together). `run` expects a python3 with torch, torchvision, pytest and numpy,
# as the GPU machine's image has them (with scikit-image and scikit-learn, whose photos it
# uses when they have them all, else the carried ones), unpacks the wheel into a folder of its
# own (no pip needed), and runs,
# each under a time limit, logging as it goes (a limit cut short loses only its own step):
#   1. the device path's tests and the torch tests (CUDA cases included where a GPU is there);
#   2. `joader bench train` with ResNet-18 at K = 1 and K = 4 (synthetic limit, joader with the
#      crop in the client, joader with the crop on the device, the tuned DataLoader);
#   3. `joader bench dataplane` on that machine's CPU;
#   4. `joader bench decode` on 300 of the training images (the bare pipeline's rate);
#   5. with time left, the ResNet-18 + ResNet-50 mix at K = 4 (150 window steps, GPU_MIX_STEPS:
#      60 gave windows of 2-3 s, too short for the ResNet-50 jobs' rates to settle).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
cd "$root"
dev="$root/.gpu"

prepare() {
  set -e
  grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
  rm -rf "$dev" && mkdir -p "$dev"
  cargo build --release -q -p joader-tools --bin joader
  cargo build -q -p dataplane --bin dataplane-fixture
  strip -o "$dev/joader" target/release/joader
  strip -o "$dev/dataplane-fixture" target/debug/dataplane-fixture
  source tests/pyenv.sh
  python3 -m maturin build --release --quiet -m dataplane/python/Cargo.toml -o "$dev"
  # The photos the bench's images are made of (3 MiB), in case the GPU machine's scikit-image
  # or scikit-learn no longer ships one: `run` puts these folders first on PYTHONPATH then.
  # The list is `PHOTOS` of bench/photos.rs ("package/path" each), read from there.
  python3 - "$dev/photos" $(grep -o '"sk[a-z]*/[^"]*"' server/tools/src/bench/photos.rs | tr -d '"') <<'PY'
import importlib.util, pathlib, shutil, sys
out = pathlib.Path(sys.argv[1])
for photo in sys.argv[2:]:
    name, rest = photo.split("/", 1)
    root = pathlib.Path(importlib.util.find_spec(name).submodule_search_locations[0])
    (out / name / rest).parent.mkdir(parents=True, exist_ok=True)
    (out / name / "__init__.py").write_text("")
    shutil.copy(root / rest, out / name / rest)
PY
  du -sh "$dev"/*
}

# What both modes do first: the log in $out, a clock, the machine's card and CPU.
begin() {
  out="${OUT:-$root/gpu-out}"
  mkdir -p "$out"
  exec > >(tee "$out/log.txt") 2>&1
  export PYTHONUNBUFFERED=1 JOADER_FIXTURE="$dev/dataplane-fixture" PATH="$dev:$PATH"
  start=$SECONDS
  step "machine $*"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  lscpu | grep -E 'Model name|^CPU\(s\)|Thread|MHz' ; nproc; free -g | head -2
  python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__, "cuda", torch.cuda.is_available())'
}
step() { echo; echo "=== $* (at $((SECONDS - start)) s)"; }
# limit SECONDS COMMAND...: runs COMMAND in a process group of its own and, when it outlives
# SECONDS, ends the whole group (`timeout` would end the bench alone and leave its `joader
# serve` and job processes running into the next step); whatever the group left is ended too.
limit() {
  local seconds=$1 pid watcher rc
  shift
  setsid "$@" &
  pid=$!
  ( sleep "$seconds"; kill -TERM -- "-$pid" 2>/dev/null; sleep 5; kill -KILL -- "-$pid" 2>/dev/null ) &
  watcher=$!
  wait "$pid"
  rc=$?
  kill "$watcher" 2>/dev/null
  kill -KILL -- "-$pid" 2>/dev/null
  return "$rc"
}
# install_wheel DIR WHEEL: the package into a folder of its own (on PYTHONPATH by the caller).
# The wheel holds only the package and its dist-info, so unpacking it is installing it; this
# needs no pip (the test environment has none).
install_wheel() {
  rm -rf "$1" && python3 -m zipfile -e "$2" "$1" || exit 1
}
# device_tests SITE: the device path's and torch's tests with the package in SITE.
device_tests() {
  (cd dataplane/python/tests && PYTHONPATH="$1" timeout 100 python3 -m pytest -q -p no:cacheprovider -rA \
    test_device.py test_torch.py) 2>&1 | tee "$out/pytest.txt" | grep -Ev '^(PASSED|SKIPPED) ' || true
}

run() {
  begin
  step install
  install_wheel /tmp/joader-site "$dev"/joader-*.whl
  export PYTHONPATH=/tmp/joader-site
  python3 -c 'import joader, joader.torch; print("joader", joader.__file__)' || exit 1
  # The photos from the installed packages when they have them all, else the carried ones.
  if ! python3 -c 'import importlib.util as u, os, sys
for f in sys.argv[1:]:
    n, rest = f.split("/", 1)
    s = u.find_spec(n)
    assert s and os.path.exists(os.path.join(list(s.submodule_search_locations)[0], rest)), f' \
      $(cd "$dev/photos" && find . -type f ! -name __init__.py | sed 's|^\./||'); then
    echo "the installed scikit-image or scikit-learn lacks a photo: the carried ones are used"
    export PYTHONPATH="$PYTHONPATH:$dev/photos"
  fi

  step "1. the device path's and torch's tests"
  device_tests /tmp/joader-site

  step "2. bench train, ResNet-18, K = 1 then K = 4"
  for k in 1 4; do
    limit $([ "$k" = 1 ] && echo 160 || echo 210) joader bench train --model resnet18 --jobs "$k" --steps "${GPU_STEPS:-100}" \
      --bench-data /tmp/joader-bench-data --out "/tmp/joader-gpu/train-k$k" || echo "bench train K=$k: exit $?"
    cp /tmp/joader-gpu/train-k$k/train.md "$out/train-k$k.md" 2>/dev/null
  done

  step "3. bench dataplane (this machine's CPU)"
  limit 30 joader bench dataplane || echo "bench dataplane: exit $?"

  step "4. bench decode on 300 of the training images"
  sub=/tmp/joader-decode-sub && rm -rf "$sub" && mkdir -p "$sub"
  find /tmp/joader-bench-data/train -name '*.jpg' | sort | head -300 | xargs -r cp -t "$sub"
  limit 40 joader bench decode --from "$sub" --min-seconds 1 || echo "bench decode: exit $?"

  if [ $((SECONDS - start)) -lt "${GPU_MIX_BEFORE:-330}" ]; then
    step "5. the ResNet-18 + ResNet-50 mix at K = 4"
    limit $((480 - (SECONDS - start))) joader bench train --models resnet18,resnet50 --jobs 4 --steps "${GPU_MIX_STEPS:-150}" \
      --systems synthetic,joader,joader-device --bench-data /tmp/joader-bench-data --out /tmp/joader-gpu/train-mix \
      || echo "bench train mix: exit $?"
    cp /tmp/joader-gpu/train-mix/train.md "$out/train-mix.md" 2>/dev/null
  else
    step "5. skipped: too little time left"
  fi
  cp /tmp/joader-gpu/train-k4/train.png "$out/train-k4.png" 2>/dev/null
  step done
}

ab() {
  begin "(A = $1, B = $2)"
  install_wheel /tmp/joader-site-a "$1"
  install_wheel /tmp/joader-site-b "$2"
  step "the device path's and torch's tests with B"
  device_tests /tmp/joader-site-b
  for k in 1 4; do
    for v in a b; do
      step "bench train K=$k with $v"
      systems=joader,joader-device
      [ "$v" = a ] && systems=synthetic,$systems
      PYTHONPATH=/tmp/joader-site-$v limit 150 joader bench train --model resnet18 --jobs "$k" \
        --steps "${GPU_STEPS:-100}" --systems "$systems" --bench-data /tmp/joader-bench-data \
        --out "/tmp/joader-gpu/$v-k$k" || echo "bench train K=$k $v: exit $?"
      cp "/tmp/joader-gpu/$v-k$k/train.md" "$out/$v-k$k.md" 2>/dev/null
    done
  done
  step done
}

# depth: whether a deeper pipeline lifts one job alone (K = 1 left 6-8 of 16 cores and half the
# GPU idle on an H200): joader at K = 1 and K = 4 with the default prefetch (2 batches) and ring
# (2 batches), then 4 and 4, then 6 and 8, the synthetic limit once per K, in one call.
depth() {
  begin "(depth)"
  install_wheel /tmp/joader-site "$dev"/joader-*.whl
  export PYTHONPATH=/tmp/joader-site
  for k in 1 4; do
    for d in "2 default" "4 512" "6 1024"; do
      set -- $d
      step "bench train K=$k, prefetch $1, ring $2"
      systems=joader
      [ "$1" = 2 ] && systems=synthetic,joader
      ring=()
      [ "$2" = default ] || ring=(--ring-capacity "$2")
      limit 120 joader bench train --model "${GPU_MODEL:-resnet18}" --jobs "$k" --steps "${GPU_STEPS:-200}" --systems "$systems" \
        --prefetch "$1" "${ring[@]}" --bench-data /tmp/joader-bench-data --out "/tmp/joader-gpu/depth-k$k-$1" \
        || echo "bench train K=$k prefetch $1: exit $?"
      cp "/tmp/joader-gpu/depth-k$k-$1/train.md" "$out/depth-k$k-$1.md" 2>/dev/null
    done
  done
  step done
}

# probe: where joader at K = 1 waits (an H200's server used under 6 of its 16 threads there):
# `probe.py` polls the bench's server (pending loads, the Loader's queue, payloads waiting for
# room, records between server and training loop, busy loader threads, the client's time on an
# empty ring, CPU by thread) through joader at K = 1 with the defaults, with a cache that holds
# the whole decoded set, and with a deeper prefetch and ring, then at K = 4; the synthetic limit
# once per K. PROBE_ALTERNATE=1 runs the default depth and the deep one at K = 1 in turn, twice.
probe() {
  begin "(probe)"
  install_wheel /tmp/joader-site "$dev"/joader-*.whl
  export PYTHONPATH=/tmp/joader-site
  local steps=${GPU_STEPS:-300}
  run_probed() { # NAME K ARGS...: one bench train run with the probe beside it
    local name=$1 k=$2
    shift 2
    step "bench train $name (K=$k $*)"
    python3 server/tools/gpu/probe.py "$out/probe-$name.txt" &
    local poller=$!
    limit "${PROBE_LIMIT:-90}" joader bench train --model "${GPU_MODEL:-resnet18}" --jobs "$k" --steps "$steps" \
      --bench-data /tmp/joader-bench-data --out "/tmp/joader-gpu/probe-$name" "$@" || echo "bench train $name: exit $?"
    sleep 0.5; kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null
    grep -h '^#' "$out/probe-$name.txt"
  }
  if [ "${PROBE_ALTERNATE:-0}" = 1 ]; then
    # The default depth against prefetch 6 and a ring of 1024 at K = 1, in turn, twice: the
    # first run on a fresh machine tends to be the slowest, so one pair cannot settle it.
    for round in 1 2; do
      run_probed "k1-default-$round" 1 --systems joader
      run_probed "k1-deep-$round" 1 --systems joader --prefetch 6 --ring-capacity 1024
    done
  else
    run_probed k1 1 --systems synthetic,joader
    run_probed k1-whole-cache 1 --systems joader --cache-bytes 2GiB
    run_probed k1-deep 1 --systems joader --prefetch 6 --ring-capacity 1024
    [ $((SECONDS - start)) -lt "${PROBE_K4_BEFORE:-200}" ] && run_probed k4 4 --systems synthetic,joader
  fi
  step done
}

case "${1:-}" in
  prepare) prepare ;;
  run) run ;;
  ab) ab "$2" "$3" ;;
  depth) depth ;;
  probe) probe ;;
  *) echo "usage: $0 prepare|run|ab A.whl B.whl|depth|probe" >&2; exit 2 ;;
esac
