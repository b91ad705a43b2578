"""Unit tests for course/accumulation.py (lesson 05's helpers and widget)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from course.accumulation import (
    AccumulationExplorer,
    RecordingSGD,
    dropout_mlp,
    full_batch_grads,
    peak_memory_bytes,
    relative_difference,
    saved_tensor_peak_bytes,
    split_batch,
)

loss_fn = nn.functional.cross_entropy


def _problem(seed: int = 0, n: int = 32, d: int = 8, classes: int = 3):
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    net = nn.Sequential(nn.Linear(d, 16), nn.ReLU(), nn.Linear(16, classes))
    return net, torch.randn(n, d, generator=gen), torch.randint(0, classes, (n,), generator=gen)


def _simple_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype, **kw):
    """A minimal accumulated step for driving the widget (not the lesson's exercise cell)."""
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scaler.get_scale() >= before


def test_split_batch_gives_equal_parts_in_order():
    x = torch.arange(12.0).reshape(6, 2)
    y = torch.arange(6)
    parts = split_batch(x, y, 3)
    assert len(parts) == 3
    assert all(len(xb) == 2 and len(yb) == 2 for xb, yb in parts)
    assert torch.equal(torch.cat([xb for xb, _ in parts]), x)
    assert torch.equal(torch.cat([yb for _, yb in parts]), y)


@pytest.mark.parametrize("count", [0, 4])
def test_split_batch_refuses_unequal_or_empty_splits(count):
    with pytest.raises(ValueError):
        split_batch(torch.zeros(6, 2), torch.zeros(6), count)


def test_split_batch_refuses_mismatched_lengths():
    with pytest.raises(ValueError):
        split_batch(torch.zeros(6, 2), torch.zeros(5), 2)


def test_full_batch_grads_match_a_manual_backward_and_leave_grads_alone():
    net, x, y = _problem()
    twin = copy.deepcopy(net)
    loss_fn(twin(x), y).backward()
    marker = [torch.full_like(p, 7.0) for p in net.parameters()]
    for p, m in zip(net.parameters(), marker, strict=True):
        p.grad = m.clone()
    got = full_batch_grads(net, x, y, loss_fn)
    for g, p in zip(got, twin.parameters(), strict=True):
        assert g.dtype == torch.float32
        assert torch.equal(g, p.grad)
    for p, m in zip(net.parameters(), marker, strict=True):
        assert torch.equal(p.grad, m)


def test_relative_difference():
    a = [torch.tensor([3.0, 0.0]), torch.tensor([4.0])]
    assert relative_difference(a, a) == 0.0
    assert relative_difference([2 * t for t in a], a) == pytest.approx(1.0)
    assert relative_difference([torch.tensor([float("inf"), 0.0]), a[1]], a) == float("inf")
    assert relative_difference([torch.ones(2)], [torch.zeros(2)]) == pytest.approx(2**0.5)
    with pytest.raises(ValueError):
        relative_difference(a, a[:1])


def test_recording_sgd_keeps_the_gradients_it_stepped_with():
    net, x, y = _problem()
    opt = RecordingSGD(net.parameters(), lr=0.0)
    before = [p.detach().clone() for p in net.parameters()]
    assert opt.seen is None and opt.steps == 0
    loss_fn(net(x), y).backward()
    expected = [p.grad.clone() for p in net.parameters()]
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert opt.steps == 1
    assert all(torch.equal(s, e) for s, e in zip(opt.seen, expected, strict=True))
    assert all(torch.equal(p, b) for p, b in zip(net.parameters(), before, strict=True))


def test_recording_sgd_sees_unscaled_gradients_and_nothing_when_skipped():
    net, x, y = _problem(1)
    ref = full_batch_grads(net, x, y, loss_fn)
    opt = RecordingSGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    scaler.scale(loss_fn(net(x), y)).backward()
    scaler.step(opt)
    scaler.update()
    assert relative_difference(opt.seen, ref) < 1e-6
    opt.zero_grad(set_to_none=True)
    bad = x.clone()
    bad[0, 0] = float("inf")
    scaler.scale(loss_fn(net(bad), y)).backward()
    scaler.step(opt)
    assert opt.steps == 1


def test_peak_memory_is_not_measured_on_cpu_but_the_function_runs():
    ran = []
    assert peak_memory_bytes(lambda: ran.append(1), "cpu") is None
    assert ran == [1]


def _backward_each(net, x, y, k):
    for xb, yb in split_batch(x, y, k):
        (loss_fn(net(xb), yb) / k).backward()


def _one_backward(net, x, y, k):
    sum(loss_fn(net(xb), yb) / k for xb, yb in split_batch(x, y, k)).backward()


def test_saved_tensor_peak_shrinks_with_micro_batches_and_is_released():
    net, x, y = _problem(0, n=64)
    peaks = {}
    for k in (1, 4, 16):
        peaks[k], left = saved_tensor_peak_bytes(lambda k=k: _backward_each(net, x, y, k))
        assert left == 0  # every saved tensor released after its backward pass
    assert peaks[1] > peaks[4] > peaks[16] > 0
    # The input of the first layer (64 x 8 float32) is saved for its weight's gradient.
    assert peaks[1] >= 64 * 8 * 4
    # One backward pass over all micro-batches keeps every micro-batch's activations alive.
    together, left = saved_tensor_peak_bytes(lambda: _one_backward(net, x, y, 16))
    assert left == 0 and together > 2 * peaks[16]
    # A graph still alive when fn returns (no backward pass yet) is still counted.
    kept = []
    _, held = saved_tensor_peak_bytes(lambda: kept.append(loss_fn(net(x), y)))
    assert held > 0
    kept.clear()


def test_dropout_mlp_shape_and_randomness():
    net = dropout_mlp((5, 7, 3), p=0.5)
    assert [type(m) for m in net] == [nn.Linear, nn.ReLU, nn.Dropout, nn.Linear]
    x = torch.randn(4, 5)
    net.train()
    torch.manual_seed(0)
    a = net(x)
    torch.manual_seed(0)
    assert torch.equal(a, net(x))
    with pytest.raises(ValueError):
        dropout_mlp((5,))


def _explorer(step_fn=_simple_step, **kw):
    net, x, y = _problem(2, n=16)
    return AccumulationExplorer(step_fn, net, x, y, loss_fn, counts=(1, 2, 4), **kw)


def test_widget_follows_the_count_slider():
    explorer = _explorer(count=1)
    first = explorer.stats.value
    assert explorer.selected.count == 1
    assert "not measured on the CPU" in first
    assert "saved for backward" in first and explorer.selected.saved_bytes > 0
    explorer.count_slider.value = 4
    assert explorer.selected.count == 4
    assert explorer.stats.value != first
    assert "4 micro-batches" in explorer.stats.value
    assert explorer.selected.difference is not None and explorer.selected.difference < 0.05
    assert explorer.selected.stepped is True


def test_widget_follows_the_dtype_menu_and_measures_each_dtype_once():
    explorer = _explorer(count=2)
    assert set(explorer.results) == {torch.float16}
    fp16 = explorer.selected
    explorer.dtype_menu.value = torch.bfloat16
    assert set(explorer.results) == {torch.float16, torch.bfloat16}
    assert explorer.selected.dtype == torch.bfloat16
    assert explorer.selected.difference != fp16.difference
    assert "bfloat16" in explorer.stats.value
    cached = explorer.results[torch.bfloat16]
    explorer.update(4, torch.bfloat16)
    assert explorer.results[torch.bfloat16] is cached


def test_widget_never_moves_the_model():
    explorer = _explorer()
    before = [p.detach().clone() for p in explorer.model.parameters()]
    explorer.count_slider.value = 2
    assert all(torch.equal(p, b) for p, b in zip(explorer.model.parameters(), before, strict=True))


def test_widget_says_when_the_exercise_is_not_written():
    def unwritten(*args, **kwargs):
        raise NotImplementedError()

    explorer = _explorer(unwritten)
    assert "write accumulated_step above" in explorer.stats.value
    assert explorer.selected.difference is None


def test_widget_shows_the_students_error_instead_of_raising():
    def broken(*args, **kwargs):
        raise KeyError("oops")

    explorer = _explorer(broken)
    assert "raised KeyError" in explorer.stats.value


def test_widget_sees_a_wrong_step_as_a_larger_difference():
    def undivided(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype, **kw):
        for xb, yb in micro_batches:
            with torch.amp.autocast(device_type, dtype=dtype):
                loss = loss_fn(model(xb), yb)
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return True

    explorer = _explorer(undivided, count=4)
    assert explorer.selected.difference == pytest.approx(3.0, rel=0.05)


def test_widget_refuses_counts_that_do_not_divide_the_batch():
    net, x, y = _problem(n=10)
    with pytest.raises(ValueError):
        AccumulationExplorer(_simple_step, net, x, y, counts=(1, 3))


def test_torch_source_lines_quotes_the_installed_release():
    import inspect

    from course.accumulation import torch_source_lines

    text = torch_source_lines(torch.optim.lr_scheduler.LRScheduler.step, "_opt_called")
    lines = text.splitlines()
    assert lines and all(line.startswith("torch/optim/lr_scheduler.py:") for line in lines)
    source, first = inspect.getsourcelines(torch.optim.lr_scheduler.LRScheduler.step)
    number = int(lines[0].split(":")[1])
    assert "_opt_called" in source[number - first]
    with_context = torch_source_lines(
        torch.optim.lr_scheduler.LRScheduler.step, "_opt_called", "Detected call", context=1
    )
    assert len(with_context.splitlines()) > len(lines)
    with pytest.raises(ValueError):
        torch_source_lines(torch.optim.lr_scheduler.LRScheduler.step, "no such text here")


def test_torch_source_lines_names_the_file_inside_the_torch_package(monkeypatch):
    """A torch installed under a folder that is itself named ``torch`` (a GPU image keeps its
    environment in /opt/torch/.venv): the path shown starts at the package, not that folder."""
    import inspect

    import course.accumulation as A

    root = "/opt/torch/.venv/lib/python3.12/site-packages/torch"
    monkeypatch.setattr(torch, "__file__", f"{root}/__init__.py")
    monkeypatch.setattr(inspect, "getsourcefile", lambda obj: f"{root}/optim/lr_scheduler.py")
    text = A.torch_source_lines(torch.optim.lr_scheduler.LRScheduler.step, "_opt_called")
    assert text.startswith("torch/optim/lr_scheduler.py:"), text


def test_fsdp2_accumulation_sums_in_the_reduce_dtype_or_param_dtype():
    from course.accumulation import FSDP2_SETTINGS, fsdp2_accumulation

    runs = fsdp2_accumulation(micro_batches=4)
    assert list(runs) == [label for label, _, _ in FSDP2_SETTINGS]
    by = {(rd, sync): runs[label] for label, rd, sync in FSDP2_SETTINGS}
    assert by[None, False]["held"] == torch.bfloat16
    assert by[torch.bfloat16, False]["held"] == torch.bfloat16
    assert by[torch.float32, False]["held"] == torch.float32
    assert by[None, True]["held"] is None and by[torch.float32, True]["held"] is None
    assert all(run["sharded"] == torch.float32 for run in runs.values())
    assert by[torch.float32, True]["difference"] == 0.0
    assert by[torch.float32, False]["difference"] < 1e-6
    assert by[None, False]["difference"] > 1e-4
    assert by[None, False]["difference"] == by[torch.bfloat16, False]["difference"]


def test_hidden_test_problems_repeat_from_their_seed():
    from grader.lessons.l05_accumulation.inputs import (
        FiniteLosses,
        draw_int,
        output_dtypes,
        random_problem,
    )

    def problem(seed, per=None):
        gen = torch.Generator().manual_seed(seed)
        return random_problem(gen, 3, per=per), int(torch.randint(0, 10**6, (), generator=gen))

    (net_a, mbs_a), after_a = problem(5)
    (net_b, mbs_b), after_b = problem(5)
    assert after_a == after_b  # the same number of draws from the generator
    assert len(mbs_a) == 3 and all(
        torch.equal(x, y) for (x, _), (y, _) in zip(mbs_a, mbs_b, strict=True)
    )
    assert all(
        torch.equal(p, q) for p, q in zip(net_a.parameters(), net_b.parameters(), strict=True)
    )
    (_, mbs_c), _ = problem(6, per=11)
    assert all(len(x) == 11 for x, _ in mbs_c)
    gen = torch.Generator().manual_seed(0)
    assert {draw_int(gen, 2, 4) for _ in range(200)} == {2, 3, 4}

    with output_dtypes(net_a[0]) as seen, torch.autocast("cpu", dtype=torch.bfloat16):
        net_a(mbs_a[0][0])
    net_a(mbs_a[0][0])  # after the block: not recorded
    assert seen == [torch.bfloat16]
    losses = FiniteLosses(nn.functional.cross_entropy)
    x, y = mbs_a[0]
    losses(net_a(x), y)
    losses(torch.full((len(y), net_a[2].out_features), float("inf")), y)
    assert losses.finite == [True, False]


def test_checkpoint_runs_train_the_same_from_the_same_seeds():
    from grader.lessons.l05_accumulation.inputs import amp_train_steps, checkpoint_run

    x, y = torch.randn(200, 8), torch.randint(0, 3, (200,))
    finals = []
    for _ in range(2):
        run = checkpoint_run(3, "sgd", torch.float16, 2.0**26, 2, (8, 24, 24, 3))
        torch.manual_seed(4)
        amp_train_steps(*run, 6, torch.float16, x, y, nn.functional.cross_entropy)
        finals.append((list(run[0].parameters()), run[2].state_dict()))
    assert all(torch.equal(p, q) for p, q in zip(finals[0][0], finals[1][0], strict=True))
    assert finals[0][1] == finals[1][1] and finals[0][1]["scale"] < 2.0**26  # it backed off
    adamw = checkpoint_run(3, "adamw", torch.bfloat16, 2.0**10, 2, (8, 24, 24, 3))
    assert isinstance(adamw[1], torch.optim.AdamW) and not adamw[2].is_enabled()


def test_simulated_gpus_answer_torch_cuda_and_restore_it_on_exit():
    from course.accumulation import SimulatedCudaGenerators, simulated_cuda_states

    real = (torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_rng_state_all)
    saved = simulated_cuda_states(7, 1, 3)
    assert simulated_cuda_states(7, 1, 3)[2].equal(saved[2])  # the same for the same arguments
    later = simulated_cuda_states(7, 1, 3, later=True)
    assert [s.dtype for s in saved] == [torch.uint8] * 3 and not saved[0].equal(later[0])
    gpus = SimulatedCudaGenerators(saved)
    with gpus:
        assert torch.cuda.is_available() and torch.cuda.device_count() == 3
        states = torch.cuda.get_rng_state_all()
        assert all(a.equal(b) for a, b in zip(states, saved, strict=True))
        assert torch.cuda.random.get_rng_state(1).equal(saved[1])
        assert torch.cuda.get_rng_state("cuda:2").equal(saved[2])
        assert torch.cuda.default_generators[0].get_state().equal(saved[0])
        torch.cuda.set_rng_state_all(later)
        assert torch.cuda.get_rng_state().equal(later[0])  # the current device is 0
        torch.cuda.set_rng_state(saved[1], torch.device("cuda", 1))
        states[0][0] ^= 1  # what get_rng_state_all returned is a copy
    assert gpus.states[0].equal(later[0]) and gpus.states[1].equal(saved[1])
    assert gpus.states[2].equal(later[2])
    assert (torch.cuda.is_available(), torch.cuda.device_count()) == real[:2]
    assert torch.cuda.get_rng_state_all is real[2]


def test_a_checkpoint_without_the_gpu_states_leaves_the_simulated_gpus_where_they_were(tmp_path):
    from course.accumulation import SimulatedCudaGenerators, simulated_cuda_states

    def save(path, with_gpus):
        state = {"cpu": torch.get_rng_state()}
        if with_gpus and torch.cuda.is_available():
            state["gpus"] = torch.cuda.get_rng_state_all()
        torch.save(state, path)

    def load(path):
        state = torch.load(path, map_location="cpu", weights_only=True)
        torch.set_rng_state(state["cpu"])
        if "gpus" in state:
            torch.cuda.set_rng_state_all(state["gpus"])

    for with_gpus in (True, False):
        saved = simulated_cuda_states(3, 0, 2)
        gpus = SimulatedCudaGenerators(saved)
        with gpus:
            save(tmp_path / "c.pt", with_gpus)
        gpus.states = simulated_cuda_states(3, 0, 2, later=True)
        with gpus:
            load(tmp_path / "c.pt")
        restored = all(a.equal(b) for a, b in zip(gpus.states, saved, strict=True))
        assert restored is with_gpus


def test_simulated_gpus_serve_torch_cuda_functions_however_they_were_imported():
    # torch.cuda's own random functions run on the simulated GPUs: imported by name before the
    # simulation starts, per device under torch.cuda.device(i) or set_device, and behind
    # torch.accelerator's and is_initialized()'s guards. Everything is put back after an error.
    from torch.cuda import current_device, get_rng_state_all, is_initialized, set_rng_state_all

    from course.accumulation import SimulatedCudaGenerators, simulated_cuda_states

    def outside():
        return (
            torch.cuda.is_available(),
            torch.accelerator.is_available(),
            len(get_rng_state_all()),
            is_initialized(),
            len(torch.cuda.default_generators),
            hasattr(torch._C, "_cuda_getDevice"),
            torch.cuda._lazy_call,
            torch.cuda.random.current_device,
            torch.accelerator.current_accelerator,
        )

    real = outside()
    saved, later = simulated_cuda_states(5, 0, 3), simulated_cuda_states(5, 0, 3, later=True)
    gpus = SimulatedCudaGenerators(saved)
    with gpus:
        assert all(a.equal(b) for a, b in zip(get_rng_state_all(), saved, strict=True))
        assert is_initialized() and torch.cuda.is_initialized()
        assert torch.accelerator.is_available() and torch.accelerator.device_count() == 3
        with torch.cuda.device(2):
            assert current_device() == 2 and torch.cuda.get_rng_state().equal(saved[2])
        assert torch.cuda.current_device() == 0
        torch.cuda.set_device(1)
        torch.cuda.set_rng_state(later[1])
        torch.cuda.set_device(0)
        set_rng_state_all([later[0]])
        torch.cuda.manual_seed_all(11)
        assert torch.cuda.initial_seed() == 11 and torch.cuda.random.initial_seed() == 11
        set_rng_state_all(saved)
    assert all(a.equal(b) for a, b in zip(gpus.states, saved, strict=True))
    assert outside() == real
    with pytest.raises(KeyError), gpus:
        raise KeyError("inside")
    assert outside() == real
