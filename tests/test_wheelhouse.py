"""e2e/build_wheelhouse.py's carry parts (CPU): every part fits the chunk size, a wheel larger than it is split and
joins back byte for byte, and every part carries the manifest (the device call's 64 MiB limit is why parts exist)."""
import hashlib
import importlib.util
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _wheelhouse():
    spec = importlib.util.spec_from_file_location("build_wheelhouse", HERE.parent / "e2e" / "build_wheelhouse.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_make_chunks_fits_splits_and_rejoins(tmp_path):
    wh = _wheelhouse()
    src = tmp_path / "wheels"
    src.mkdir()
    sizes = {"big-1.0-py3-none-any.whl": 2500, "a-1.0-py3-none-any.whl": 600, "b-1.0-py3-none-any.whl": 500,
             "c-1.0-py3-none-any.whl": 300}
    for i, (name, n) in enumerate(sizes.items()):
        (src / name).write_bytes(bytes((i + k) % 251 for k in range(n)))
    parts = wh.make_chunks(sorted(src.iterdir()), tmp_path / "carry", 1000)
    for p in parts:
        assert sum(f.stat().st_size for f in p.iterdir() if f.name != "MANIFEST.json") <= 1000
    man = json.loads((parts[0] / "MANIFEST.json").read_text())["wheels"]
    assert all((p / "MANIFEST.json").read_text() == (parts[0] / "MANIFEST.json").read_text() for p in parts)
    assert man["big-1.0-py3-none-any.whl"]["splits"] == 3 and "splits" not in man["a-1.0-py3-none-any.whl"]
    pieces = sorted(f for p in parts for f in p.glob("big-1.0-py3-none-any.whl.split*"))
    joined = b"".join(f.read_bytes() for f in pieces)
    assert hashlib.sha256(joined).hexdigest() == man["big-1.0-py3-none-any.whl"]["sha256"]
    small = {f.name for p in parts for f in p.glob("*.whl")}
    assert small == {"a-1.0-py3-none-any.whl", "b-1.0-py3-none-any.whl", "c-1.0-py3-none-any.whl"}


def test_auto_part_size_is_what_the_checkout_leaves(tmp_path, capsys):
    """--chunk-mib auto: 64 MiB less the working tree the device carries (tracked and untracked-not-ignored files,
    on disk, not ignored ones), less 1 MiB; a bad value is one error line and exit 2."""
    import subprocess

    wh = _wheelhouse()
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / ".gitignore").write_text("big-ignored\n")
    (repo / "tracked").write_bytes(b"x" * (3 * 2**20))
    subprocess.run(["git", "-C", str(repo), "add", "tracked", ".gitignore"], check=True)
    (repo / "untracked").write_bytes(b"y" * 2**20)
    (repo / "big-ignored").write_bytes(b"z" * (20 * 2**20))
    room = wh.carry_room_mib(repo)
    assert 64 - 4 - 1 - 0.1 < room <= 64 - 4 - 1   # 4 MiB carried (a few blocks over), the ignored 20 MiB not
    assert wh.main(["--out", str(tmp_path / "o"), "--chunk-mib", "lots"]) == 2
    assert capsys.readouterr().err.startswith("error: --chunk-mib takes a number of MiB or 'auto'")


def test_trim_drops_sgl_kernel_s_lazy_binaries_and_keep_fa3_keeps_flash_ops(tmp_path):
    """The trimmed sglang-kernel keeps the sm90 common ops; --keep-fa3 also keeps flash_ops (SGLang's default attention
    on Hopper); RECORD lists exactly the members kept, with their hashes."""
    import zipfile

    wh = _wheelhouse()
    members = ["sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/flash_ops.abi3.so",
               "sgl_kernel/flashmla_ops.abi3.so", "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",
               "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/flash_attn.py"]
    for drop, kept in ((wh.SGL_KERNEL_DROP, {0, 1, 6}), (wh.SGL_KERNEL_DROP_KEEP_FA3, {0, 1, 2, 6})):
        whl = tmp_path / f"k{len(kept)}" / "sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl"
        whl.parent.mkdir()
        with zipfile.ZipFile(whl, "w") as z:
            for i, m in enumerate(members):
                z.writestr(m, f"member {i}")
            z.writestr("sglang_kernel-0.4.5.dist-info/RECORD", "stale\n")
        wh.trim_wheel(whl, drop, lambda m: None, lzma_over=8)   # "member 2" is 8 bytes: stays deflated
        with zipfile.ZipFile(whl) as z:
            names = set(z.namelist())
            assert {i.compress_type for i in z.infolist()} == {zipfile.ZIP_DEFLATED}
            assert all(z.read(members[i]) == f"member {i}".encode() for i in kept)
            record = z.read("sglang_kernel-0.4.5.dist-info/RECORD").decode().splitlines()
        assert names == {members[i] for i in kept} | {"sglang_kernel-0.4.5.dist-info/RECORD"}
        assert sorted(line.split(",")[0] for line in record if not line.endswith(",,")) == sorted(
            members[i] for i in kept)
        # a wheel trimmed without FA3 cannot give it back: --keep-fa3 refuses it (trimming is in place)
        assert wh.wheel_has_fa3(whl) is (2 in kept)


def test_a_big_member_is_stored_lzma_and_pip_installs_it(tmp_path):
    """--keep-fa3 stores flash_ops LZMA-compressed (half the bytes of deflate for that library); pip (zipfile)
    installs such a wheel byte for byte."""
    import subprocess
    import sys
    import zipfile

    wh = _wheelhouse()
    whl = tmp_path / "sgl_kernel_fake-0.1-py3-none-any.whl"
    blob = bytes(range(256)) * 4096   # 1 MiB
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("sgl_kernel_fake/__init__.py", "")
        z.writestr("sgl_kernel_fake/flash_ops.abi3.so", blob)
        z.writestr("sgl_kernel_fake-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: sgl-kernel-fake\nVersion: 0.1\n")
        z.writestr("sgl_kernel_fake-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr("sgl_kernel_fake-0.1.dist-info/RECORD", "")
    wh.trim_wheel(whl, wh.SGL_KERNEL_DROP_KEEP_FA3, lambda m: None, lzma_over=2**19)
    with zipfile.ZipFile(whl) as z:
        assert z.getinfo("sgl_kernel_fake/flash_ops.abi3.so").compress_type == zipfile.ZIP_LZMA
        assert z.getinfo("sgl_kernel_fake/__init__.py").compress_type == zipfile.ZIP_DEFLATED
    site = tmp_path / "site"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site),
                        str(whl)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (site / "sgl_kernel_fake" / "flash_ops.abi3.so").read_bytes() == blob
