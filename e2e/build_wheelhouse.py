#!/usr/bin/env python3
"""Build a trimmed, offline wheelhouse that serves SGLang 0.5.17 on an air-gapped GPU node.

The node already has Python 3.12, torch 2.11.0+cu130, triton, numpy, transformers and the rest
of e2e/wheelhouse/image-packages.txt. This script fetches only what `python -m
sglang.launch_server` needs beyond that for the configuration e2e/ uses (dummy weights,
--skip-tokenizer-init, --attention-backend triton, --sampling-backend pytorch):

  1. roots from e2e/wheelhouse/serve-roots.txt (sglang itself with --no-deps: its full
     Requires-Dist pulls flash-attn-4, cutlass-dsl, tilelang, deep-gemm, ... which that
     configuration never imports),
  2. their dependencies, resolved from each wheel's METADATA for the target (cp312,
     manylinux x86_64), skipping image packages and the names in prune.txt,
  3. sglang-kernel reduced to the sm90 common ops (its FA3 / FlashMLA / InfLLM / sm100
     binaries are ~1.2 GB unpacked and are only loaded lazily),
  4. a lock file (name==version, sha256) and optional chunks <= --chunk-mib for carrying
     the set over a size-limited link; big wheels are split into byte parts.

On the node:  bash e2e/device_install.sh install WHEELDIR SITEDIR
(pip install --no-index --no-deps --target), then PYTHONPATH=SITEDIR.

Usage:
  python e2e/build_wheelhouse.py --out .whl/wheelhouse [--chunk-mib MIB|auto] [--lock e2e/wheelhouse/lock.txt]
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
CFG = HERE / "wheelhouse"

PLATFORMS = ["manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "linux_x86_64", "any"]

# Files of sglang-kernel kept for sm90 (H100/H200). Everything else that is a binary is dropped.
SGL_KERNEL_DROP = re.compile(r"^sgl_kernel/(flash_ops|flashmla_ops|infllm_ops)[^/]*\.so$|^sgl_kernel/sm100/")
# --keep-fa3: keep flash_ops (FA3, SGLang's default attention on Hopper: 1.07 GB unpacked, 148 MiB LZMA-compressed in
# the wheel, about 13 more carry parts), so e2e's servers can run SGLang's own default instead of triton
# (e2e/attention.py)
SGL_KERNEL_DROP_KEEP_FA3 = re.compile(r"^sgl_kernel/(flashmla_ops|infllm_ops)[^/]*\.so$|^sgl_kernel/sm100/")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_list(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            out.append(line)
    return out


def target_env(python_version: str) -> dict:
    return {
        "python_version": python_version, "python_full_version": python_version + ".3",
        "implementation_name": "cpython", "platform_python_implementation": "CPython",
        "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
        "os_name": "posix", "platform_release": "", "platform_version": "", "extra": "",
    }


def wheel_metadata(whl: Path) -> tuple[str, str, list[str]]:
    with zipfile.ZipFile(whl) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode("utf-8", "replace")
    name = re.search(r"^Name: (.+)$", text, re.M).group(1).strip()
    version = re.search(r"^Version: (.+)$", text, re.M).group(1).strip()
    reqs = [m.strip() for m in re.findall(r"^Requires-Dist: (.+)$", text, re.M)]
    return name, version, reqs


def pip_download(req: str, dest: Path, python_version: str) -> Path:
    """Download one wheel (no deps) for the target; return its path."""
    before = {p.name for p in dest.glob("*.whl")}
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp",
           "--abi", "cp" + python_version.replace(".", ""), "--abi", "abi3", "--abi", "none",
           "-d", str(dest), req]
    for p in PLATFORMS:
        cmd[4:4] = ["--platform", p]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        tail = "\n".join(l for l in r.stderr.splitlines() if not l.startswith("WARNING"))[-800:]
        raise RuntimeError(f"pip download {req!r} failed:\n{tail}")
    new = [p for p in dest.glob("*.whl") if p.name not in before]
    if new:
        return new[0]
    # Already there: find it by the name pip printed.
    m = re.search(r"(?:File was already downloaded|Saved) (\S+\.whl)", r.stdout)
    if m:
        return Path(m.group(1))
    raise RuntimeError(f"pip download {req!r}: could not tell which wheel it saved")


def resolve(roots: list[str], image: set[str], prune: set[str], dest: Path, python_version: str,
            lock: dict[str, str] | None, log) -> dict[str, Path]:
    """Breadth-first: roots first (a trailing ' --no-deps' stops recursion), then their deps."""
    from packaging.requirements import Requirement

    env = target_env(python_version)
    chosen: dict[str, Path] = {}
    versions: dict[str, str] = {}
    queue: list[tuple[str, bool, str]] = []
    for r in roots:
        nodeps = r.endswith("--no-deps")
        queue.append((r.replace("--no-deps", "").strip(), not nodeps, "roots"))
    # A root is fetched even when the image has the package: that is how a root overrides an
    # image version SGLang cannot run with (transformers 5.17 vs sglang 0.5.17's pin 5.12.1).
    while queue:
        spec, recurse, why = queue.pop(0)
        req = Requirement(spec)
        key = norm(req.name)
        if (key in image and why != "roots") or key in prune:
            continue
        if key in chosen:
            if req.specifier and versions[key] not in req.specifier:
                log(f"  ! {key}=={versions[key]} does not satisfy {spec} (from {why}); kept")
            continue
        want = f"{req.name}=={lock[key]}" if lock and key in lock else f"{req.name}{req.specifier}"
        whl = pip_download(want, dest, python_version)
        name, version, reqs = wheel_metadata(whl)
        chosen[key], versions[key] = whl, version
        log(f"  + {name}=={version}  ({whl.stat().st_size / 2**20:.1f} MiB, from {why})")
        if not recurse:
            continue
        extras = set(req.extras)
        for dep in reqs:
            d = Requirement(dep)
            if d.marker is not None:
                ok = any(d.marker.evaluate({**env, "extra": e}) for e in (extras or {""}))
                if not ok:
                    continue
            queue.append((f"{d.name}{'[' + ','.join(sorted(d.extras)) + ']' if d.extras else ''}{d.specifier}",
                          True, name))
    return chosen


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def trim_wheel(whl: Path, drop: re.Pattern, log, lzma_over: int = 0) -> Path:
    """Rewrite a wheel without the members matching `drop`; RECORD regenerated. Members larger than `lzma_over`
    bytes (0: none) are stored LZMA-compressed, which pip's zipfile reads: FA3's 1.07 GB library takes 148 MiB so,
    against 326 MiB deflated, half the carry parts."""
    tmp = whl.with_suffix(".trim")
    dropped = 0
    with zipfile.ZipFile(whl) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zout:
        record_name = next(n for n in zin.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in zin.infolist():
            if info.filename == record_name:
                continue
            if drop.search(info.filename):
                dropped += info.file_size
                continue
            data = zin.read(info)
            big = lzma_over and info.file_size > lzma_over
            zout.writestr(info, data, compress_type=zipfile.ZIP_LZMA if big else zipfile.ZIP_DEFLATED)
            lines.append(record_line(info.filename, data))
        lines.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(lines) + "\n")
    before = whl.stat().st_size
    tmp.replace(whl)
    log(f"  trimmed {whl.name}: {before / 2**20:.1f} -> {whl.stat().st_size / 2**20:.1f} MiB "
        f"({dropped / 2**20:.0f} MiB unpacked dropped)")
    return whl


def wheel_has_fa3(whl: Path) -> bool:
    """Whether an sglang-kernel wheel still holds flash_ops (FA3); e2e/attention.py's has_fa3 asks an installed one."""
    with zipfile.ZipFile(whl) as z:
        return any(re.match(r"sgl_kernel/flash_ops[^/]*\.so$", n) for n in z.namelist())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


