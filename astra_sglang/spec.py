"""The op-spec contract: what every kernels/<op>/spec.py declares.

A spec is plain data plus a few callables. torch is imported lazily inside the
callables so `extract` (which needs no torch) stays importable everywhere.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from .errors import AstraError

# dtype codes passed through the kernel ABI (`int dtype`).
# int32: integer ops (moe_align) whose data tensor holds ids, not values.
DTYPE_CODES: Dict[str, int] = {"fp32": 0, "fp16": 1, "bf16": 2, "int32": 3}
DTYPE_BYTES: Dict[str, int] = {"fp32": 4, "fp16": 2, "bf16": 2, "int32": 4}


def torch_dtype(name: str):
    import torch

    return {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16, "int32": torch.int32}[name]


@dataclass(frozen=True)
class SourceFile:
    """One production source the variant needs, relative to a source root.

    root: "sglang_jit" (sglang/kernels/jit), "sglang_checkout" (a git checkout's
    root), "flashinfer" (flashinfer's include dir), "tvm_ffi" (tvm-ffi's include
    dir), "dlpack".
    """

    root: str
    path: str


@dataclass(frozen=True)
class Excerpt:
    """A span of a production source copied into a workspace header.

    For sources that cannot be included whole (e.g. sgl-kernel's .cu files pull in
    ATen/torch headers): the text from the first match of `start` up to the end of
    the first match of `end` after it lands in `src/excerpts/<header>`, preceded by
    its provenance. Extract fails loudly when either regex stops matching.
    """

    source: SourceFile
    start: str  # regex (MULTILINE | DOTALL) where the excerpt begins
    end: str  # regex (MULTILINE | DOTALL) whose match ends the excerpt
    header: str  # file name under src/excerpts/
    meaning: str = ""


@dataclass(frozen=True)
class Variant:
    """One production path of an op that extract can pull out."""

    name: str
    description: str
    # Where the op's kernel lives in production (for the manifest and --list).
    provenance: str
    # The production sources the launcher includes; their include closure is copied.
    sources: Tuple[SourceFile, ...]
    # Launcher template file in kernels/<op>/ (format: see extract/launcher.py).
    launcher: str
    # Build-flag profile name in astra_sglang.build.FLAG_PROFILES plus extras.
    flag_profile: str
    extra_flags: Tuple[str, ...] = ()
    # Extra include roots (relative names as in SourceFile.root) the closure needs.
    include_roots: Tuple[str, ...] = ()
    # Source-text facts the launcher relies on: regex -> what it guards. Extract
    # fails loudly if SGLang changed them (e.g. a block size or a signature).
    source_facts: Tuple[Tuple[str, str, str], ...] = ()  # (SourceFile.path, regex, meaning)
    dtypes: Tuple[str, ...] = ("fp16", "bf16")
    # Only usable when this root is available (e.g. sgl-kernel csrc needs a checkout).
    requires_root: Optional[str] = None
    # Extra facts a launcher or the harness needs (e.g. lse base for merge_state).
    # JSON-serializable: it is copied into the workspace manifest.
    attrs: Mapping[str, Any] = field(default_factory=dict)
    # Spans of production sources copied verbatim into src/excerpts/ (see Excerpt).
    excerpts: Tuple[Excerpt, ...] = ()
    # supports(dims, dtype) -> None when this production path handles the shape,
    # else the reason it does not (production routes such shapes elsewhere).
    supports: Optional[Callable[[Tuple[int, ...], str], Optional[str]]] = None
    # An *installed* variant ("module:function"): production is SGLang's installed Python callable (a Triton
    # or torch.compile path extract cannot turn into CUDA), bound to the ABI by the op's adapter. Its
    # workspace holds a manifest (the callable, the source facts checked) and no baseline.cu; check and bench
    # run the callable as the production implementation (harness/installed.py). `sources`/`excerpts` stay
    # empty; `source_facts` name files relative to the sglang package (root "sglang_py").
    callable: str = ""

    @property
    def installed(self) -> bool:
        return bool(self.callable)


@dataclass(frozen=True)
class Shape:
    """A named point of the shape corpus."""

    dims: Tuple[int, ...]
    tags: Tuple[str, ...] = ()  # e.g. ("paper",), ("decode", "llama3-8b"), ("edge",)
    source: str = ""  # which model config it came from

    def key(self) -> str:
        return "x".join(str(d) for d in self.dims)


@dataclass(frozen=True)
class Tolerance:
    """A candidate fails when err > max(k * production_err, floor[dtype]); on a case production does not take, when
    err > alone[dtype] (default: the floor). err is `metric` of harness/numerics.rel_err."""

    k: float = 2.0
    floor: Mapping[str, float] = field(default_factory=lambda: {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1.6e-2})
    # where production does not take a case there is no production error to scale: an op whose production rounds
    # between stages (and whose kernel rounds as it does) errs there as much as production does elsewhere
    alone: Mapping[str, float] = field(default_factory=dict)
    # "err": the largest elementwise relative error; "norm": the normwise error ||c - r|| / ||r||, for an op whose
    # output sums values it first rounds to the model dtype (a fused GEMM's top-k sum): where that sum cancels, one
    # rounding that falls on the other side of a tie in either kernel decides the elementwise maximum
    metric: str = "err"


@dataclass(frozen=True)
class AbiArg:
    """One argument of the ABI entry point, in order (the stream comes last)."""

    name: str
    ctype: str  # "ptr" | "i64" | "f64" | "i32"
    role: str = ""  # "in", "out", "inout" for pointers; "" for scalars


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    dim_names: Tuple[str, ...]
    abi: Tuple[AbiArg, ...]
    variants: Tuple[Variant, ...]
    default_variant: Callable[[Mapping[str, Any]], str]
    dtypes: Tuple[str, ...]
    corpus: Tuple[Shape, ...]
    tolerance: Tolerance
    # make_inputs(dims, dtype_name, generator, dist) -> dict name -> tensor (all ABI pointers)
    make_inputs: Callable[..., Dict[str, Any]]
    # reference(inputs_fp64: dict, dims, params) -> dict of expected outputs (fp64), keyed by
    # the names of "out"/"inout" ABI args. A reference that rounds an intermediate to the model's dtype (a fused
    # op's GEMM output) declares a `model_dtype` keyword: the harness passes the dtype the inputs came in.
    reference: Callable[..., Dict[str, Any]]
    # scalar ABI args (eps, ...) for a shape: dict name -> value
    scalars: Callable[[Tuple[int, ...]], Dict[str, Any]]
    bytes_moved: Callable[[Tuple[int, ...], str], int]
    # value distributions the checker must exercise
    distributions: Tuple[str, ...] = ("normal",)
    # SGLang Python callables this op replaces (module:function), for patch.
    replaces: Tuple[str, ...] = ()
    # edge shapes checked in addition to the corpus
    edge_shapes: Tuple[Shape, ...] = ()
    # Boundary conversions for variants whose ABI convention differs from the op's
    # (e.g. FlashInfer's base-2 lse), applied by the harness outside the timed region:
    # to_variant_abi(tensors, attrs) -> the tensors to pass to the kernel;
    # from_variant_abi(abi_tensors, tensors, attrs) writes the op-convention outputs
    # into `tensors`. None: the variant takes the op's tensors as they are.
    to_variant_abi: Optional[Callable[..., Dict[str, Any]]] = None
    from_variant_abi: Optional[Callable[..., None]] = None
    # Regexes (case-insensitive, searched in the demangled name) of the GPU kernels a profiler
    # shows for this op: SGLang's production kernels and astra's own (namespace astra_<short>::).
    # `astra-sglang profile` attributes matching kernels to this op.
    kernel_symbols: Tuple[str, ...] = ()
    # context_sites(dims) -> the GEMM pairs serving runs a decode row between (sites.Site: producer inner size,
    # consumer width); bench times the row in context between each and takes the mean. None or (): bench's generic
    # pair.
    context_sites: Optional[Callable[[Tuple[int, ...]], Tuple[Any, ...]]] = None
    # A fused op: the ops whose SGLang kernels it replaces in one launch (qknorm_rope: qknorm then rope), or, for
    # an op with several call sites, one such tuple per site (qknorm_rope_store: (qknorm, rope_store) in Qwen3-MoE,
    # (qknorm, rope, kv_store) in dense Qwen3), in the order of `replaces`, with its `variants` in that order too
    # (each site's production). The profile's prediction then reads their kernels in an unpatched step as this op's.
    fuses: Tuple[Any, ...] = ()
    # canonical(outputs, dims) -> the outputs in a canonical form, applied to candidate and production
    # outputs before any comparison, for ops whose production result is only defined up to an order
    # (moe_align: atomics order tokens within an expert). None: outputs are compared as written.
    canonical: Optional[Callable[[Dict[str, Any], Tuple[int, ...]], Dict[str, Any]]] = None
    # The dtypes SGLang hands this op in serving, whatever the model's, where they differ from the model's own
    # (DeepSeek-V3's router gets fp32 logits from dsv3_router_gemm in a bf16 model). bench, validate and
    # kernels/gpu_run.sh default to them, and a bench of another dtype says it is not serving's. (): the model's.
    serving_dtypes: Tuple[str, ...] = ()
    # launcher_only(dims) -> a callable over production's tensors (ABI names) doing the work production's launcher
    # adds that serving does not do at these dims, or None. bench times it alone and takes it out of production's time,
    # as it does an installed callable's copies into the ABI buffers. The q_out ops' launchers copy q into q_out before
    # SGLang's in-place kernels: from 2 tokens on that copy stands for the one SGLang's fa3 backend makes of the strided
    # q, but at 1 token fa3 copies nothing (qkv.launcher_q_copy).
    launcher_only: Optional[Callable[[Tuple[int, ...]], Optional[Callable[[Dict[str, Any]], Any]]]] = None
    # dims that count something optional and may be 0 (moe_grouped_router's n_shared: no fused shared column);
    # every other dim is a size, > 0
    zero_dims: Tuple[str, ...] = ()

    @property
    def symbol(self) -> str:
        return f"astra_{self.name}"

    def dims_problem(self, dims: Sequence[int]) -> Optional[str]:
        """Why `dims` is not a shape of this op (its dim count, sizes > 0, zero_dims >= 0), or None."""
        if len(dims) != len(self.dim_names):
            return f"{len(dims)} dims; {self.name} takes {'x'.join(self.dim_names)}"
        for n, d in zip(self.dim_names, dims):
            if d < (0 if n in self.zero_dims else 1):
                return f"{n} = {d}: {'not >= 0' if n in self.zero_dims else 'not a positive size'}"
        return None

    def fused_member_sets(self) -> Tuple[Tuple[str, ...], ...]:
        """`fuses` as one tuple of member ops per call site (a flat tuple is one site)."""
        if not self.fuses:
            return ()
        if all(isinstance(m, str) for m in self.fuses):
            return (tuple(self.fuses),)
        return tuple(tuple(ms) for ms in self.fuses)

    def fused_sites(self) -> Tuple[Tuple[str, Tuple[str, ...], Optional[str]], ...]:
        """(replaced target, its member ops, its production variant) per call site: the i-th member set and the
        i-th variant belong to the i-th target (qknorm_rope_store: "jit" for Qwen3-MoE, "jit_dense" for dense
        Qwen3); a single member set belongs to every target, any variant (None)."""
        sets = self.fused_member_sets()
        if not sets:
            return ()
        if len(sets) == 1:
            return tuple((t, sets[0], None) for t in self.replaces)
        return tuple((t, ms, v.name) for t, ms, v in zip(self.replaces, sets, self.variants))

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        known = ", ".join(v.name for v in self.variants)
        raise AstraError(f"unknown variant {name!r} for op {self.name} (known: {known})")

    def shapes(self, selector: str = "corpus") -> List[Shape]:
        """Select shapes by tag: 'corpus' (all), 'paper', 'edge', 'decode', 'prefill',
        explicit 'AxB,CxD', or a shapes corpus file (FILE.json: load_shapes_file)."""
        import os

        if selector.endswith(".json") or os.path.isfile(selector):
            return load_shapes_file(selector, self)
        if selector == "corpus":
            return list(self.corpus)
        if selector == "edge":
            return list(self.edge_shapes)
        if selector in ("all",):
            return list(self.corpus) + list(self.edge_shapes)
        if any(ch.isdigit() for ch in selector):
            out = []
            for part in selector.split(","):
                try:
                    dims = tuple(int(x) for x in part.strip().lower().split("x"))
                except ValueError:
                    raise AstraError(f"shape {part!r} is not of the form AxB (e.g. 16x4096)") from None
                if len(dims) != len(self.dim_names):
                    raise AstraError(
                        f"shape {part!r} has {len(dims)} dims; {self.name} takes "
                        f"{'x'.join(self.dim_names)}"
                    )
                out.append(Shape(dims, ("custom",)))
            return out
        sel = [s for s in list(self.corpus) + list(self.edge_shapes) if selector in s.tags]
        if not sel:
            tags = sorted({t for s in self.corpus for t in s.tags})
            raise AstraError(f"no shapes tagged {selector!r} for {self.name} (tags: {', '.join(tags)})")
        return sel

    def ctypes_argtypes(self) -> List[Any]:
        m = {"ptr": ctypes.c_void_p, "i64": ctypes.c_int64, "f64": ctypes.c_double, "i32": ctypes.c_int32}
        return [m[a.ctype] for a in self.abi] + [ctypes.c_void_p]

    def c_signature(self) -> str:
        m = {"ptr": "void*", "i64": "int64_t", "f64": "double", "i32": "int"}
        args = [f"{'const ' if a.role == 'in' else ''}{m[a.ctype]} {a.name}" for a in self.abi]
        return f'extern "C" cudaError_t {self.symbol}({", ".join(args + ["cudaStream_t stream"])})'


def token_sweep(tail: Tuple[int, ...], source: str) -> List[Shape]:
    """(tokens, *tail) for SGLang's decode batches and prefill chunks (astra_sglang.models)."""
    from .models import DECODE_TOKENS, PREFILL_TOKENS

    return [Shape((t, *tail), ("decode",), source) for t in DECODE_TOKENS] + [
        Shape((t, *tail), ("prefill",), source) for t in PREFILL_TOKENS
    ]


