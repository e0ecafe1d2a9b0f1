#!/usr/bin/env bash
# gpuflow on a machine with a real NVIDIA GPU, end to end: NVML discovery and sampling as the
# agent does them, then the embedded stack with this machine's `local` fleet running real GPU
# jobs under a 1-minute utilization policy. A job `*idle` allocates GPU memory and sleeps and
# must end `terminated (gpu_underutilized)` with its process gone from the GPU; a job `*busy`
# multiplies matrices for 75 s and must end `done`.
#
#   infra/scripts/real-gpu-check.sh OUT_DIR [PYTHON]
#
# Phases (PHASES, default "whole shared"): `whole` runs idle, then busy, each on a whole GPU;
# `shared` runs share-busy and share-idle at once, each on half of one GPU: the idle share must
# be terminated while the busy one, on the same GPU, runs on (its readings are its own
# processes', not the GPU's). PYTHON (default python3) must import gpuflow and torch (torch
# only makes the GPU load). What it prints goes to OUT_DIR too; the exit status is 0 only if
# every check held (about 3 minutes a phase).
set -uo pipefail
out=${1:?usage: real-gpu-check.sh OUT_DIR [PYTHON]}
py=$(command -v "${2:-python3}")
[[ $py = /* ]] || py=$PWD/$py  # the jobs run elsewhere
phases=${PHASES:-whole shared}
mkdir -p "$out"
export GPUFLOW_HOME=${GPUFLOW_HOME:-$(mktemp -d)}
jobs_dir=${JOBS_DIR:-$(mktemp -d)}  # the jobs' scripts
failed=0
check() {  # check NAME COMMAND...: runs it, says whether it held
    if "${@:2}"; then echo "PASS $1"; else echo "FAIL $1"; failed=1; fi
}
gf() { "$py" -m gpuflow "$@"; }

nvidia-smi -L | tee "$out/nvidia-smi.txt"
"$py" - <<'PY' | tee "$out/nvml.json"
import json, time
from gpuflow.agent.gpus import NvmlSampler, inspect_gpus
found = inspect_gpus()
sampler = NvmlSampler()
batch = sampler.sample([gpu.index for gpu in found.gpus], time.time())
sampler.close()
print(json.dumps({"discovery": found.model_dump(mode="json"),
                  "sample": batch.model_dump(mode="json")}, indent=1))
PY
check "NVML finds a GPU and samples it" grep -q '"memory_total_mib"' "$out/nvml.json"

cat >"$jobs_dir/idle.py" <<'PY'
import time
import torch
x = torch.ones(1 << 28, device="cuda")
print("holding", x.numel() * 4 >> 20, "MiB of GPU memory", flush=True)
time.sleep(600)
PY
cat >"$jobs_dir/busy.py" <<'PY'
import time
import torch
x = torch.randn(8192, 8192, device="cuda")
end, products = time.time() + 75, 0
while time.time() < end:
    (x @ x).sum().item()
    products += 1
print(products, "matrix products", flush=True)
PY
job() {  # job NAME SCRIPT GPU: a job file
    cat >"$jobs_dir/$1.yaml" <<YAML
type: task
name: $1
commands: ["echo $1 on GPU \$CUDA_VISIBLE_DEVICES", "$py $jobs_dir/$2.py"]
resources: {gpu: "$3"}
utilization_policy: {min_gpu_utilization: 30, time_window: 1m}
max_duration: 10m
YAML
}
job idle idle 1
job busy busy 1
job share-idle idle 0.5
job share-busy busy 0.5

gf up -d 2>&1 | tee "$out/up.txt"
gf fleet list --json >"$out/fleet.json" 2>&1
cat "$out/fleet.json"
check "the local fleet has a ready GPU host" grep -q '"ready"' "$out/fleet.json"
gf offers -f "$jobs_dir/busy.yaml" 2>&1 | tee "$out/offers.txt"

after() {  # after NAME...: what the jobs left behind
    for name in "$@"; do
        gf metrics "$name" --json >"$out/metrics-$name.json" 2>&1
        gf logs "$name" >"$out/logs-$name.txt" 2>&1
    done
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader \
        >"$out/compute-apps-after-$1.txt"
    check "no process of $* is left on the GPU" test ! -s "$out/compute-apps-after-$1.txt"
}
names=()
if [[ $phases == *whole* ]]; then
    for name in idle busy; do  # one after the other: each has the GPU to itself
        gf apply -y -f "$jobs_dir/$name.yaml" >"$out/apply-$name.txt" 2>&1
        tail -8 "$out/apply-$name.txt"
        after "$name"
    done
    names+=(idle busy)
fi
if [[ $phases == *shared* ]]; then
    # what NVML says per process while both shares run (nvidia-smi's own reading)
    (for _ in $(seq 8); do sleep 10; nvidia-smi pmon -c 1 -s um; done) >"$out/pmon.txt" 2>&1 &
    gf apply -y -f "$jobs_dir/share-busy.yaml" -f "$jobs_dir/share-idle.yaml" \
        >"$out/apply-shared.txt" 2>&1
    tail -12 "$out/apply-shared.txt"
    after share-busy share-idle
    wait
    names+=(share-idle share-busy)
fi
gf ps -a --json >"$out/ps.json" 2>&1
"$py" - "$out" "${names[@]}" <<'PY' | tee "$out/verdict.txt"
import json, sys
jobs = {job["name"]: job for job in json.load(open(f"{sys.argv[1]}/ps.json"))}
for name in sys.argv[2:]:
    job = jobs[name]
    print(name, job["status"], job.get("reason") or "", job.get("hosts"), job.get("gpus"),
          job.get("started_at"), job.get("finished_at"))
PY
for name in "${names[@]}"; do
    if [[ $name == *idle ]]; then
        check "$name ended terminated for gpu_underutilized" \
            grep -q "^$name terminated gpu_underutilized" "$out/verdict.txt"
    else
        check "$name ended done" grep -q "^$name done" "$out/verdict.txt"
    fi
done
gf down -y 2>&1 | tail -3
exit $failed
