"""Lesson 06's launcher, training worker, graders' instruments and widget (real processes)."""

from __future__ import annotations

import _thread
import contextlib as _ctx
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as _DDP

import course.launch as D
from course.ddp_train import (
    TrainSpec,
    fp16_sum_worker,
    hello_worker,
    main,
    sync_bn_cpu_probe,
    train_single,
    train_worker,
)
from course.launch import (
    LaunchTimeout,
    RankFailed,
    child_pids,
    count_ddp_allreduces,
    launch,
    pick_backend,
    record_collectives,
)
from course.multigpu import (
    AmpDDPConfig,
    DDPExplorer,
    amp_tolerance,
    state_digest,
    worker_script,
)
from grader.lessons.l06_multi_gpu.inputs import probe_then_alone

REPO = Path(__file__).resolve().parents[1]
#: Globals of _script_worker, as a notebook's would be: worker_script must copy them.
_ONE = 1.0
_UNWRITABLE = object()
SMALL = TrainSpec(steps=3, global_batch=64, accum_steps=2, sizes=(64, 32, 10))


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


#: Descendants that were already alive when the current test started (a JupyterLab server or a
#: browser that another module's session fixture keeps on the same pytest worker): not this
#: test's to end.
_BASELINE: set[int] = set()


def _leftovers() -> list[int]:
    """Our descendants started since the test began (multiprocessing's resource tracker, which
    ``spawn`` starts once per process and which exits with us, is not counted by child_pids)."""
    return [pid for pid in child_pids() if pid not in _BASELINE]


@pytest.fixture(autouse=True)
def no_leftover_processes():
    """Every test must leave no child process behind."""
    _BASELINE.clear()
    _BASELINE.update(child_pids())
    yield
    deadline = time.monotonic() + 5
    while _leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers() == [], f"processes left behind: {_leftovers()}"


# ------------------------------------------------------------------------------------------
# The launcher


def _rank_sum(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    print(f"rank {rank} says hi")
    return {"rank": rank, "world_size": world_size, "sum": t, "view": torch.arange(10)[2:4]}


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_launch_returns_each_ranks_result_in_rank_order(world_size, capsys):
    results = launch(_rank_sum, world_size, (10,), timeout=60)
    assert [r["rank"] for r in results] == list(range(world_size))
    expected = sum(range(10, 10 + world_size))
    for r in results:
        assert r["world_size"] == world_size
        assert r["sum"].item() == expected
        assert r["view"].tolist() == [2, 3] and r["view"].untyped_storage().size() == 2 * 8
    out = capsys.readouterr().out
    for rank in range(world_size):
        assert f"[rank {rank}] rank {rank} says hi" in out


def _raise_on_rank_1(rank, world_size):
    if rank == 1:
        raise KeyError("missing thing on rank 1")
    dist.barrier()  # rank 0 would wait here forever
    return rank


def test_an_exception_in_one_rank_stops_all_ranks_with_its_traceback():
    start = time.monotonic()
    with pytest.raises(RankFailed) as info:
        launch(_raise_on_rank_1, 2, timeout=60, show_output=False)
    assert time.monotonic() - start < 20, "the launcher waited for the stuck rank"
    exc = info.value
    assert exc.rank == 1 and exc.world_size == 2 and exc.exc_type == "KeyError"
    assert "_raise_on_rank_1" in exc.remote_traceback
    assert "missing thing on rank 1" in str(exc) and "Traceback from rank 1" in str(exc)
    assert isinstance(exc.original, KeyError)


def _hang_and_start_grandchildren(rank, world_size, folder):
    child = subprocess.Popen(["sleep", "300"])
    Path(folder, f"grandchild{rank}").write_text(str(child.pid))
    Path(folder, f"rank{rank}").write_text(str(os.getpid()))
    if rank == 0:
        dist.barrier()  # rank 1 never joins
    else:
        while True:
            time.sleep(1)


def test_a_hanging_rank_is_killed_at_the_timeout_with_everything_it_started(tmp_path):
    start = time.monotonic()
    with pytest.raises(LaunchTimeout) as info:
        launch(_hang_and_start_grandchildren, 2, (str(tmp_path),), timeout=3, show_output=False)
    elapsed = time.monotonic() - start
    assert 3 <= elapsed < 3 * D.MAX_STRETCH + 15  # a busy machine stretches the timeout
    assert "[0, 1]" in str(info.value)
    pids = [int(p.read_text()) for p in sorted(tmp_path.iterdir())]
    assert len(pids) == 4
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)], "a rank or its child outlived the launch"