CARRY_MIB = 64      # what one device call carries: the working tree plus the paths it names
MIN_PART_MIB = 4


def carry_room_mib(repo: Path) -> float:
    """MiB a device call has left for one part beside the checkout at `repo`: 64 MiB less its tracked and
    untracked-not-ignored files, counted as disk usage (the device counts blocks: 48.3 MiB of bytes, 50 MiB on disk,
    plus a 15 MiB part did not fit on 2026-11-27), less 1 MiB."""
    names = subprocess.run(["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    used = 0
    for n in {n for n in names if n}:
        try:
            used += (repo / os.fsdecode(n)).lstat().st_blocks * 512
        except FileNotFoundError:   # deleted but still in the index
            continue
    return CARRY_MIB - used / 2**20 - 1


def make_chunks(wheels: list[Path], out: Path, chunk_bytes: int) -> list[Path]:
    """Pack wheels into out/partNN/ folders of at most chunk_bytes; split wheels that exceed it."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    parts: list[Path] = []
    manifest = {"wheels": {}}

    def new_part() -> Path:
        p = out / f"part{len(parts):02d}"
        p.mkdir()
        parts.append(p)
        return p

    new_part()
    for whl in sorted(wheels, key=lambda p: -p.stat().st_size):
        size = whl.stat().st_size
        manifest["wheels"][whl.name] = {"sha256": sha256(whl), "size": size}
        if size <= chunk_bytes:
            # first-fit into an existing part
            for p in parts:
                psize = sum(f.stat().st_size for f in p.iterdir())
                if psize + size <= chunk_bytes:
                    shutil.copy2(whl, p / whl.name)
                    break
            else:
                p = new_part()
                shutil.copy2(whl, p / whl.name)
            continue
        with open(whl, "rb") as f:
            i = 0
            while True:
                block = f.read(chunk_bytes)
                if not block:
                    break
                p = new_part()
                (p / f"{whl.name}.split{i:02d}").write_bytes(block)
                i += 1
        manifest["wheels"][whl.name]["splits"] = i
    # The manifest travels in every part, so any part can tell what the set should hold.
    for p in parts:
        (p / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return parts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="wheelhouse folder (created)")
    ap.add_argument("--python-version", default="3.12")
    ap.add_argument("--roots", type=Path, default=CFG / "serve-roots.txt")
    ap.add_argument("--image", type=Path, default=CFG / "image-packages.txt",
                    help="packages the node already has (never fetched)")
    ap.add_argument("--prune", type=Path, default=CFG / "prune.txt",
                    help="dependencies SGLang declares but the serve path never imports")
    ap.add_argument("--lock", type=Path, help="pin versions from a lock file written by an earlier run")
    ap.add_argument("--write-lock", type=Path, help="write name==version  sha256 for the set")
    ap.add_argument("--no-trim", action="store_true", help="keep sglang-kernel whole")
    ap.add_argument("--keep-fa3", action="store_true",
                    help="trim sglang-kernel but keep its FA3 library (flash_ops), SGLang's default attention on Hopper")
    ap.add_argument("--chunk-mib", default="0",
                    help="also write OUT/carry/partNN of at most this many MiB; 'auto': what a device call has left "
                    "beside this checkout (64 MiB less its working tree, less 1 MiB)")
    args = ap.parse_args(argv)
    if args.chunk_mib == "auto":
        args.chunk_mib = carry_room_mib(Path.cwd())
        if args.chunk_mib < MIN_PART_MIB:
            print(f"error: this checkout leaves {args.chunk_mib:.1f} MiB of the {CARRY_MIB} MiB a device call carries; "
                  f"parts under {MIN_PART_MIB} MiB are not worth staging", file=sys.stderr)
            return 2
        print(f"--chunk-mib auto: {args.chunk_mib:.1f} MiB parts", flush=True)
    else:
        try:
            args.chunk_mib = float(args.chunk_mib)
        except ValueError:
            print(f"error: --chunk-mib takes a number of MiB or 'auto', not {args.chunk_mib!r}", file=sys.stderr)
            return 2

    log = lambda m: print(m, flush=True)  # noqa: E731
    image = {norm(n) for n in read_list(args.image)}
    prune = {norm(n) for n in read_list(args.prune)} if args.prune.exists() else set()
    lock = None
    if args.lock:
        lock = {}
        for line in read_list(args.lock):
            n, v = line.split()[0].split("==")
            lock[norm(n)] = v
    dl = args.out / "wheels"
    dl.mkdir(parents=True, exist_ok=True)
    log(f"resolving {args.roots.name} for cp{args.python_version.replace('.', '')} manylinux x86_64")
    chosen = resolve(read_list(args.roots), image, prune, dl, args.python_version, lock, log)
    # Drop stale wheels from earlier runs.
    keep = {p.name for p in chosen.values()}
    for p in dl.glob("*.whl"):
        if p.name not in keep:
            p.unlink()
    if not args.no_trim and "sglang-kernel" in chosen:
        # Trimmed in place: a re-run finds the trimmed wheel (pip keeps it) and drops nothing more. So a wheel trimmed
        # without FA3 by an earlier run cannot get it back: --keep-fa3 says so instead of building a set without it.
        kernel_whl = chosen["sglang-kernel"]
        if not args.keep_fa3:
            trim_wheel(kernel_whl, SGL_KERNEL_DROP, log)
        elif wheel_has_fa3(kernel_whl):
            trim_wheel(kernel_whl, SGL_KERNEL_DROP_KEEP_FA3, log, lzma_over=64 * 2**20)
        else:
            print(f"error: {kernel_whl} was trimmed without FA3 by an earlier run: delete it, or build the --keep-fa3 "
                  f"set into another --out", file=sys.stderr)
            return 2
    total = sum(p.stat().st_size for p in chosen.values())
    log(f"{len(chosen)} wheels, {total / 2**20:.1f} MiB in {dl}")
    if args.write_lock:
        lines = [f"{wheel_metadata(p)[0]}=={wheel_metadata(p)[1]}  {p.name}" for _, p in sorted(chosen.items())]
        args.write_lock.write_text("# written by e2e/build_wheelhouse.py; sglang-kernel is trimmed after download\n"
                                   + "\n".join(lines) + "\n")
        log(f"lock -> {args.write_lock}")
    if args.chunk_mib:
        parts = make_chunks(list(chosen.values()), args.out / "carry", int(args.chunk_mib * 2**20))
        for p in parts:
            log(f"  {p}: {sum(f.stat().st_size for f in p.iterdir()) / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
