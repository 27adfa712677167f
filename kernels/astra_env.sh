# Sourced by the GPU scripts (kernels/gpu_run.sh, kernels/dev/*.sh): makes `astra-sglang` runnable from a
# checkout on a GPU machine without registry access, by a plain editable install (setup.py maps every
# stage folder into astra_sglang; nothing else is needed).
export PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/astra-cache}
python3 -c "import astra_sglang.kernels, astra_sglang.patch" 2>/dev/null || \
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/astra-pip.log 2>&1 || {
    echo "error: pip install -e . failed (see /tmp/astra-pip.log)" >&2; exit 2; }
AS="python3 -m astra_sglang.cli"
