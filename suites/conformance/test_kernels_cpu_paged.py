"""The CPU attention paths against the float64 oracle on shapes the other kernel tests do
not draw: MQA (one KV head) and wide groups, head dims 80, 96 and 256, block sizes 7, 32
and 64, lengths 1 and a block size +-1, shuffled block tables padded with -1, and NaN in
every pool slot nothing was written to (a kernel that reads one fails).

Both CPU paths are held to the oracle: "cpp" (the in-place C++ kernel kvbench.kernels.ops
dispatches to, skipped with its reason where it cannot be built) and "gather" (the torch
gather + SDPA fallback, called directly). Bad input is refused before any kernel runs.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.kernels import cpu_paged, ops, torch_ops
from kvbench.kernels import validation as val
from kvbench.reference import oracle
from kvbench.workloads.errors import ShapeError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
PATHS = ("cpp", "gather")


def _need_cpp() -> cpu_paged.KernelStatus:
    """The C++ kernel's status; skips the test where only the fallback runs."""
    status = cpu_paged.status()
    if status.path != "cpp":
        pytest.skip(f"C++ CPU kernel unavailable here: {status.reason}")
    return status


def _pool(lens, hkv, d, bs, dtype, gen):  # type: ignore[no-untyped-def]
    """NaN-filled pool with each sequence in shuffled blocks; tables padded with -1."""
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 2
    k_cache = torch.full((nb, bs, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    perm = torch.randperm(nb, generator=gen).tolist()
    tables = torch.full((len(lens), max(need) + 2), -1, dtype=torch.int32)
    keys, values = [], []
    for b, (n, m) in enumerate(zip(lens, need, strict=True)):
        blocks, perm = perm[:m], perm[m:]
        tables[b, :m] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn((n, hkv, d), generator=gen).to(dtype)
        v = torch.randn((n, hkv, d), generator=gen).to(dtype)
        slots = (torch.tensor(blocks).repeat_interleave(bs) * bs + torch.arange(bs).repeat(m))[:n]
        k_cache.view(-1, hkv, d)[slots] = k
        v_cache.view(-1, hkv, d)[slots] = v
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), keys, values


def _decode(path, q, kc, vc, tables, lens):  # type: ignore[no-untyped-def]
    out = torch.full_like(q, float("nan"))
    if path == "cpp":
        assert ops.paged_decode_attention(q, kc, vc, tables, lens, out=out, backend="torch") is out
    else:
        dims = val.check_decode(q, kc, vc, tables, lens, out)
        scale = val.check_scale(None, q.shape[-1])
        torch_ops.paged_decode_attention(q, kc, vc, tables, lens, scale, out, dims)
    return out


def _prefill(path, q, kc, vc, tables, cu, lens):  # type: ignore[no-untyped-def]
    out = torch.full_like(q, float("nan"))
    if path == "cpp":
        ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, out=out, backend="torch")
    else:
        dims = val.check_prefill(q, kc, vc, tables, cu, lens, out)
        scale = val.check_scale(None, q.shape[-1])
        torch_ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, scale, out, dims)
    return out


@st.composite
def geometries(draw):  # type: ignore[no-untyped-def]
    bs = draw(st.sampled_from([7, 16, 32, 64]))
    length = st.one_of(
        st.sampled_from([1, bs - 1, bs, bs + 1, 2 * bs + 1]).filter(lambda n: n >= 1),
        st.integers(1, 160),
    )
    return {
        "dtype": draw(st.sampled_from(DTYPES)),
        "hkv": draw(st.sampled_from([1, 2, 4])),
        "group": draw(st.sampled_from([1, 2, 4, 8])),
        "d": draw(st.sampled_from([64, 80, 96, 128, 256])),
        "bs": bs,
        "lens": draw(st.lists(length, min_size=1, max_size=3)),
        "seed": draw(st.integers(0, 2**16)),
    }