def _sleep_then_return(rank, world_size, seconds):
    time.sleep(seconds)
    dist.barrier()
    return rank


def test_cpu_share_reads_the_runnable_count():
    assert D.cpu_share(2, "3.10 2.50 2.00 8/412 9999") == 0.25
    assert D.cpu_share(4, "0.10 0.20 0.30 2/412 9999") == 1.0
    assert D.cpu_share(2, "garbage") == 1.0
    assert 0.0 < D.cpu_share() <= 1.0


def test_a_busy_machine_stretches_the_timeout_but_not_forever(monkeypatch):
    # Four runnable processes per CPU: a second counts as a quarter. A run that needs 2 s of
    # wall-clock time is not stopped by a timeout of 1 s...
    monkeypatch.setattr(D, "cpu_share", lambda: 0.25)
    assert launch(_sleep_then_return, 2, (2.0,), timeout=1.0, show_output=False) == [0, 1]
    # ...but a hang still ends, after timeout / share seconds.
    start = time.monotonic()
    with pytest.raises(LaunchTimeout):
        launch(_sleep_forever, 2, timeout=1.0, show_output=False)
    assert 4.0 <= time.monotonic() - start < 4.0 + 15
    # However busy the machine, the wait ends after MAX_STRETCH times the timeout.
    monkeypatch.setattr(D, "cpu_share", lambda: 0.0)
    start = time.monotonic()
    with pytest.raises(LaunchTimeout):
        launch(_sleep_forever, 2, timeout=0.5, show_output=False)
    assert 0.5 * D.MAX_STRETCH <= time.monotonic() - start < 0.5 * D.MAX_STRETCH + 15


def test_collectives_wait_longer_than_the_launcher():
    for timeout in (1.0, D.DEFAULT_TIMEOUT):
        assert D.collective_timeout(timeout) > timeout * D.MAX_STRETCH


def _dies_hard(rank, world_size):
    if rank == 0:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_rank_killed_by_a_signal_is_reported():
    with pytest.raises(RankFailed) as info:
        launch(_dies_hard, 2, timeout=60, show_output=False)
    assert info.value.rank == 0 and info.value.exc_type == "ProcessDied"
    assert "-9" in str(info.value)


def _sleep_forever(rank, world_size):
    while True:
        time.sleep(1)


