# Sourced by the kernels/*.sh GPU scripts: makes `python3 -m astra_sglang.cli` importable on a GPU machine
# without registry access (an editable install when pip can, else a package farm over the checkout).
export PYTHONUNBUFFERED=1 ASTRA_CACHE_DIR=${ASTRA_CACHE_DIR:-/tmp/astra-cache}
python3 -c "import astra_sglang.kernels" 2>/dev/null || \
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/astra-pip.log 2>&1 || true
if ! python3 -c "import astra_sglang.kernels" 2>/dev/null; then
  F=/tmp/astra_pkg/astra_sglang; mkdir -p $F
  for f in astra_sglang/*; do ln -sfn "$PWD/$f" $F/; done
  for d in extract kernels patch; do ln -sfn "$PWD/$d" "$F/$d"; done
  export PYTHONPATH=/tmp/astra_pkg${PYTHONPATH:+:$PYTHONPATH}
fi
AS="python3 -m astra_sglang.cli"