@pytest.mark.parametrize("path", PATHS)
@given(geo=geometries())
def test_decode_matches_oracle(path: str, geo: dict) -> None:
    if path == "cpp":
        _need_cpp()
    gen = torch.Generator().manual_seed(geo["seed"])
    dt, hkv = geo["dtype"], geo["hkv"]
    kc, vc, tables, lens, keys, values = _pool(geo["lens"], hkv, geo["d"], geo["bs"], dt, gen)
    q = torch.randn((len(geo["lens"]), hkv * geo["group"], geo["d"]), generator=gen).to(dt)
    out = _decode(path, q, kc, vc, tables, lens)
    err = oracle.relative_error(out, oracle.batched_decode_attention(q, keys, values))
    assert err <= oracle.tolerance(dt), f"{path} {geo}: relative error {err}"


@pytest.mark.parametrize("path", PATHS)
@given(geo=geometries(), data=st.data())
def test_prefill_matches_oracle(path: str, geo: dict, data: st.DataObject) -> None:
    if path == "cpp":
        _need_cpp()
    gen = torch.Generator().manual_seed(geo["seed"])
    dt, hkv, lens = geo["dtype"], geo["hkv"], geo["lens"]
    kc, vc, tables, lens_t, keys, values = _pool(lens, hkv, geo["d"], geo["bs"], dt, gen)
    q_lens = [
        data.draw(st.integers(1, min(n, 40)), label=f"q_len[{i}]") for i, n in enumerate(lens)
    ]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hkv * geo["group"], geo["d"]), generator=gen).to(dt)
    out = _prefill(path, q, kc, vc, tables, cu, lens_t)
    ref = torch.cat(
        [
            oracle.extend_attention(q[cu[b] : cu[b + 1]], keys[b], values[b])
            for b in range(len(lens))
        ]
    )
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dt), f"{path} {geo} q_lens={q_lens}: relative error {err}"