def test_keyboard_interrupt_in_the_launcher_kills_every_rank():
    timer = threading.Timer(1.5, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            launch(_sleep_forever, 2, timeout=60, show_output=False)
    finally:
        timer.cancel()
    assert _leftovers() == []


def test_ranks_die_with_a_killed_launcher(tmp_path):
    """SIGKILL the process that launched: its ranks must not live on as orphans."""
    script = f"""
import os, sys, time
from pathlib import Path
from course.launch import launch

def worker(rank, world_size):
    Path({str(tmp_path)!r}, f"rank{{rank}}").write_text(str(os.getpid()))
    while True:
        time.sleep(1)

launch(worker, 2, timeout=120)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            assert parent.poll() is None, "the launching script exited early"
            time.sleep(0.1)
        pids = [int(p.read_text()) for p in tmp_path.iterdir() if p.read_text()]
        assert len(pids) == 2
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in pids if _alive(pid)], "ranks outlived their launcher"
    finally:
        parent.kill()
        parent.wait()


def test_parallel_launches_do_not_collide():
    results: dict[int, list] = {}

    def run(key):
        results[key] = launch(_rank_sum, 2, (key,), timeout=60, show_output=False)

    threads = [threading.Thread(target=run, args=(k,)) for k in (100, 200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    assert results[100][0]["sum"].item() == 201 and results[200][1]["sum"].item() == 401


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_ranks_are_not_forked_from_the_caller_where_fork_is_unsafe_and_get_functions_by_value(
    monkeypatch, method
):
    """Where torch sees a GPU, gloo ranks come from a forkserver (Linux) or are spawned (Windows,
    macOS); a function defined in a cell (here: a closure, which no module can import) still
    reaches them, by value. A forkserver's rank carries the server's command line, and is still
    counted as a rank (not a helper) until it is gone; a timed-out one is killed."""
    offset = 10

    def cell_function(rank, world_size):
        import sys

        total = torch.tensor([float(rank + offset)])
        dist.all_reduce(total)
        return {"sum": total.item(), "inherited_pytest": "pytest" in sys.modules}

    monkeypatch.setattr(D, "default_start_method", lambda backend="gloo": method)
    results = launch(cell_function, 2, timeout=300, show_output=False)
    assert [r["sum"] for r in results] == [21.0, 21.0]
    assert not any(r["inherited_pytest"] for r in results), "the ranks were forked, not spawned"
    helpers = set(child_pids(include_helpers=True)) - set(child_pids())
    mark = b"forkserver" if method == "forkserver" else b"resource_tracker"
    assert any(mark in D._cmdline(p) for p in helpers), f"no {method} helper is running"
    assert all(b"resource_tracker" in D._cmdline(p) or b"forkserver" in D._cmdline(p)
               for p in helpers), "only multiprocessing's helpers are left out"  # fmt: skip

    def sleeper(rank, world_size):
        time.sleep(600)

    if method == "forkserver":  # its ranks are the server's children, not this process's
        before = set(child_pids())  # other tests' kernels may be alive in this process
        with pytest.raises(LaunchTimeout):
            launch(sleeper, 2, timeout=2, show_output=False)
        assert set(child_pids()) <= before, "a timed-out rank outlived its launch"
    monkeypatch.setattr(D, "default_start_method", lambda backend="gloo": "fork")
    forked = launch(cell_function, 2, timeout=120, show_output=False)
    assert all(r["inherited_pytest"] for r in forked), "without a GPU, ranks are forked"


def test_a_forkservers_ranks_are_counted_as_ranks(monkeypatch):
    """child_pids leaves out multiprocessing's helpers, not what a forkserver forked (which
    carries the server's command line): the server (1, child of this kernel) is a helper, its
    rank (2) is not."""
    import psutil

    server = b"python -c from multiprocessing.forkserver import main"
    lines = {1: server, 2: server, 3: b"python -m ipykernel_launcher"}
    monkeypatch.setattr(D, "_cmdline", lambda pid: lines.get(pid, b""))

    class Child:
        def __init__(self, pid: int, ppid: int) -> None:
            self.pid, self._ppid = pid, ppid

        def status(self) -> str:
            return psutil.STATUS_RUNNING

        def ppid(self) -> int:
            return self._ppid

    class Kernel:
        def children(self, recursive: bool) -> list[Child]:
            return [Child(1, 3), Child(2, 1)]

    monkeypatch.setattr(psutil, "Process", Kernel)
    assert child_pids() == [2]
    assert sorted(child_pids(include_helpers=True)) == [1, 2]


def test_spawn_refuses_what_cannot_travel_with_a_clear_message():
    lock = threading.Lock()
    with pytest.raises(ValueError, match="cannot be sent to a new process"):
        launch(lambda rank, world_size, lk: rank, 2, (lock,), start_method="spawn")
    with pytest.raises(ValueError, match="cannot be used across fork"):
        launch(_rank_sum, 2, (0,), backend="nccl", start_method="fork")


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        launch(_rank_sum, 0)
    with pytest.raises(ValueError):
        launch(_rank_sum, 2, (0,), backend="mpi")
    with pytest.raises(ValueError):
        launch(_rank_sum, 2, (0,), threads=4)


def test_pick_backend_on_this_machine():
    backend = pick_backend(2)
    if torch.cuda.device_count() >= 2:
        assert backend.name == "nccl"
    else:
        assert (backend.name, backend.device_type) == ("gloo", "cpu")
    assert pick_backend(2, prefer="gloo").name == "gloo"
    if torch.cuda.device_count() < 2:
        with pytest.raises(RuntimeError):
            pick_backend(2, prefer="nccl")


def test_child_pids_sees_a_child_and_forgets_it():
    proc = subprocess.Popen(["sleep", "30"])
    try:
        assert proc.pid in child_pids()
    finally:
        proc.kill()
        proc.wait()
    assert proc.pid not in child_pids()


# ------------------------------------------------------------------------------------------
# The training worker and the experiments' facts


def test_ddp_matches_one_process_on_the_whole_batch_in_float32():
    spec = replace(SMALL, amp_dtype="float32")
    ranks = launch(train_worker, 2, (spec,), timeout=120, show_output=False)
    single = train_single(spec)
    assert ranks[0]["digest"] == ranks[1]["digest"]
    assert torch.allclose(ranks[0]["params"], single["params"], rtol=1e-5, atol=1e-6)
    assert ranks[0]["calls"] == [1, 1, 1]


def test_no_sync_saves_all_reduces_and_fp16_compress_halves_the_bytes():
    results = {}
    for name, spec in {
        "no_sync": replace(SMALL, accum_steps=4),
        "sync": replace(SMALL, accum_steps=4, use_no_sync=False),
        "compress": replace(SMALL, accum_steps=4, fp16_compress=True),
    }.items():
        results[name] = launch(train_worker, 2, (spec,), timeout=120, show_output=False)[0]
    assert results["no_sync"]["calls"] == [1, 1, 1]
    assert results["sync"]["calls"] == [4, 4, 4]
    assert results["sync"]["bytes"][0] == 4 * results["no_sync"]["bytes"][0]
    assert 2 * results["compress"]["bytes"][0] == results["no_sync"]["bytes"][0]
    assert torch.allclose(results["no_sync"]["params"], results["sync"]["params"], atol=1e-6)


def test_an_inf_on_one_rank_makes_every_rank_skip():
    spec = replace(SMALL, steps=4, poison=((2, 1),))
    r0, r1 = launch(train_worker, 2, (spec,), timeout=120, show_output=False)
    assert r0["local_nonfinite"] == [False] * 4
    assert r1["local_nonfinite"] == [False, False, True, False]
    assert r0["reduced_nonfinite"] == r1["reduced_nonfinite"] == [False, False, True, False]
    assert r0["skipped"] == r1["skipped"] == [False, False, True, False]
    assert r0["scales"] == r1["scales"] and r0["scales"][2] == r0["scales"][1] / 2
    assert r0["digest"] == r1["digest"]


def test_sync_batchnorm_refuses_cpu_ranks():
    spec = replace(SMALL, batch_norm=True, sync_bn=True)
    with pytest.raises(RankFailed, match="SyncBatchNorm") as info:
        launch(train_worker, 2, (spec,), timeout=120, show_output=False)
    assert info.value.exc_type == "ValueError"


def test_sync_batchnorm_forward_refuses_cpu_tensors():
    """SyncBatchNorm's own forward refuses CPU input in a process group, and so does DDP."""
    for found in launch(sync_bn_cpu_probe, 2, timeout=60, show_output=False):
        assert found["forward"].startswith("ValueError: SyncBatchNorm expected input tensor")
        assert found["ddp"] == "ValueError: SyncBatchNorm layers only work with GPU modules"


def test_fp16_sum_overflows_unless_divided_first():
    results = launch(fp16_sum_worker, 2, (40000.0,), timeout=60, show_output=False)
    for r in results:
        assert r["naive"] == float("inf") and r["divide_first"] == 40000.0


def test_hello_worker_reports_each_rank():
    results = launch(hello_worker, 2, timeout=60, show_output=False)
    assert [r["rank"] for r in results] == [0, 1]
    assert {r["sum_of_ranks"] for r in results} == {1.0}
    assert results[0]["pid"] != results[1]["pid"] != os.getpid()


def test_command_line_launches_its_own_ranks(capsys):
    assert main(["--world-size", "2", "--steps", "2", "--global-batch", "32"]) == 0
    out = capsys.readouterr().out
    assert "bit-identical on every rank" in out and "backend gloo" in out


def test_torchrun_runs_the_module():
    """The documented torchrun command (standalone: a free port, never a fixed one)."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "course.ddp_train",
        "--steps",
        "1",
        "--global-batch",
        "32",
        "--backend",
        "gloo",
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchrun: 2 ranks, backend gloo" in done.stdout
    assert "bit-identical on every rank" in done.stdout


def _script_worker(rank, world_size, config):
    """A worker written the way the lesson's solution is: helpers and module aliases it uses."""
    model = config.make_model()
    ddp_model = _DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        micro = zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps), strict=True)
        for i, (xm, ym) in enumerate(micro):
            with _ctx.nullcontext() if i == config.accum_steps - 1 else ddp_model.no_sync():
                _micro_step(ddp_model, scaler, config, xm, ym)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scales.append(scaler.get_scale() * _ONE)
    return {"state_dict": model.state_dict(), "scales": scales}