def dedupe_shapes(shapes: Sequence[Shape]) -> Tuple[Shape, ...]:
    """Merge shapes with equal dims, uniting their tags and sources."""
    merged: Dict[Tuple[int, ...], Shape] = {}
    for s in shapes:
        if s.dims in merged:
            old = merged[s.dims]
            tags = tuple(dict.fromkeys(old.tags + s.tags))
            src = old.source if s.source in old.source.split(";") else f"{old.source};{s.source}".strip(";")
            merged[s.dims] = Shape(s.dims, tags, src)
        else:
            merged[s.dims] = s
    return tuple(merged.values())


SHAPES_FORMAT = "astra-shapes/1"


def load_shapes_file(path, spec: "OpSpec") -> List[Shape]:
    """The shapes of `spec`'s op in a corpus file (`--shapes FILE`), most used first.

    Format (written by `astra-sglang profile` as shapes.json and by the patch counters,
    astra_sglang.patch.counters.shapes_corpus): JSON
    {"format": "astra-shapes/1", "source": "...", "ops": {"<op>": [{"dims": [tokens, ...],
    "dtype": "bf16", "count": 123, "tags": ["decode"], "source": "llama3-8b bs8"}, ...]}}
    dims are in the op's dim order (spec.dim_names). Equal dims merge (counts add).
    """
    import json
    from pathlib import Path

    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except OSError as e:
        raise AstraError(f"--shapes {path}: cannot read it ({e.strerror})") from None
    except ValueError as e:
        raise AstraError(f"--shapes {path}: not JSON ({e})") from None
    if not isinstance(data, dict) or data.get("format") != SHAPES_FORMAT or not isinstance(data.get("ops"), dict):
        raise AstraError(f"--shapes {path}: not a shapes corpus (want JSON with \"format\": \"{SHAPES_FORMAT}\" "
                         "and \"ops\")")
    rows = data["ops"].get(spec.name)
    if not rows:
        have = ", ".join(sorted(data["ops"])) or "none"
        raise AstraError(f"--shapes {path}: no shapes for {spec.name} (ops in the file: {have})")
    merged: Dict[Tuple[int, ...], List[Any]] = {}
    for i, r in enumerate(rows):
        dims = r.get("dims") if isinstance(r, dict) else None
        ints = isinstance(dims, list) and all(isinstance(d, int) and not isinstance(d, bool) for d in dims)
        why = spec.dims_problem(dims) if ints else "not a list of integers"
        if why:
            raise AstraError(f"--shapes {path}: {spec.name} entry {i}: dims {dims!r} is not "
                             f"{len(spec.dim_names)} positive integers ({'x'.join(spec.dim_names)}): {why}")
        key = tuple(dims)
        tags = tuple(str(t) for t in r.get("tags", ())) + ("file",)
        src = str(r.get("source", data.get("source", p.name)))
        if key in merged:
            merged[key][0] += int(r.get("count", 1))
            merged[key][1] = tuple(dict.fromkeys(merged[key][1] + tags))
        else:
            merged[key] = [int(r.get("count", 1)), tags, src]
    order = sorted(merged.items(), key=lambda kv: -kv[1][0])
    return [Shape(k, v[1], f"{v[2]} (count {v[0]})") for k, v in order]
