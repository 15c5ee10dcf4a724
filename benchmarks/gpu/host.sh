#!/bin/bash
# On the GPU host, from the checkout's root: take the carried site and models, then run one
# phase of benchmarks/gpu/matrix.py with its output under OUTDIR.
#
#   bash benchmarks/gpu/host.sh STAGE_DIR OUTDIR PHASE [matrix.py arguments...]
#
# The phase writes under /root/results/PHASE-<n>; OUTDIR gets it as one PHASE-<n>.tgz plus
# the run's printed log (the device returns few files).
# STAGE_DIR holds what ../shared/tools/gpu/stage.sh wrote (site.tar.zst.part* gathered by
# earlier calls under /root/stage, unpack.sh, zstd/) plus models.tar.zst
# (benchmarks/gpu/models.py's directories). Model paths in the arguments may be written
# M/<name>: M is where the models were unpacked.
set -uo pipefail
stage=${1:?stage dir}; dest=${2:?output dir}; phase=${3:?phase}; shift 3
# A previous call's servers may still run (a call cut at its deadline leaves its phase
# going, whose clean-up would then stop this call's Ray): none may share the card with this
# phase. The bracketed patterns keep pkill from matching this script's own command line.
# KEEP_FLEET=1 spares a fleet that `pack --keep` left for this call to measure further (only
# the previous phase's driver goes).
pats=('[v]llm.entrypoints' '[r]ay::' '[r]aylet' '[g]cs_server' '[E]ngineCore' '[V]LLM::' '[m]atrix.py')
[ "${KEEP_FLEET:-0}" = 1 ] && pats=('[m]atrix.py')
for pat in "${pats[@]}"; do
  pkill -9 -f "$pat" 2>/dev/null
done
sleep 2
n=1; while [ -e "/root/results/$phase-$n" ]; do n=$((n + 1)); done
tag=$phase-$n; out=/root/results/$tag
mkdir -p /root/stage "$out" "$dest"
cp -n "$stage"/site.tar.zst.part* /root/stage/ 2>/dev/null
bash "$stage/unpack.sh" /root/stage /tmp/site || exit 1
# wheels the staged site lacks, carried in .whl/ (pycountry: mistral-common's language codes)
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl 2>&1 | grep -v "already exists" || true
fi
export PATH="$PWD/$stage/zstd:$PATH" LD_LIBRARY_PATH="$PWD/$stage/zstd${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -d /root/models ]; then
  mkdir -p /root/models && zstd -dc "$stage/models.tar.zst" | tar x -C /root/models --strip-components=1
fi
export PYTHONPATH="$PWD/src:/tmp/site" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# the site's console scripts are not on PATH: Ray starts its daemons by module
args=()
for a in "$@"; do args+=("${a//M\//\/root\/models\/}"); done
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version --format=csv,noheader
grep -H MemTotal /proc/meminfo /sys/devices/system/node/node*/meminfo; cat /sys/fs/cgroup/memory.max 2>/dev/null
# the CPUs this phase may use (a container's quota throttles every process in it at once),
# what else runs, and the card's clocks and throttle reasons before any load
echo "nproc $(nproc); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null); loadavg $(cat /proc/loadavg)"
ps -eo pid,ni,pcpu,etime,args --sort=-pcpu | head -8 | cut -c1-150
nvidia-smi -q -d PERFORMANCE,CLOCK 2>/dev/null | grep -v "^$" | head -40
python3 -c "from fleetserve.host import probe; print(probe())"
python3 benchmarks/gpu/matrix.py "$phase" --out "$out" "${args[@]}" 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
# what the engines logged about memory, for the KV-cache comparison
grep -rh -E "KV cache|memory profiling|Model loading took|non-torch|CUDA graph" /tmp/ray/session_*/logs "$out"/*.log 2>/dev/null \
  | sort -u | tail -200 > "$out/memory-lines.txt"
cp /tmp/ray/session_latest/logs/serve/*.log "$out/" 2>/dev/null
tar czf "$dest/$tag.tgz" -C /root/results "$tag" && cp "$out/run.log" "$dest/$tag.log"
exit $rc