def _micro_step(ddp_model, scaler, config, xm, ym):
    with torch.amp.autocast(config.device_type, dtype=config.amp_dtype):
        loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
    scaler.scale(loss).backward()


def test_worker_script_copies_what_the_worker_uses():
    text = worker_script(_script_worker, AmpDDPConfig(), "train.py")
    compile(text, "train.py", "exec")
    assert "import contextlib as _ctx" in text and "_ONE = 1.0" in text
    assert "from torch.nn.parallel.distributed import DistributedDataParallel as _DDP" in text
    assert "def _micro_step(" in text and "class AmpDDPConfig" in text
    assert "from course" not in text and "import course" not in text  # needs only torch
    assert text.index("def _micro_step(") < text.index("def _script_worker(")
    with pytest.raises(ValueError, match="_UNWRITABLE"):
        worker_script(_uses_an_object, AmpDDPConfig(), "train.py")


def _uses_an_object(rank, world_size, config):
    return _UNWRITABLE


def test_worker_script_runs_under_torchrun_with_the_launchers_result(tmp_path):
    """The script the lesson writes: 2 gloo ranks under torchrun, the same weights as launch."""
    config = AmpDDPConfig(steps=3, poison=((1, 3),))
    script = tmp_path / "train.py"
    script.write_text(worker_script(_script_worker, config, script.name))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "2", str(script)]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    here = launch(_script_worker, 2, (config,), timeout=120, show_output=False)
    digest = state_digest(here[0]["state_dict"])
    assert "2 ranks, backend gloo" in done.stdout
    assert f"rank 0 on {os.uname().nodename} (cpu): final weights {digest}" in done.stdout
    assert f"rank 1 on {os.uname().nodename} (cpu): final weights {digest}" in done.stdout
    assert f"scale after each step: {here[0]['scales']}" in done.stdout


