"""Which cases a check runs: shapes (edge, paper, a corpus sample), dtypes, the distribution plan per
shape×dtype, seeds, and the shapes the production variant does not take. Pure: no torch."""
from __future__ import annotations

import hashlib
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import AstraError
from ..spec import OpSpec, Shape

BIG_CASE_ELEMENTS = 64 * 1024 * 1024  # above this, one distribution (plus the re-run) only


def select_shapes(spec: OpSpec, selector: Union[str, Sequence[Shape]] = "check", sample: int = 8) -> List[Shape]:
    """Shapes for a check: 'check' = edge shapes + paper shapes + a sample of the corpus
    (one decode shape per distinct width, spread over sizes, and the largest corpus shape).
    Anything else goes to OpSpec.shapes (corpus, paper, edge, decode, prefill, AxB,...),
    and several selectors may be joined with '+' (e.g. 'paper+edge')."""
    if not isinstance(selector, str):
        return list(selector)
    if "+" in selector:
        out: List[Shape] = []
        for part in selector.split("+"):
            out.extend(select_shapes(spec, part.strip(), sample))
        return dedupe(out)
    if selector != "check":
        return spec.shapes(selector)
    out = list(spec.edge_shapes)
    out += [s for s in spec.corpus if "paper" in s.tags]
    by_width: Dict[Tuple[int, ...], Shape] = {}
    for s in sorted(spec.corpus, key=lambda s: numel(s.dims)):
        by_width.setdefault(s.dims[1:], s)
    widths = sorted(by_width.values(), key=lambda s: numel(s.dims))
    if len(widths) > sample:
        idx = sorted({round(i * (len(widths) - 1) / (sample - 1)) for i in range(sample)})
        widths = [widths[i] for i in idx]
    out += widths
    if spec.corpus and not any("largest" in s.tags for s in spec.edge_shapes):
        out.append(max(spec.corpus, key=lambda s: numel(s.dims)))
    return order_small_first(dedupe(out))


def default_dtypes(available: Sequence[str], serving: Sequence[str] = (),
                   model: Sequence[str] = ("fp16", "bf16")) -> List[str]:
    """The dtypes to run an op at for a model of dtypes `model` (without a dtype asked for: fp16 and bf16; the GPU
    scripts pass their DTYPES): the op's own serving dtypes where it declares them (OpSpec.serving_dtypes, e.g.
    DeepSeek-V3's fp32 router logits), else the model's among those available, else all of them (an integer op
    such as moe_align has only its own)."""
    own = [d for d in serving if d in available]
    return own or [d for d in model if d in available] or list(available)


def not_served(spec: OpSpec, dtypes: Sequence[str]) -> List[str]:
    """The dtypes among `dtypes` that SGLang never hands this op in serving (only where the op declares its own)."""
    return [d for d in dtypes if spec.serving_dtypes and d not in spec.serving_dtypes]


def default_bench_shapes(spec: OpSpec) -> str:
    """bench without --shapes: the paper's shapes where the op has them (the MoE ops have none), else decode."""
    return "paper" if any("paper" in sh.tags for sh in spec.corpus) else "decode"


def numel(dims: Sequence[int]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def dedupe(shapes: Sequence[Shape]) -> List[Shape]:
    seen, out = set(), []
    for s in shapes:
        if s.dims not in seen:
            seen.add(s.dims)
            out.append(s)
    return out


def order_small_first(shapes: Sequence[Shape]) -> List[Shape]:
    """Small shapes first: cheap failures surface before the largest shape's reference is computed."""
    return sorted(shapes, key=lambda s: numel(s.dims))


def workspace_dtypes(spec: OpSpec, manifest: Dict[str, Any], requested: Optional[Sequence[str]] = None) -> List[str]:
    have = [d for d in spec.dtypes if d in manifest.get("dtypes", spec.dtypes)]
    if not requested:
        return have
    bad = [d for d in requested if d not in have]
    if bad:
        raise AstraError(f"dtype {', '.join(bad)} not supported by this {spec.name} workspace (it has: {', '.join(have)})")
    return list(requested)


def case_plan(spec: OpSpec, dims: Sequence[int], dtype: str, big: int = BIG_CASE_ELEMENTS) -> List[Tuple[str, int]]:
    """(distribution, run index) for one shape×dtype: the first distribution twice (the second time in
    the same buffers with fresh inputs), then every other distribution (fresh inputs, same buffers).
    Cases over `big` elements run the first distribution only (twice)."""
    dists = list(spec.distributions) or ["normal"]
    plan = [(dists[0], 0), (dists[0], 1)]
    if numel(dims) <= big:
        plan += [(d, i + 2) for i, d in enumerate(dists[1:])]
    return plan



def case_seed(seed: int, *parts: Any) -> int:
    h = hashlib.sha256(repr((seed,) + parts).encode()).digest()
    return int.from_bytes(h[:7], "little")



def production_skips(spec: OpSpec, variant: str, shapes: Sequence[Shape], dtypes: Sequence[str]) -> Dict[str, str]:
    """Shapes the production variant does not take (Variant.supports), keyed 'AxB dtype'."""
    try:
        v = spec.variant(variant)
    except AstraError:
        return {}
    sup = getattr(v, "supports", None)
    out: Dict[str, str] = {}
    if sup is None:
        return out
    for s in shapes:
        for dt in dtypes:
            why = sup(tuple(s.dims), dt)
            if why:
                out[f"{s.key()} {dt}"] = f"production {variant} does not take it: {why}"
    return out

