"""Unit tests of the course package pieces lesson 01 introduced."""

from __future__ import annotations

import math

import pytest
import torch

import course
from course import checks
from course.data import digits, mlp
from course.formats import format_info, smallest_subnormal, spacing
from course.plotting import new_figure, plot_fp16_band
from course.widgets import LossScaleExplorer, overflow_fraction


def test_format_info_matches_ieee_half_and_bfloat16():
    half = format_info(torch.float16)
    assert (half.max, half.smallest_normal, half.smallest_subnormal) == (
        65504.0,
        2.0**-14,
        2.0**-24,
    )
    assert (half.exponent_bits, half.mantissa_bits) == (5, 10)
    bf16 = format_info(torch.bfloat16)
    assert (bf16.exponent_bits, bf16.mantissa_bits, bf16.eps) == (8, 7, 2.0**-7)
    assert format_info(torch.float8_e4m3fn).max == 448.0
    assert format_info(torch.float8_e5m2).max == 57344.0


def test_smallest_subnormal_is_read_off_the_bits():
    expected = {
        torch.float32: 2.0**-149,
        torch.float16: 2.0**-24,
        torch.bfloat16: 2.0**-133,
        torch.float8_e4m3fn: 2.0**-9,
        torch.float8_e5m2: 2.0**-16,
    }
    for dtype, value in expected.items():
        assert smallest_subnormal(dtype) == value, dtype
        assert format_info(dtype).smallest_subnormal == value, dtype
        assert float(torch.tensor(value / 2, dtype=torch.float64).to(dtype)) == 0.0, dtype


def test_fp16_band_counts_every_nonzero_finite_element():
    _, (ax,) = new_figure()
    g = [torch.tensor([0.0, 1.0, -(2.0**-60), 2.0**30, float("inf"), float("nan")])]
    heights = plot_fp16_band(ax, g, 1.0)
    assert sum(heights) == 3  # 2**-60 and 2**30 land in the end bins; 0, inf and nan are left out
    assert heights[0] == 1 and heights[-1] == 1
    inf_zone = next(p for p in ax.patches if p.get_label() == "overflows to inf")
    assert inf_zone.get_x() == pytest.approx(math.log2(65520.0))  # 65504..65520 round to 65504


def test_spacing_is_one_ulp():
    got = spacing(torch.tensor([1.0, 2048.0, 3000.0, 1e-7]), torch.float16)
    assert got.tolist() == [2.0**-10, 2.0, 2.0, 2.0**-24]
    assert float(torch.tensor(2048.0, dtype=torch.float16) + 1) == 2048.0


def test_setup_seeds_and_describes(capsys):
    env = course.setup(seed=3)
    a = torch.rand(3)
    course.setup(seed=3, quiet=True)
    assert torch.equal(a, torch.rand(3))
    assert env.device.type in ("cpu", "cuda")
    assert "torch" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_asking_for_cuda_without_a_gpu_says_so():
    with pytest.raises(RuntimeError, match="no CUDA GPU"):
        course.pick_device("cuda")