# ------------------------------------------------------------------------------------------
# What the graders use


def test_amp_config_is_deterministic_and_poisons_the_right_row():
    cfg = AmpDDPConfig(poison=((1, 5),))
    x0, y0 = cfg.batch(0)
    assert torch.equal(x0, cfg.batch(0)[0]) and torch.equal(y0, cfg.batch(0)[1])
    assert torch.isfinite(x0).all()
    x1, _ = cfg.batch(1)
    assert torch.isinf(x1[5]).all() and torch.isfinite(torch.cat([x1[:5], x1[6:]])).all()
    a, b = cfg.make_model().state_dict(), cfg.make_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert cfg.micro_batch_size(2) == 8
    with pytest.raises(ValueError):
        cfg.micro_batch_size(3)
    with pytest.raises(ValueError):
        AmpDDPConfig(global_batch=30, accum_steps=4)
    assert not AmpDDPConfig(amp_dtype=torch.float32).amp_enabled
    assert amp_tolerance(torch.float32) < amp_tolerance(torch.float16)
    assert amp_tolerance(torch.float16) < amp_tolerance(torch.bfloat16)


def _count_probe(rank, world_size, use_no_sync):
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = AmpDDPConfig(steps=2, accum_steps=4)
    with count_ddp_allreduces() as count:
        model = DDP(cfg.make_model())
        for step in range(cfg.steps):
            x, y = cfg.batch(step)
            for i, (xm, ym) in enumerate(zip(x.chunk(4), y.chunk(4), strict=True)):
                if use_no_sync and i < 3:
                    with model.no_sync():
                        cfg.loss_fn(model(xm), ym).backward()
                else:
                    cfg.loss_fn(model(xm), ym).backward()
    with record_collectives() as sent:
        dist.all_reduce(torch.ones(2, dtype=torch.float16))
        dist.broadcast(torch.ones(3), src=0)
    return {"models": count.models, "calls": count.calls, "sent": sent, "inputs": count.inputs}


