"""tools/gpu_check.sh, the GPU machine's check, run here as far as a machine without a
GPU allows: its stages' plumbing (an unknown stage refused, a stage past the deadline skipped,
the summary file) and the selection of its pytest stage (every test that needs CUDA, each of
which skips here with its reason). A GPU session's few minutes then go to the GPU."""
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]


def _run(stages, out, deadline=None, **extra):
    env = dict(os.environ, OUT=str(out), MQBENCH_GPU_PYTHON=sys.executable, CUDA_VISIBLE_DEVICES="",
               **extra)
    if deadline is not None:
        env["MQBENCH_GPU_DEADLINE_S"] = str(deadline)
    return subprocess.run(["bash", str(ROOT / "tools" / "gpu_check.sh"), *stages], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_an_unknown_stage_is_refused_before_anything_runs(tmp_path):
    r = _run(["pytest", "nope"], tmp_path)
    assert r.returncode == 2 and "unknown stage 'nope'" in r.stderr
    assert not (tmp_path / "summary.txt").exists()


def test_a_stage_past_the_deadline_is_skipped_and_named(tmp_path):
    r = _run(["bench"], tmp_path, deadline=10)
    assert r.returncode == 1
    summary = (tmp_path / "summary.txt").read_text()
    assert "gpu_check: bench SKIPPED" in summary and "stages: bench" in summary


def test_the_stages_after_a_failed_build_are_skipped(tmp_path):
    """No stage tests an older mqbench._C (a warm machine keeps the last call's) after the build
    failed: here its configure step cannot create its folder."""
    r = _run(["build", "pytest"], tmp_path, MQBENCH_GPU_BUILD="/proc/no-such-folder/build")
    summary = (tmp_path / "summary.txt").read_text()
    assert r.returncode == 1 and "gpu_check: build exit 1" in summary, summary
    assert "gpu_check: pytest SKIPPED (the build failed)" in summary
    assert not (tmp_path / "pytest.log").exists()


def test_the_pytest_stage_selects_every_test_that_needs_cuda(tmp_path):
    r = _run(["pytest"], tmp_path)
    log = (tmp_path / "pytest.log").read_text()
    assert r.returncode == 0, r.stdout + log[-2000:]
    assert "gpu_check: pytest exit 0" in (tmp_path / "summary.txt").read_text()
    last = log.strip().splitlines()[-1]
    assert "passed" not in last and "failed" not in last and "error" not in last, last
    skipped = int(re.search(r"(\d+) skipped", last).group(1))
    assert skipped > 2000, last  # the op suites alone hold about 2,000 CUDA cases
    reasons = re.findall(r"^SKIPPED \[\d+\] \S+: (.*)$", log, re.M)
    assert reasons and all("CUDA" in why for why in reasons), set(reasons)
