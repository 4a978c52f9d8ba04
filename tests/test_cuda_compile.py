"""CI without a GPU still compiles every .cu a CUDA backend loads, for sm_90, with the real nvcc."""

from __future__ import annotations

import pytest

from harness.tools import cuda_build

pytestmark = [pytest.mark.skipif(cuda_build.nvcc_path() is None, reason="nvcc is not installed here"),
              pytest.mark.xdist_group("compile-cuda")]  # one xdist worker: its builds once


def _xent_sources():
    # the list the loader compiles, not a copy of it
    from harness.backends.cuda.softmax_xent import loader
    return loader.CU_SOURCES


def test_softmax_xent_sources_exist() -> None:
    srcs = _xent_sources()
    assert srcs and all(p.is_file() and p.suffix == ".cu" for p in srcs)


def test_softmax_xent_compiles_sm90() -> None:
    cuda_build.compile_only(_xent_sources(), arch="sm_90")


def test_mhc_pre_compiles_sm90() -> None:
    from harness.backends.cuda.mhc_pre import loader

    assert all(p.is_file() and p.suffix == ".cu" for p in loader.CU_SOURCES)
    cuda_build.compile_only(loader.CU_SOURCES, arch="sm_90")


def test_compile_error_is_reported(tmp_path) -> None:
    bad = tmp_path / "bad.cu"
    bad.write_text("__global__ void k(float* x) { x[0] = undefined_name; }\n")
    with pytest.raises(RuntimeError, match="undefined_name"):
        cuda_build.compile_only([bad], arch="sm_90")


def test_library_cache_is_keyed_by_content(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HARNESS_CUDA_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "k.cu"
    src.write_text('extern "C" int answer() { return 41; }\n')
    a = cuda_build.library_path([src], name="t")
    assert cuda_build.load([src], name="t").answer() == 41
    src.write_text('extern "C" int answer() { return 42; }\n')
    b = cuda_build.library_path([src], name="t")
    assert a != b and cuda_build.load([src], name="t").answer() == 42