def test_graders_instruments_count_all_reduces_and_record_dtypes():
    with_no_sync = launch(_count_probe, 2, (True,), timeout=120, show_output=False)
    without = launch(_count_probe, 2, (False,), timeout=120, show_output=False)
    assert with_no_sync[0]["models"] == 1
    assert with_no_sync[0]["calls"] == 2 and without[0]["calls"] == 8
    assert len(with_no_sync[1]["inputs"]) == 8
    x, _ = AmpDDPConfig(steps=2, accum_steps=4).batch(1)
    assert torch.equal(with_no_sync[1]["inputs"][-1], x.chunk(4)[3])
    assert with_no_sync[1]["sent"] == [("all_reduce", torch.float16), ("broadcast", torch.float32)]
    from torch.nn.parallel import DistributedDataParallel as DDP

    assert DDP.__init__.__name__ == "__init__", "the counter was not removed"
    assert DDP.forward.__name__ == "forward", "the input recorder was not removed"
    assert dist.all_reduce.__name__ == "all_reduce", "the spy was not removed"


def _sum_probe(rank, world_size, cases):
    out = []
    for case in cases:
        mine = case[rank].clone()
        dist.all_reduce(mine)
        out.append(mine)
    return out


def _group_sum(tensor, group=None):
    dist.all_reduce(tensor, group=group)
    return tensor


def _world_sum(tensor, group=None):
    dist.all_reduce(tensor)  # ignores group
    return tensor


def test_probe_then_alone_runs_the_probe_then_each_rank_in_its_own_group():
    cases = [[torch.tensor([1.0]), torch.tensor([2.0])]]
    alone = [torch.tensor([10.0]), torch.tensor([20.0])]
    for fn, own in ((_group_sum, [10.0, 20.0]), (_world_sum, [30.0, 30.0])):
        ranks = launch(probe_then_alone, 2, (_sum_probe, fn, cases, alone), show_output=False)
        assert [r[0][0].item() for r in ranks] == [3.0, 3.0]
        assert [r[1].item() for r in ranks] == own
    assert alone[0].item() == 10.0  # each rank's tensor was a copy


# ------------------------------------------------------------------------------------------
# The widget


def test_widget_controls_relaunch_and_change_what_is_shown():
    explorer = DDPExplorer(world_size=2, accum_steps=2, steps=6)
    assert len(explorer.results) == 2 and "identical" in explorer.stats.value
    # One backend for every world size the slider offers (no switching between devices).
    assert explorer.backend == pick_backend(explorer.world_size.max)
    assert explorer.seconds > 0 and f"took {explorer.seconds:.1f} s" in explorer.stats.value
    lines_before = len(explorer.ax_loss.lines)
    explorer.world_size.value = 3
    assert len(explorer.results) == 3 and len(explorer.ax_loss.lines) == lines_before + 1
    assert "3 rank(s)" in explorer.stats.value
    explorer.accum_steps.value = 4
    assert explorer.results[0]["calls"][-1] == 1 and "x 4 micro-batch" in explorer.stats.value
    explorer.poison.value = True
    assert all(r["skipped"][DDPExplorer.POISON_STEP] for r in explorer.results)
    assert f"skipped steps: <b>[{DDPExplorer.POISON_STEP}]" in explorer.stats.value


def test_spawned_ranks_run_importable_workers():
    """The start method GPU ranks use: fresh interpreters, so the worker must be importable."""
    results = launch(
        hello_worker, 2, start_method="spawn", threads=1, timeout=300, show_output=False
    )
    assert [r["rank"] for r in results] == [0, 1] and results[0]["backend"] == "gloo"


