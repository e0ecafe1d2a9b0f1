#!/usr/bin/env bash
# gpuflow on a machine with a real NVIDIA GPU, end to end: NVML discovery and sampling as the
# agent does them, then the embedded stack with this machine's `local` fleet running two real
# GPU jobs, one after the other, under a 1-minute utilization policy: `idle` allocates GPU
# memory and sleeps and must end `terminated (gpu_underutilized)` with its process gone from
# the GPU; `busy` multiplies matrices on its GPU for 75 s and must end `done`.
#
#   infra/scripts/real-gpu-check.sh OUT_DIR [PYTHON]
#
# PYTHON (default python3) must import gpuflow and torch (torch only makes the GPU load).
# What it prints goes to OUT_DIR too; the exit status is 0 only if every check held.
set -uo pipefail
out=${1:?usage: real-gpu-check.sh OUT_DIR [PYTHON]}
py=$(command -v "${2:-python3}")
[[ $py = /* ]] || py=$PWD/$py  # the jobs run elsewhere
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
cat >"$jobs_dir/idle.yaml" <<YAML
type: task
name: idle
commands: ["$py $jobs_dir/idle.py"]
resources: {gpu: 1}
utilization_policy: {min_gpu_utilization: 30, time_window: 1m}
max_duration: 10m
YAML
cat >"$jobs_dir/busy.yaml" <<YAML
type: task
name: busy
commands: ["echo busy on GPU \$CUDA_VISIBLE_DEVICES", "$py $jobs_dir/busy.py"]
resources: {gpu: 1}
utilization_policy: {min_gpu_utilization: 30, time_window: 1m}
YAML

gf up -d 2>&1 | tee "$out/up.txt"
gf fleet list --json >"$out/fleet.json" 2>&1
cat "$out/fleet.json"
check "the local fleet has a ready GPU host" grep -q '"ready"' "$out/fleet.json"
gf offers -f "$jobs_dir/busy.yaml" 2>&1 | tee "$out/offers.txt"
# One GPU is enough: the jobs run one after the other (NVML's utilization is the whole GPU's,
# so a busy job beside the idle one on the same GPU would keep it alive).
for name in idle busy; do
    gf apply -y -f "$jobs_dir/$name.yaml" >"$out/apply-$name.txt" 2>&1
    tail -15 "$out/apply-$name.txt"
    gf metrics "$name" --json >"$out/metrics-$name.json" 2>&1
    gf logs "$name" >"$out/logs-$name.txt" 2>&1
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader \
        >"$out/compute-apps-after-$name.txt"
    check "no process of $name is left on the GPU" test ! -s "$out/compute-apps-after-$name.txt"
done
gf ps -a --json >"$out/ps.json" 2>&1
"$py" - "$out" <<'PY' | tee "$out/verdict.txt"
import json, sys
jobs = {job["name"]: job for job in json.load(open(f"{sys.argv[1]}/ps.json"))}
for name in ("idle", "busy"):
    job = jobs[name]
    print(name, job["status"], job.get("reason") or "", job.get("hosts"), job.get("gpus"),
          job.get("started_at"), job.get("finished_at"))
PY
check "idle ended terminated for gpu_underutilized" \
    grep -q '^idle terminated gpu_underutilized' "$out/verdict.txt"
check "busy ended done" grep -q '^busy done' "$out/verdict.txt"
gf down -y 2>&1 | tail -3
exit $failed
