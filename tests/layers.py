"""The layer of each test module, as data: tests/conftest.py marks every item with its module's layer, and CI
(.ci/run) runs `pytest -m unit`, `-m compile` and `-m e2e` as timed steps of their own. A test module missing
here is a collection error, so that a new test file cannot fall out of every step unseen.

Placed by durations measured on 2 CPU cores (`pytest -n 2 --dist loadgroup --durations=0`, the whole suite).
"""

from typing import Literal

Layer = Literal["unit", "compile", "e2e"]

# the markers' descriptions (`pytest --markers`)
MARKERS: dict[Layer, str] = {
    "unit": "in process, no subprocess or compiler; each test well under a second",
    "compile": "compile-only checks for sm_90 with no GPU (nvcc, TileLang, Triton AOT)",
    "e2e": "the CLI or pytest in subprocesses, Ray clusters, sweeps, Triton interpreter runs, GPU-only tests",
}

# test module (its path under tests/, dotted, without .py) -> layer
TEST_LAYERS: dict[str, Layer] = {
    # in process, no subprocess: small CPU tensors or the source's AST; under 1 s a test (the most: 0.95 s)
    "test_cell_identity": "unit",  # not measured (new), by reading: plans, committed reports
    "test_committed_reports": "unit",
    "test_digests": "unit",
    "test_orders": "unit",
    "test_draw_copies": "unit",
    "test_faults_table": "unit",
    "test_layers": "unit",  # not measured (new), by reading: AST checks of harness/
    "test_oom": "unit",
    "test_reference_lazy_attention": "unit",
    "test_reference_xent": "unit",
    "test_skip_rules": "unit",  # not measured (new), by reading: the plan's skip table
    "test_twins": "unit",
    "test_merge": "unit",  # not measured (new), by reading: small report folders in tmp_path, in process
    "test_gluon_softmax_xent": "unit",  # not measured (new), by reading: registry, skip rules, CPU tensors
    # a compiler for sm_90 with no GPU; each module one xdist group, its builds once (up to 44 s a test)
    "test_cuda_compile": "compile",
    "test_tilelang_compile": "compile",
    "test_triton_aot": "compile",
    # the CLI, `python -c`, pytest, pip or git in subprocesses, and Ray clusters (up to 81 s a test)
    "test_liger": "e2e",  # not measured (new): two subprocesses, one short Liger run on the CPU
    "test_discovery": "e2e",  # one subprocess: registering everything imports no kernel code (about 3 s)
    "test_check": "e2e",
    "test_cli": "e2e",
    "test_cli_errors": "e2e",
    "test_compare": "e2e",
    "test_coverage": "e2e",
    "test_docs": "e2e",
    "test_executors": "e2e",  # not measured (new), by reading: the worker pool, a worker
    "test_interrupts": "e2e",
    "test_mutants": "e2e",
    "test_operator_authoring": "e2e",
    "test_packaging": "e2e",
    "test_perf_targets": "e2e",
    "test_plugins": "e2e",
    "test_pytest_road": "e2e",
    "test_ray_executor": "e2e",
    "test_repo_size": "e2e",
    "test_report_faults": "e2e",
    "test_repro": "e2e",
    "test_shape_and_options": "e2e",
    "test_tf32": "e2e",
    "test_worker_lifecycle": "e2e",
    # Triton kernels under the interpreter, in a subprocess (up to 58 s of setup)
    "test_triton_activations": "e2e",
    "test_triton_fused_linear_xent": "e2e",
    "test_triton_lazy_attention": "e2e",
    "test_triton_mhc_pre": "e2e",
    "test_triton_norms": "e2e",
    # in process, but whole cells, a sweep or a process pool (up to 10 s a test)
    "test_chunked_oracle": "e2e",
    "test_diagnosis": "e2e",
    "test_verdict": "e2e",
    "test_local_rule": "unit",
    "test_local_mutants": "e2e",
    "test_careful_floor": "e2e",  # two processes, Triton interpreted: ~15 s
    "test_minimal": "e2e",
    # kernels built and run on a GPU (skipped on a CPU machine)
    "test_cuda_mhc_pre": "e2e",
    "test_cuda_softmax_xent": "e2e",
    "test_tilelang_mhc_pre": "e2e",
    "gpu.test_user_paths": "e2e",
}