def test_init_torchrun_takes_nccl_only_with_a_gpu_for_every_local_rank(monkeypatch):
    """One GPU and two torchrun ranks: gloo on the CPU (rank 1 has no GPU of its own)."""
    import course.launch as launch_module

    calls = []
    monkeypatch.setattr(launch_module.dist, "init_process_group", lambda b, **k: calls.append(b))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(launch_module.dist, "is_nccl_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert launch_module.init_torchrun() == torch.device("cpu")
    with pytest.raises(SystemExit, match="a GPU per rank"):
        launch_module.init_torchrun("nccl")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert launch_module.init_torchrun() == torch.device("cuda", 0)
    assert launch_module.init_torchrun("gloo") == torch.device("cpu")
    assert calls == ["gloo", "nccl", "gloo"]


def test_worker_script_drops_the_solution_markers(tmp_path, monkeypatch):
    import importlib

    from course.multigpu import AmpDDPConfig, worker_script

    marker = "### " + "BEGIN SOLUTION"  # spelled apart: the student kit refuses the marker itself
    (tmp_path / "student_cell.py").write_text(
        "def ddp_amp_worker(rank, world_size, config):\n"
        f"    {marker}\n"
        "    answer = 42\n"
        f"    {marker.replace('BEGIN', 'END')}\n"
        "    return {'answer': answer}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    worker = importlib.import_module("student_cell").ddp_amp_worker
    script = worker_script(worker, AmpDDPConfig(), "train.py")
    assert "SOLUTION" not in script
    assert "    answer = 42\n" in script
    compile(script, "train.py", "exec")


def test_every_fp16_mean_draw_has_four_ranks_where_a_fixed_half_prescale_overflows():
    # The hidden test's second launch: on 4 ranks, a prescale of 1/2 before the float16 cast
    # (exact on 1 or 2 ranks) overflows in every element and every summation order, while the
    # shares (value / 4) sum to a finite mean in every order.
    import itertools

    from grader.lessons.l06_multi_gpu.inputs import FOUR, fp16_cases

    def float16_sum(parts, order):
        total = parts[order[0]]
        for i in order[1:]:
            total = total + parts[i]
        return total

    assert FOUR == 4
    for seed in range(200):
        four = fp16_cases(seed)[3]
        case, _, _ = four[0]
        assert len(case) == FOUR and all(len(c) == FOUR for c, _, _ in four)
        halves = [(t / 2).half() for t in case]
        shares = [(t / FOUR).half() for t in case]
        for order in itertools.permutations(range(FOUR)):
            assert bool(float16_sum(halves, order).isinf().all()), seed
            assert bool(float16_sum(shares, order).isfinite().all()), seed


def _float16_sums(shares, order):
    """The float16 sum of the rounded shares in one order, as an all-reduce might add them."""
    total = shares[order[0]]
    for i in order[1:]:
        total = total + shares[i]
    return total


def test_every_fp16_mean_draw_has_subnormal_shares_where_a_fixed_prescale_misses():
    # On 2 and on 4 ranks, every draw holds shares that are odd multiples of 2^-24: the mean of
    # value / world size is exact in every order of the float16 sum, while a fixed prescale of
    # 1/4, 1/8 or 1/16 (larger than the world size, rescaled after the sum) misses every element
    # by at least 2^-24 in every order.
    import itertools

    from grader.lessons.l06_multi_gpu.inputs import FOUR, fp16_cases

    for seed in range(200):
        cases, kinds, _, four = fp16_cases(seed)
        exact_two = [c for c, (_, exact) in zip(cases, kinds, strict=True) if exact]
        exact_four = [c for c, _, exact in four if exact]
        subnormal = [
            c
            for c in exact_two + exact_four
            if all(bool(((t / len(c)).abs() < 2.0**-14).all()) for t in c)
        ]
        assert {len(c) for c in subnormal} == {2, FOUR}, seed
        for case in subnormal:
            ranks = len(case)
            mean = torch.stack([t.double() / ranks for t in case]).sum(0)
            for order in itertools.permutations(range(ranks)):
                right = _float16_sums([(t / ranks).half() for t in case], order).double()
                assert torch.equal(right, mean), seed
                for c in (4, 8, 16):
                    if c <= ranks:
                        continue
                    wrong = _float16_sums([(t / c).half() for t in case], order).double()
                    assert bool(((wrong * c / ranks - mean).abs() >= 2.0**-24).all()), (seed, c)


def test_no_fp16_mean_case_can_overflow_a_correct_answer():
    # The task promises no overflow as long as the float16 sums of the rounded shares stay
    # finite: in every hidden case, on 2 and on 4 ranks, they do in every order.
    import itertools

    from grader.lessons.l06_multi_gpu.inputs import fp16_cases

    for seed in range(200):
        cases, _, _, four = fp16_cases(seed)
        for case in cases + [c for c, _, _ in four]:
            shares = [(t / len(case)).half() for t in case]
            for order in itertools.permutations(range(len(case))):
                assert bool(_float16_sums(shares, order).isfinite().all()), seed
