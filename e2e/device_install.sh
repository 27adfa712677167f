#!/usr/bin/env bash
# Install the offline wheelhouse from e2e/build_wheelhouse.py on an air-gapped GPU node.
#
#   bash e2e/device_install.sh stage PARTDIR [WHEELDIR]    copy one carried part (from --chunk-mib)
#   bash e2e/device_install.sh install [WHEELDIR] [SITE]   join split wheels, check sha256 against
#                                                           MANIFEST.json, pip install --no-index
#                                                           --no-deps --target SITE, then astra-sglang
#   bash e2e/device_install.sh astra [SITE]                astra-sglang alone again, from this repo: servers
#                                                           and step workers import astra from SITE, so an
#                                                           edit made after `install` is not what they run
#                                                           until this
#   bash e2e/device_install.sh ensure [WHEELDIR] [SITE]    what a device script starts with: `install` unless
#                                                           SITE already holds SGLang (a warm machine), then
#                                                           `astra`; install's log goes to SITE.log
# Defaults: WHEELDIR=/tmp/e2e-wheels SITE=/tmp/e2e-site. Afterwards: export PYTHONPATH=SITE.
set -euo pipefail
cmd=${1:?stage, install, astra or ensure}
PY=${PYTHON:-python3}
repo=$(cd "$(dirname "$0")/.." && pwd)
install_astra() {  # astra-sglang itself (registers the sglang plugin entry point), from the repo we run in
    "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-cache-dir --disable-pip-version-check \
        --target "$1" --upgrade "$repo" && echo "astra-sglang installed into $1 from $repo"
}
if [ "$cmd" = astra ]; then
    site=${2:-/tmp/e2e-site}
    [ -d "$site" ] || { echo "error: $site does not exist: run 'install' first" >&2; exit 2; }
    install_astra "$site"
    exit 0
fi
if [ "$cmd" = ensure ]; then
    src=${2:-/tmp/e2e-wheels}; site=${3:-/tmp/e2e-site}
    if [ ! -d "$site/sglang" ]; then
        timeout 240 bash "$0" install "$src" "$site" > "$site.log" 2>&1 \
            || { tail -20 "$site.log"
                 echo "error: installing the wheelhouse into $site failed (log: $site.log)" >&2; exit 1; }
    fi
    install_astra "$site"
    exit 0
fi
if [ "$cmd" = stage ]; then
    part=${2:?PARTDIR}; dst=${3:-/tmp/e2e-wheels}
    mkdir -p "$dst"
    cp -f "$part"/* "$dst"/
    echo "staged $(ls "$part" | wc -l) files from $part into $dst ($(du -sh "$dst" | cut -f1) there now)"
    exit 0
fi
[ "$cmd" = install ] || { echo "error: unknown command $cmd (stage, install, astra or ensure)" >&2; exit 2; }
src=${2:-/tmp/e2e-wheels}; site=${3:-/tmp/e2e-site}
cd "$src"
"$PY" - <<'EOF'
import hashlib, json, pathlib, sys
m = json.loads(pathlib.Path("MANIFEST.json").read_text())["wheels"]
missing = []
for name, info in m.items():
    p = pathlib.Path(name)
    n = info.get("splits")
    if n and not p.exists():
        parts = [pathlib.Path(f"{name}.split{i:02d}") for i in range(n)]
        if not all(q.exists() for q in parts):
            missing.append(name); continue
        with open(p, "wb") as f:
            for q in parts:
                f.write(q.read_bytes())
    if not p.exists():
        missing.append(name); continue
    h = hashlib.sha256(p.read_bytes()).hexdigest()
    if h != info["sha256"]:
        sys.exit(f"{name}: sha256 mismatch")
if missing:
    sys.exit(f"missing from the wheelhouse (stage every part first): {', '.join(missing)}")
print(f"{len(m)} wheels present, sha256 verified")
EOF
t0=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --disable-pip-version-check \
    --target "$site" ./*.whl
echo "installed into $site in $(( $(date +%s) - t0 ))s ($(du -sh "$site" | cut -f1))"
install_astra "$site"