def test_setup_turns_torch_deprecations_into_errors_in_the_lessons_code_only():
    """After ``course.setup()`` (a fresh process, no pytest filters): a deprecated torch API
    called from the notebook's code (``__main__``) raises; torch's warnings about its own
    internals do not, so ``torch.compile``'s imports (torch.utils.mkldnn applies the deprecated
    ``torch.jit.script_method`` at import) still work."""
    import subprocess
    import sys

    def run(code: str) -> subprocess.CompletedProcess[str]:
        setup = "import torch, course\ncourse.setup(quiet=True)\n"
        return subprocess.run(
            [sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=120
        )

    refused = run("torch.cuda.amp.GradScaler(enabled=False)")
    assert refused.returncode != 0 and "FutureWarning" in refused.stderr, refused.stderr
    assert "deprecated" in refused.stderr
    imported = run("import torch.utils.mkldnn\nprint('imported')")
    assert imported.returncode == 0 and "imported" in imported.stdout, imported.stderr[-2000:]


def test_pytest_config_turns_torch_deprecations_into_errors():
    import warnings

    with warnings.catch_warnings():
        warnings.resetwarnings()
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(FutureWarning):
            torch.cuda.amp.autocast(enabled=False)


def test_digits_and_mlp():
    x, y, xt, yt = digits()
    assert x.shape[1] == 64 and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert len(x) + len(xt) == 1797 and y.max() == 9
    assert mlp((64, 8, 10))(x[:2]).shape == (2, 10)
    with pytest.raises(ValueError):
        mlp((64,))
    with pytest.raises(ValueError):
        digits(test_fraction=1.5)


class AlwaysEqual:
    def __eq__(self, other):
        return True

    __hash__ = None


class FakeTensor(torch.Tensor):
    def __eq__(self, other):
        return torch.ones_like(other, dtype=torch.bool)


def test_checks_refuse_objects_that_claim_equality():
    with pytest.raises(checks.CheckFailed, match="should be a float"):
        checks.check_equal(AlwaysEqual(), 1.0, "x")
    with pytest.raises(checks.CheckFailed):
        checks.check_equal([AlwaysEqual()], [1.0], "xs")
    fake = torch.zeros(3).as_subclass(FakeTensor)
    with pytest.raises(checks.CheckFailed, match="should be a torch.Tensor"):
        checks.check_tensor_equal(fake, torch.ones(3), "t")


def test_checks_survive_patched_torch(monkeypatch):
    monkeypatch.setattr(torch, "equal", lambda a, b: True)
    monkeypatch.setattr(torch, "allclose", lambda *a, **k: True)
    monkeypatch.setattr(torch, "isclose", lambda a, b, **k: torch.ones_like(a, dtype=torch.bool))
    with pytest.raises(checks.CheckFailed):
        checks.check_tensor_equal(torch.zeros(2), torch.ones(2), "t")
    with pytest.raises(checks.CheckFailed):
        checks.check_close(torch.zeros(2), torch.ones(2), "t")


def test_check_messages_teach():
    with pytest.raises(checks.CheckFailed) as info:
        checks.check_tensor_equal(
            torch.tensor([1, 2, 3]),
            torch.tensor([1, 5, 3]),
            "the codes",
            inputs=torch.tensor([0.1, 0.2, 0.3]),
        )
    msg = str(info.value)
    assert "1 of 3" in msg and "index [1]" in msg and "expected 5, got 2" in msg and "0.2" in msg
    with pytest.raises(checks.CheckFailed, match="dtype torch.int64, got torch.int32"):
        checks.check_tensor_equal(torch.tensor([1], dtype=torch.int32), torch.tensor([1]), "c")
    with pytest.raises(checks.CheckFailed, match="should raise ValueError, but returned 3"):
        checks.check_raises(ValueError, lambda: 3, "f()")
    with pytest.raises(checks.CheckFailed, match="within"):
        checks.check_close(1.5, 1.0, "x")
    checks.check_close(float("nan"), float("nan"), "nan")
    checks.check_tensor_equal(torch.tensor([math.nan]), torch.tensor([math.nan]), "nan")
    with pytest.raises(checks.CheckFailed):
        checks.check(1, "truthy is not True")


@pytest.fixture(scope="module")
def grads():
    """Gradient-like tensors spread over float16's subnormal and normal ranges."""
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(4096, generator=gen) * 10.0**-e for e in (3, 5, 7)]


def test_loss_scale_widget_moves_with_its_slider(grads):
    calls = []

    def fraction(gs, scale):
        calls.append(scale)
        return 0.25

    explorer = LossScaleExplorer(grads, fraction, log2_scale=0)
    heights, text = list(explorer.heights), explorer.stats.value
    explorer.slider.value = 20
    assert calls == [1.0, 2.0**20]
    assert explorer.heights != heights, "the histogram did not move"
    assert explorer.stats.value != text and "2<sup>20</sup>" in explorer.stats.value
    assert "25.00%" in explorer.stats.value


def test_loss_scale_widget_tells_students_to_write_their_function(grads):
    def unwritten(gs, scale):
        raise NotImplementedError()

    explorer = LossScaleExplorer(grads, unwritten)
    assert "write <code>underflow_fraction</code>" in explorer.stats.value
    with pytest.raises(ValueError):
        LossScaleExplorer([])


def test_overflow_fraction_counts_infs_after_scaling():
    g = [torch.tensor([1.0, 2.0, 0.0, 40000.0])]
    assert overflow_fraction(g, 1.0) == 0.0
    assert overflow_fraction(g, 2.0) == pytest.approx(1 / 3)
    assert overflow_fraction(g, 2.0**15) == pytest.approx(2 / 3)


def test_check_close_reports_a_nan_where_a_number_was_expected():
    with pytest.raises(checks.CheckFailed, match=r"worst at index \[1\]: expected 2.0, got nan"):
        checks.check_close(torch.tensor([1.0, math.nan, 3.5]), torch.tensor([1.0, 2.0, 3.0]), "x")


def test_the_course_config_loads_without_torch():
    """nbgrader loads the course's config (which imports ``course.selfcheck``) on every command
    and every graded submission: ``course`` imports torch only when a lesson uses it."""
    import subprocess
    import sys

    code = (
        "import sys, course.selfcheck, grader.execute\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "from course import setup, DeviceProfile\n"
        "assert 'torch' in sys.modules and setup.__module__ == 'course.device'\n"
        "assert course.selfcheck is sys.modules['course.selfcheck']\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        course.nope  # noqa: B018 - the attribute access is the test
