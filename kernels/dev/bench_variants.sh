#!/usr/bin/env bash
# Compile-time variants of a shipped kernel through `astra-sglang bench` (the harness RESULTS.md uses:
# its timer, the spec's inputs and references).  From the repository root, on a GPU machine with the
# op's workspace (see kernels/gpu_run.sh):
#
#   bash kernels/dev/bench_variants.sh OP WORKSPACE SHAPES DTYPES NAME="-DFLAG=V ..." [NAME="..."] ...
#   bash kernels/dev/bench_variants.sh silu_and_mul .gpu_ws/jit/silu_and_mul 256x7168 bf16 default= pf0="-DASTRA_PF_MAX=0u"
#
# NAME=@FILE.cu times another source instead (e.g. old=@.kwork/old/silu_and_mul.cu, the last committed kernel).
# SUMMARY_ONLY=1 benches nothing and prints the tables of the JSONs already in $RES (e.g. from an earlier run).
# DEADLINE=SECONDS: a variant that would start later than that is skipped (and said), and the one running then gets at
# most 60 s more, so the tables below always print; an outer `timeout` instead can cut them off with every JSON written.
# BOTH_ORDERS=1 benches the variants again in the reverse order, as NAME.2: a decode row's in-context time moves
# ~9% between runs, so a gain under ~5% shows in both orders or is noise (kernels/NOTES.md, tenth session).
# Each variant is kernel.cu with its flags prepended as #defines; results (JSON per variant) go to
# $RES (default $OUT or ./kernels-variants-out); the last lines are a table, µs per call: chained, and
# in context (producer GEMM -> op -> consumer GEMM) where bench timed it. NEIGHBOURS=astra times them between the GEMMs
# a patched server runs (astra's linear where it takes them), as kernels/gpu_run.sh does; bench's default is cuBLAS on
# both sides, where a 1-token row can read the other way (rope 1 x 32 x 8: 0.90x with cuBLAS, 1.25x with astra's linear,
# 2026-11-29). $BENCH_ARGS go to every bench
# (e.g. "--consumer-width 28672 --producer-k 4096": the model's next GEMM and its o_proj's input). The same, as a
# plot: $RES/OP_variants.png.
set -uo pipefail
[ $# -ge 5 ] || { echo "usage: bash kernels/dev/bench_variants.sh OP WORKSPACE SHAPES DTYPES NAME=\"FLAGS\" ..." >&2; exit 2; }
op=$1 ws=$2 shapes=$3 dtypes=$4; shift 4
[ -f "kernels/$op/kernel.cu" ] || { echo "error: no kernels/$op/kernel.cu (run from the repository root; 'astra-sglang ops' lists the ops)" >&2; exit 2; }
DEADLINE=${DEADLINE:-100000}
[[ $DEADLINE =~ ^[0-9]+$ ]] || { echo "error: DEADLINE takes whole seconds, not '$DEADLINE'" >&2; exit 2; }
NEIGHBOURS=${NEIGHBOURS:-}
case $NEIGHBOURS in ""|cublas|astra) ;; *) echo "error: NEIGHBOURS takes astra or cublas, not '$NEIGHBOURS'" >&2; exit 2 ;; esac
RES=${RES:-${OUT:-./kernels-variants-out}}; mkdir -p "$RES"
src=$(mktemp -d /tmp/astra-variants.XXXX)
[ -n "${SUMMARY_ONLY:-}" ] || source kernels/astra_env.sh
specs=("$@")
T0=$(date +%s)
if [ -n "${BOTH_ORDERS:-}" ]; then
  for ((i = $# - 1; i >= 0; i--)); do s=${specs[$i]}; specs+=("${s%%=*}.2=${s#*=}"); done
fi
if [ -z "${SUMMARY_ONLY:-}" ]; then
  if [ -n "$NEIGHBOURS" ]; then echo "in context: --neighbours $NEIGHBOURS"
  elif [[ " ${BENCH_ARGS:-} " == *" --neighbours "* ]]; then echo "in context: the neighbours BENCH_ARGS names"
  else echo "in context: --neighbours cublas, bench's default (NEIGHBOURS=astra: the GEMMs a patched server runs)"; fi
fi
for spec in "${specs[@]}"; do
  [ -z "${SUMMARY_ONLY:-}" ] || break  # SUMMARY_ONLY=1: print the tables of the JSONs already in $RES, bench nothing
  name=${spec%%=*} flags=${spec#*=}
  f=$src/$name.cu
  if [ "${flags:0:1}" = "@" ]; then
    [ -f "${flags:1}" ] || { echo "error: $name: no such file ${flags:1}" >&2; exit 2; }
    cp "${flags:1}" "$f"
  else
    for d in $flags; do d=${d#-D}; echo "#define ${d%%=*} ${d#*=}"; done >"$f"
    cat "kernels/$op/kernel.cu" >>"$f"
  fi
  el=$(( $(date +%s) - T0 ))
  if [ "$el" -ge "$DEADLINE" ]; then echo "$name: skipped (deadline ${DEADLINE}s)"; continue; fi
  left=$(( DEADLINE + 60 - el )); [ $left -le 300 ] || left=300   # as kernels/gpu_run.sh's DEADLINE
  timeout $left $AS bench "$op" --workspace "$ws" --candidate "$f" --shapes "$shapes" --dtype "$dtypes" --replays 30 \
    ${NEIGHBOURS:+--neighbours $NEIGHBOURS} ${BENCH_ARGS:-} --no-plot --out "$RES/${op}_$name.json" >"$RES/${op}_$name.log" 2>&1
  rc=$?
  # timeout's 124: the deadline cut it; bench writes its JSON row by row, so the rows timed so far still print below
  if [ $rc = 124 ]; then echo "$name: stopped at the deadline (${left}s; the rows timed before it are below)"
  elif [ $rc != 0 ]; then echo "$name: bench failed (rc $rc, see ${op}_$name.log)"; fi
done
python3 - "$RES" "$op" "${specs[@]}" <<'PY'
import json, math, sys
res, op, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = {}
for spec in specs:
    name = spec.split("=", 1)[0]
    try:
        runs[name] = {(r["shape"], r["dtype"]): r for r in json.load(open(f"{res}/{op}_{name}.json"))["rows"]}
    except (OSError, ValueError, KeyError):
        pass
keys = sorted({k for rows in runs.values() for k in rows})
def ok(r, p, c):  # both times measured and positive (bench leaves a hiccup's non-positive marginal unjudged)
    return (r.get(p) or 0) > 0 and (r.get(c) or 0) > 0
def cell(v, w):
    return f"{v:{w}.2f}" if isinstance(v, (int, float)) else " " * (w - 1) + "-"
# the bases bench timed: chained, and in context where it timed that
measured = [b for b in (("chained", "prod_us", "cand_us"), ("in context", "context_base_us", "context_cand_us"))
            if any(r.get(b[2]) is not None for rows in runs.values() for r in rows.values())]
for basis, p, c in measured:
    print(f"# {basis}, µs per call (prod: the production kernel timed in the same run)")
    print(f"{'shape':<14}{'dtype':<6}" + "".join(f"{'prod':>9}{n[:9]:>10}{'x':>6}" for n in runs))
    for k in keys:
        cells = []
        for rows in runs.values():
            r = rows.get(k)
            x = r[p] / r[c] if r and ok(r, p, c) else None
            cells.append(cell(r.get(p), 9) + cell(r.get(c), 10) + cell(x, 6) if r else " " * 25)
        print(f"{k[0]:<14}{k[1]:<6}" + "".join(cells))
    # per variant: geomean and minimum of production over the variant, over the rows every variant has (comparable)
    common = [k for k in keys if all(rows.get(k) and ok(rows[k], p, c) for rows in runs.values())]
    if common:
        print(f"# {basis}, over the {len(common)} rows every variant has: geomean (min) of production over the variant")
        for n, rows in runs.items():
            x = [rows[k][p] / rows[k][c] for k in common]
            print(f"{n:<12}{math.exp(sum(map(math.log, x)) / len(x)):8.3f}x  ({min(x):.3f}x)")
# the plot: production over each variant per row, in context where bench timed it (else chained)
if measured and keys:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit(0)
    name, p, c = measured[-1]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(keys) * max(1, len(runs)) ** 0.5), 3.6))
    w = 0.8 / len(runs)
    base = list(dict.fromkeys(n[:-2] if n.endswith(".2") else n for n in runs))  # a variant and its .2: one colour
    ys_all = []
    for i, (n, rows) in enumerate(sorted(runs.items(), key=lambda kv: base.index(kv[0].removesuffix(".2")))):
        ys = [rows[k][p] / rows[k][c] if rows.get(k) and ok(rows[k], p, c) else float("nan") for k in keys]
        ys_all += [y for y in ys if y == y]
        ax.bar([j + i * w for j in range(len(keys))], ys, w, label=n, color=f"C{base.index(n.removesuffix('.2'))}",
               hatch="//" if n.endswith(".2") else None, edgecolor="white")
    ax.axhline(1.0, color="black", linewidth=0.8)
    if ys_all:
        ax.set_ylim(min(0.9, min(ys_all) - 0.05), max(ys_all) + 0.05)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))], [f"{s} {d}" for s, d in keys], rotation=30, ha="right",
                  fontsize=8)
    ax.set_ylabel(f"production / variant ({name})")
    ax.set_title(f"{op}: compile-time variants (hatched: the reverse order)", fontsize=9)
    ax.legend(fontsize=7, ncol=min(4, len(runs)))
    fig.tight_layout()
    try:
        from astra_sglang.figures import save_figure
    except ImportError:  # astra not importable here: a plain PNG
        save_figure = lambda f, path: f.savefig(path, dpi=110)  # noqa: E731
    save_figure(fig, f"{res}/{op}_variants.png")
    print(f"plot: {res}/{op}_variants.png")
PY
