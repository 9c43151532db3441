"""The fuzz seed: derived from the commit under test, so that one commit always draws the same
graphs and every new commit draws others (tests/test_fuzz.py, tests/test_plan_checks.py).
KILNET_FUZZ_SEED replays a run; pytest's header prints the seed in force."""
import os
import subprocess

import pytest
from hypothesis import HealthCheck, settings

HERE = os.path.dirname(os.path.abspath(__file__))


def _commit():
    try:
        r = subprocess.run(["git", "rev-parse", "HEAD"], cwd=HERE, capture_output=True,
                           text=True, timeout=10)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def fuzz_seed():
    """(seed, where it came from)."""
    given = os.environ.get("KILNET_FUZZ_SEED")
    if given:
        return int(given), "KILNET_FUZZ_SEED"
    commit = _commit()
    if commit:
        return int(commit[:8], 16), f"commit {commit[:12]}"
    return 0, "no git checkout"


FUZZ_SEED, FUZZ_SEED_FROM = fuzz_seed()
os.environ.setdefault("KILNET_FUZZ_SEED", str(FUZZ_SEED))     # the same in every xdist worker

# Profiles: "ci" (the default: 50 examples from the seed above, no example database, so a run is
# replayed by its seed alone) and "long" (HYPOTHESIS_PROFILE=long: 500 examples, random seeds
# unless KILNET_FUZZ_SEED is set). Tests that draw take @seed(FUZZ_SEED).
_COMMON = dict(deadline=None, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("ci", max_examples=50, **_COMMON)
settings.register_profile("long", max_examples=500, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _setup_lines():
    import c_runner
    import oclgrind
    return [f"kilnet fuzz seed: {FUZZ_SEED} (from {FUZZ_SEED_FROM}); replay with "
            f"KILNET_FUZZ_SEED={FUZZ_SEED}",
            f"Oclgrind: {oclgrind.missing() or oclgrind.describe()}",
            c_runner.describe()]


def pytest_report_header(config):
    return _setup_lines()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The same lines at the end, where `pytest -q` shows them too."""
    if not hasattr(config, "workerinput"):
        for line in _setup_lines():
            terminalreporter.write_line(line)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A fuzzed graph that failed a test goes into tests/fuzz_corpus (plan_checks.FAILED holds
    the last one drawn that failed), and the report says where and with which seed."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    import plan_checks
    if plan_checks.FAILED:
        path = plan_checks.save_to_corpus(*plan_checks.FAILED, why=f"{item.nodeid} failed with "
                                          f"KILNET_FUZZ_SEED={FUZZ_SEED}")
        plan_checks.FAILED = None
        report.sections.append(("fuzz corpus", f"the failing graph was written to {path}: "
                                               f"commit it as a regression case"))


# The slow profile: checks that the README's test command leaves to `python -m pytest -q -m slow`,
# which .ci/run runs as well (pyproject's addopts deselect them: `-m "not slow"`). Each entry is
# a pattern of test ids (fnmatch) and why it is slow; a pattern that matches no test of a whole
# run is an error, so an entry cannot go stale while the checks it names move away. Measured on
# a 2-core Xeon with a cold kernel cache, the README command took 656 s with all of them in,
# 486 s from a fresh clone and venv without the first four, and 539 s once issue 46's ops and
# tests came in (the fuzz entries then moved here), 495 s after that. On the 2-core EPYC of issue
# 48 (fresh clone, venv and HOME): 534 s, and the three issue-48 entries then moved here. Issue
# 67's primitives (2026-12-06, 2-core Xeon, fresh clone and HOME, the venv made): 368 s, with
# their PoCL subset and the benchmark's smoke run moved here; with issue 70's agents: 390 s.
SLOW = {
    "tests/test_report.py::test_the_page_holds_the_whole_plan[[]forecast[]]":
        "the HTML report of the forecaster's plan, compiled cold: 9 s (two_spirals', qnet's and "
        "fuzzed graphs' pages stay in the main run)",
    "tests/test_report.py::test_the_page_holds_the_whole_plan[[]gte_encoder[]]":
        "the HTML report of the GTE encoder's plan, compiled cold: 5 s",
    "tests/test_trace.py::test_a_trace_of_w1s_train_step_is_valid":
        "W1 at its own size (3 dense of 1000) compiled cold for a trace: 5 s (the trace checks "
        "on a W1-shaped small model stay in the main run)",
    "tests/test_forecast.py::test_lstm_and_attention_models_learn_the_synthetic_series*":
        "the forecaster's lstm and attention models learning (issue 46's example): 6-8 s cold",
    "tests/test_oclgrind.py::test_kernels_run_clean[[]*":
        "every kernel family under Oclgrind, an interpreter: 210 s of test time together, and "
        "the primitives' script (oclgrind_primitives.py) 15-100 s more, cold or warm (the two "
        "tests that prove the harness reports bad accesses stay in the main run)",
    "tests/test_export.py::test_runner_matches_python_on_every_example[[]*":
        "the C runner on every example: 68 s (the runner's own tests stay in the main run)",
    "tests/test_kernel_forms.py::*[[]pocl-*":
        "the kernel forms on PoCL, whose compiler is several times slower than Intel's: 60 s "
        "(the same cases on Intel's runtime stay in the main run)",
    "tests/test_readme_shell.py::test_readme_command[[]*benchmarks/*":
        "the docs' benchmark commands (docs/guides/benchmarks.md): 45 s",
    "tests/test_readme_shell.py::test_readme_command[[]*KILNET_DEVICE=pocl*":
        "the docs' PoCL runs of the examples (docs/guides/devices.md): 9 s",
    "tests/test_fuzz.py::test_valid_graph_matches_reference":
        "the fuzzer's valid graphs against the interpreter, 50 examples: 50 s cold since the "
        "generator draws issue 45's and 46's ops (the fuzzer's invalid graphs and bad feeds "
        "stay in the main run)",
    "tests/test_plan_checks.py::test_fuzzed_graphs_give_the_same_bits_in_any_stage_order":
        "the fuzzed graphs in every stage order: 22 s",
    "tests/test_onnx.py::test_random_valid_graphs_run_in_onnxruntime_as_in_kilnet":
        "the fuzzed graphs through onnxruntime: 17 s",
    "tests/test_resident.py::test_the_device_check_script_agrees_here":
        "benchmarks' device-data check script: 12 s",
    "tests/test_program_cache.py::test_*child*":
        "program builds in child processes, a failing child included: 14 s",
    "tests/test_submit.py::test_the_benchmark_compares_every_path_the_device_offers":
        "benchmarks/submit_paths.py run whole: 7 s",
    "tests/test_tune.py::test_every_cpu_form_candidate_computes_the_same":
        "every CPU-form candidate of the tuner built and run: 10 s",
    "tests/test_primitives.py::test_pocl[[]*":
        "the primitives on PoCL, whose compiler is several times slower than Intel's: 15 s cold "
        "(every primitive on Intel's runtime, in both kernel forms, stays in the main run)",
    "tests/test_benchmark_primitives.py::test_the_smoke_run_checks_times_and_reports_each_kilnet_pair":
        "benchmarks/primitives.py run whole at its smoke sizes: 6 s (its refusals and bad "
        "options stay in the main run)",
    "tests/test_export.py::test_runner_and_mql5_*[[]gpu[]]":
        "the GPU kernel form of the new ops' bundles through the runner: 15 s (their CPU form "
        "stays in the main run)",
    # Stop 61: the README command took 605 s from a fresh clone on 2 cores; these 15 (116 s of
    # test time, each covered in kind by what stays in the main run) keep it within 540 s.
    "tests/test_mpi.py::test_two_ranks_train_as_one_process_with_twice_the_batch":
        "two MPI ranks against one process of twice the batch: 14 s (docs/guides/data-parallel.md's "
        "`mpiexec -n 2 python train.py` stays in the main run)",
    "tests/test_kernel_forms.py::test_tiled_and_vector_forms_agree[[]intel-huge[]]":
        "the tiled and vector forms on a huge product: 5 s (the other shapes stay in the main run)",
    "tests/test_kernel_forms.py::test_tiled_and_vector_forms_agree[[]intel-large[]]":
        "... on a large one: 5 s",
    "tests/test_kernel_forms.py::test_sliced_products_agree[[]intel-300-65-200-want1[]]":
        "sliced products, the second shape: 6 s (the first stays in the main run)",
    "tests/test_kernel_forms.py::test_many_compute_units_agree[[]intel-*":
        "the forms on a device of many compute units, Intel's: 10 s (the plan checks' stage "
        "orders stay in the main run)",
    "tests/test_cpu_products.py::test_batched_products_with_a_along_m_from_memory_prefetch_each_chunk_of_a":
        "AVX-512 prefetching batched products built and compared: 8 s (Oclgrind checks the same "
        "kernels in the slow profile too; the prefetch choices' unit tests stay in the main run)",
    "tests/test_cpu_products.py::test_products_that_read_a_big_weight_once_prefetch_its_next_panel":
        "AVX-512 prefetching of a big weight built and compared: 8 s",
    "tests/test_export.py::test_runner_and_mql5_include_run_an_embedding_model[[]cpu[]]":
        "an embedding model through the runner and the MQL5 include: 10 s (the runner's other "
        "bundles stay in the main run)",
    "tests/test_export.py::test_kernels_cl_is_one_program_with_unique_names":
        "every example's kernels.cl built as one program: 8 s",
    "tests/test_forecast.py::test_dropout_and_a_weekday_embedding":
        "the forecaster with dropout and a weekday embedding: 6 s (its tiny run stays)",
    "tests/test_ownership.py::test_compiling_again_with_other_settings_leaves_an_earlier_model_as_it_was":
        "two models compiled under other settings: 7 s (the other ownership checks stay)",
    "tests/test_readme_shell.py::test_readme_command[[]docs/guides/inspecting.md:24-KILNET_DUMP_KERNELS*":
        "the docs' kernel-dump command, a cold qnet run: 6 s",
    "tests/test_tune.py::test_every_gpu_form_candidate_computes_the_same":
        "every GPU-form candidate of the tuner built and run: 6 s (as its CPU-form twin)",
    "tests/test_graph_attention.py::test_graph_attention[[]70-2-1-20-None-gpu[]]":
        "graph attention's largest case in the GPU form: 7 s (its other cases stay)",
    # ... and these 12 (64 s): two cold runs of the same tree took 503 and 567 s without them.
    "tests/test_kernel_forms.py::test_tiled_and_vector_forms_agree[[]intel-accumulate[]]":
        "the tiled and vector forms accumulating into an output: 7 s (the plain shapes stay)",
    "tests/test_kernel_forms.py::test_sliced_products_agree[[]intel-130-70-131-want0[]]":
        "sliced products, the first shape: 4 s (the sliced policy's unit tests stay)",
    "tests/test_export.py::test_mql5_include_holds_the_plans_table":
        "every example's MQL5 include read for the plan's table: 7 s (the include's own tests, "
        "tests/test_mql5.py, stay)",
    "tests/test_readme_shell.py::test_readme_command[[]docs/guides/mql5-onnx.md:75-*":
        "the docs' export of a checkpoint to ONNX and MQL5: 6 s (the ONNX tests stay)",
    "tests/test_gte_encoder.py::test_right_adjacency_beats_the_chain":
        "the GTE encoder learning with the right adjacency: 6 s (its gradient checks stay)",
    "tests/test_distq_learning.py::test_pandas_written_file_runs":
        "the distributional Q example on a pandas-written file: 5 s (its CSV reader's tests stay)",
    "tests/test_onnx_attention.py::test_gte_encoder_example_onnx":
        "the GTE encoder example through onnxruntime: 5 s (the block's ONNX cases stay)",
    "tests/test_onnx_attention.py::test_gte_block_onnx[[]7-5-3-2-user[]]":
        "the largest GTE block case through onnxruntime: 5 s",
    "tests/test_devices.py::test_a_really_broken_pocl_is_skipped_and_refused_by_name":
        "a broken PoCL run in a child process: 5 s (the faked broken device stays)",
    "tests/test_self_attention.py::test_forward_and_gradients[[]129-2-1-16-True-1-cpu[]]":
        "self-attention's longest sequence: 5 s (its other cases stay)",
    "tests/test_graph_attention.py::test_graph_attention[[]65-2-3-2-user-gpu[]]":
        "graph attention with a user adjacency in the GPU form, 65 units: 4 s",
    "tests/test_onnx_conv.py::test_trained_model[[]float64[]]":
        "a trained conv model through onnxruntime in float64: 4 s (float32 stays)",
    "tests/test_runner_windows.py::test_the_exe_needs_only_kernel32_and_the_ucrt":
        "the runner linked for Windows by zig: 1-2 min on a fresh machine, which builds zig's "
        "MinGW runtime first (compiling it for Windows with warnings as errors stays in the "
        "main run: 1 s)",
    "tests/test_runner_windows.py::test_*under_wine*":
        "the Windows runner under Wine on Intel's Windows CPU runtime: 60 s, and once per machine "
        "30-80 s more to fetch the wheels (140 MB) and make the Wine prefix; they skip without "
        "wine",
    "tests/test_readme_shell.py::test_readme_command[[]*x86_64-pc-windows-msvc*":
        "docs/guides/windows.md's uv resolution for Windows, from PyPI: 10 s",
    "tests/test_windows_install.py::*":
        "uv resolving pyproject.toml for Windows (base and every extra) and Linux: 5 s from uv's "
        "cache, 27 s on a fresh machine, which fetches PyPI's metadata (the faked-Windows unit "
        "tests, tests/test_windows_branches.py, stay in the main run)",
}


# Entries whose tests exist only where an implementation builds kernels: PoCL 3.0 does not on
# CPUs newer than its LLVM 14 (an AMD EPYC here), and there a whole run has no such test.
SLOW_NEEDS = {"tests/test_kernel_forms.py::*[[]pocl-*": "pocl"}


def _present(implementation):
    if implementation is None:
        return True
    from devices_here import CPU_IMPLEMENTATIONS
    return implementation in CPU_IMPLEMENTATIONS


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: in the slow profile (tests/conftest.py SLOW), "
                                       "run by `python -m pytest -m slow` and .ci/run")


def pytest_collection_modifyitems(session, config, items):
    import fnmatch
    used = set()
    for item in items:
        for pattern in SLOW:
            if fnmatch.fnmatchcase(item.nodeid, pattern):
                item.add_marker(pytest.mark.slow)
                used.add(pattern)
    whole = not config.args or [os.path.normpath(a) for a in config.args] == ["tests"]
    stale = [p for p in SLOW if p not in used and _present(SLOW_NEEDS.get(p))]
    if whole and stale and not config.getoption("keyword"):
        raise pytest.UsageError(f"tests/conftest.py SLOW: no test matches {stale}")