@given(
    lens=st.lists(st.integers(1, 300), min_size=1, max_size=3),
    parts=st.integers(1, 5),
    heads=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
)
def test_decode_task_splits_agree(lens: list[int], parts: int, heads: int, dtype) -> None:  # type: ignore[no-untyped-def]
    """Every (KV partition, heads per task) split merges to the oracle's answer, including
    partitions past a short sequence's end."""
    _need_cpp()
    gen = torch.Generator().manual_seed(sum(lens) + parts)
    kc, vc, tables, lens_t, keys, values = _pool(lens, 4, 64, 16, dtype, gen)
    q = torch.randn((len(lens), 8, 64), generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    mod = cpu_paged._module()
    assert mod is not None  # _need_cpp() skipped the test where it is absent
    mod.paged_decode(q, kc, vc, tables, lens_t, 0.125, out, max(lens), parts, heads)
    err = oracle.relative_error(out, oracle.batched_decode_attention(q, keys, values))
    assert err <= oracle.tolerance(dtype), f"parts={parts} heads={heads}: {err}"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("parts", [1, 3])
def test_bf16_pair_order_matches_oracle(d: int, parts: int) -> None:
    """bf16 decode at a compile-time head dim reads K/V as 32-bit pairs and computes in a
    permuted element order (even elements of each group first); the output must come back
    in the caller's order, with one partition and with partitions merged."""
    _need_cpp()
    gen = torch.Generator().manual_seed(d + parts)
    lens = [37, 100]
    kc, vc, tables, lens_t, keys, values = _pool(lens, 2, d, 16, torch.bfloat16, gen)
    q = torch.randn((len(lens), 8, d), generator=gen).to(torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    mod = cpu_paged._module()
    assert mod is not None
    mod.paged_decode(q, kc, vc, tables, lens_t, d**-0.5, out, max(lens), parts, 2)
    err = oracle.relative_error(out, oracle.batched_decode_attention(q, keys, values))
    assert err <= oracle.tolerance(torch.bfloat16), f"d={d} parts={parts}: {err}"


@given(
    lens=st.lists(st.integers(1, 130), min_size=1, max_size=3),
    tile=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    group=st.sampled_from([1, 3, 4]),
)
def test_prefill_tiles_agree(lens: list[int], tile: int, dtype, group: int) -> None:  # type: ignore[no-untyped-def]
    """Every query tile (tokens per task: rows that fill no whole panel, tiles that end
    mid-chunk, chunks past a tile's first position) gives the oracle's answer."""
    _need_cpp()
    gen = torch.Generator().manual_seed(sum(lens) + tile)
    kc, vc, tables, lens_t, keys, values = _pool(lens, 2, 64, 16, dtype, gen)
    q_lens = [max(1, n // 2 + 1) for n in lens]
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), 2 * group, 64), generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    mod = cpu_paged._module()
    assert mod is not None  # _need_cpp() skipped the test where it is absent
    mod.paged_prefill(q, kc, vc, tables, cu, lens_t, 0.125, out, tile)
    ref = torch.cat(
        [
            oracle.extend_attention(q[cu[b] : cu[b + 1]], keys[b], values[b], scale=0.125)
            for b in range(len(lens))
        ]
    )
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), f"tile={tile} q_lens={q_lens}: {err}"


def test_prefill_tile_fills_the_threads() -> None:
    assert cpu_paged.prefill_tile(4, 256, 8, 2) * 4 == cpu_paged.PREFILL_ROWS  # long prefill
    assert cpu_paged.prefill_tile(1, 256, 8, 2) == cpu_paged.PREFILL_ROWS  # MHA: more tokens
    tile = cpu_paged.prefill_tile(4, 8, 1, 4)  # one KV head, 8 new tokens, 4 threads
    assert -(-8 // tile) >= 8 or tile == 1


def test_fma_probe_counts_its_flops() -> None:
    """FLOPs = threads x rounds x 12 chains x vector width x 2, linear in the rounds."""
    status = _need_cpp()
    threads = torch.get_num_threads()
    one = cpu_paged.fma_probe(1)
    assert one == threads * 12 * status.vector_width * 2
    assert cpu_paged.fma_probe(1000) == 1000 * one


def test_task_split_gives_every_thread_work() -> None:
    assert cpu_paged.task_split(8, 8, 256, 2) == (256, 8)  # one task per sequence
    per_part, heads = cpu_paged.task_split(1, 1, 256, 8)  # MQA, one sequence: partitions
    assert heads == 1 and -(-256 // per_part) >= 8
    per_part, heads = cpu_paged.task_split(1, 8, 4, 4)
    assert per_part >= 4 and heads == 1


def test_strided_query_and_int64_tables() -> None:
    """A query slice of a fused QKV tensor and int64 tables take the C++ path unchanged."""
    _need_cpp()
    gen = torch.Generator().manual_seed(3)
    kc, vc, tables, lens, keys, values = _pool([5, 33], 2, 64, 16, torch.float32, gen)
    fused = torch.randn((2, 12, 64), generator=gen)
    q = fused[:, 2:10]  # strides (768, 64, 1)
    out = _decode("cpp", q, kc, vc, tables.to(torch.int64), lens)
    err = oracle.relative_error(out, oracle.batched_decode_attention(q, keys, values))
    assert err <= oracle.tolerance(torch.float32)


# ---------------------------------------------------------------- bad input


def test_table_outside_pool_refused_even_unchecked() -> None:
    """With check_indices=False the C++ path still refuses a table entry outside the pool
    (IndexRangeError naming it) and writes nothing."""
    _need_cpp()
    gen = torch.Generator().manual_seed(5)
    kc, vc, tables, lens, _, _ = _pool([20, 40], 2, 64, 16, torch.float32, gen)
    tables[1, 2] = kc.shape[0] + 7
    q = torch.randn((2, 4, 64), generator=gen)
    out = torch.full_like(q, float("nan"))
    with pytest.raises(val.IndexRangeError, match=rf"block_tables\[1, 2\] = {kc.shape[0] + 7}"):
        ops.paged_decode_attention(
            q, kc, vc, tables, lens, out=out, backend="torch", check_indices=False
        )
    assert torch.isnan(out).all()
    cu = torch.tensor([0, 1, 3], dtype=torch.int32)
    qp = torch.randn((3, 4, 64), generator=gen)
    with pytest.raises(val.IndexRangeError, match="outside the pool"):
        ops.paged_prefill_attention(
            qp, kc, vc, tables, cu, lens, backend="torch", check_indices=False
        )


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("change", "match"),
    [
        ("query_dtype", "query dtype torch.float16 differs"),
        ("head_dim", "query head_dim 32 differs"),
        ("heads", "num_q_heads=3 is not a positive multiple"),
        ("table_rows", "query batch 2 differs from block_tables rows 3"),
        ("table_entry", "block_tables holds block"),
    ],
)
def test_bad_input_refused_before_any_kernel(path: str, change: str, match: str) -> None:
    """Mismatched dtypes, shapes or a table outside the pool raise a ShapeError subclass
    naming the value, with the output untouched, on both CPU paths."""
    if path == "cpp":
        _need_cpp()
    gen = torch.Generator().manual_seed(7)
    kc, vc, tables, lens, _, _ = _pool([20, 40], 2, 64, 16, torch.float32, gen)
    q = torch.randn((2, 4, 64), generator=gen)
    if change == "query_dtype":
        q = q.half()
    elif change == "head_dim":
        q = q[..., :32]
    elif change == "heads":
        q = q[:, :3]
    elif change == "table_rows":
        tables = torch.cat([tables, tables[:1]])
    else:
        tables[0, 0] = -3
    out = torch.full_like(q, float("nan"))
    with pytest.raises(ShapeError, match=match):
        _decode_into(path, q, kc, vc, tables, lens, out)
    assert torch.isnan(out).all()


def _decode_into(path, q, kc, vc, tables, lens, out):  # type: ignore[no-untyped-def]
    if path == "cpp":
        return ops.paged_decode_attention(q, kc, vc, tables, lens, out=out, backend="torch")
    dims = val.check_decode(q, kc, vc, tables, lens, out)
    return torch_ops.paged_decode_attention(q, kc, vc, tables, lens, 0.125, out, dims)


def test_fallback_when_disabled() -> None:
    """KVBENCH_CPU_KERNEL=torch: status names the gather path and ops still answer."""
    code = (
        "import torch; from kvbench.kernels import cpu_paged, ops\n"
        "s = cpu_paged.status(); assert s.path == 'torch' and 'KVBENCH_CPU_KERNEL' in s.reason\n"
        "kc = torch.randn(4, 16, 1, 64); t = torch.tensor([[2, 0]], dtype=torch.int32)\n"
        "out = ops.paged_decode_attention(torch.randn(1, 2, 64), kc, kc, t,"
        " torch.tensor([20], dtype=torch.int32), backend='torch')\n"
        "assert torch.isfinite(out).all(); print('ok')\n"
    )
    env = {**os.environ, "KVBENCH_CPU_KERNEL": "torch"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert res.returncode == 0 and "ok" in res.stdout, res.stderr[-2000:]


_STATUS = (
    "import json; from kvbench.kernels import cpu_paged; s = cpu_paged.status()\n"
    "print(json.dumps({'path': s.path, 'reason': s.reason, 'built': s.built}))\n"
)


def _status_in_child(env: dict[str, str], timeout: float = 600) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", _STATUS], env={**os.environ, **env},
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return {**json.loads(res.stdout.strip().splitlines()[-1]), "stderr": res.stderr}


def test_stale_build_lock_is_removed(tmp_path: Path) -> None:
    """A `lock` file left by a process killed inside torch's loader does not hang the next
    one: it is removed with a warning and the cached kernel loads (not rebuilt)."""
    here = Path(_need_cpp().build_dir)
    copy = tmp_path / here.name
    shutil.copytree(here, copy, ignore=shutil.ignore_patterns("lock", "kvbench.lock"))
    (copy / "lock").touch()
    # a loaded host (CI beside other work) can take minutes to start torch; the assertion
    # below, not the timeout, is what catches a rebuild
    got = _status_in_child({"KVBENCH_CPU_EXT_DIR": str(tmp_path)}, timeout=600)
    assert got["path"] == "cpp" and not got["built"], got
    assert not (copy / "lock").exists()
    assert "stale build lock" in got["stderr"]


def test_build_lock_held_elsewhere_times_out_to_fallback(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Another process's build that outlasts the timeout: status falls back and says why."""
    _need_cpp()
    monkeypatch.setenv("KVBENCH_CPU_EXT_DIR", str(tmp_path))
    folder = cpu_paged._build_dir()
    folder.mkdir(parents=True)
    with open(folder / "kvbench.lock", "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        got = _status_in_child(
            {"KVBENCH_CPU_EXT_DIR": str(tmp_path), "KVBENCH_CPU_EXT_LOCK_TIMEOUT": "0.5"}
        )
    assert got["path"] == "torch", got
    assert "build lock" in got["reason"] and "0.5 s" in got["reason"], got
    assert not any(folder.glob("*.so"))


def test_build_folder_is_keyed_by_everything_that_changes_the_binary(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A different torch build, compiler, flag or source gets its own folder (two
    environments over different torch builds never rebuild one folder in turn); the same
    inputs get the same folder."""
    assert cpu_paged._build_dir() == cpu_paged._build_dir()
    names = {name for name, _ in cpu_paged.build_key_parts()}
    assert {"torch version", "torch build", "compiler", "flags", "cpu", "python"} <= names
    assert any(n.startswith("source paged_attn") for n in names)
    base = cpu_paged._build_dir()
    real = cpu_paged.build_key_parts
    for changed in ("torch build", "compiler", "flags", "source paged_attn.cpp"):

        def parts(changed: str = changed) -> list[tuple[str, bytes]]:
            return [(n, v + b"x" if n == changed else v) for n, v in real()]

        monkeypatch.setattr(cpu_paged, "build_key_parts", parts)
        assert cpu_paged._build_dir() != base, changed
    monkeypatch.setattr(cpu_paged, "build_key_parts", real)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    assert cpu_paged._build_dir() != base  # another compiler (even a missing one)


def test_torch_build_key_is_the_wheels_files_not_the_venv(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Two venvs that installed one torch wheel share a build (their RECORDs differ only
    in the venv's own scripts); a changed file under torch/ is another build; an install
    without a RECORD falls back to its folder."""
    import importlib.metadata as metadata

    lib = "torch/lib/libtorch_cpu.so,sha256=AAAA,123"
    records = {
        "venv a": f"{lib}\ntorch/__init__.py,sha256=BBBB,9\n../../../bin/torchrun,sha256=CCCC,1\n",
        "venv b": f"torch/__init__.py,sha256=BBBB,9\n{lib}\n../../../bin/torchrun,sha256=DDDD,1\n",
        "rebuilt": "torch/lib/libtorch_cpu.so,sha256=EEEE,123\ntorch/__init__.py,sha256=BBBB,9\n",
        "no record": "",
    }

    class Dist:
        def __init__(self, text: str) -> None:
            self.text = text

        def read_text(self, name: str) -> str | None:
            assert name == "RECORD"
            return self.text or None

    keys = {}
    for name, text in records.items():
        monkeypatch.setattr(metadata, "distribution", lambda _n, text=text: Dist(text))
        keys[name] = cpu_paged._torch_build()
    assert keys["venv a"] == keys["venv b"]
    assert keys["rebuilt"] != keys["venv a"]
    assert keys["no record"].startswith(b"install ") and keys["venv a"].startswith(b"record ")
