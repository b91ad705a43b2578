"""Lesson 06's content: the graded worker's configuration, its tolerances, the widget.

Processes are started by :func:`course.launch.launch`; the training worker the widget runs is
:func:`course.ddp_train.train_worker`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from course.launch import LaunchError, describe_backend, launch, pick_backend

# --------------------------------------------------------------------------------------------
# What the graded worker trains


@dataclass(frozen=True)
class AmpDDPConfig:
    """What ``ddp_amp_worker`` trains: model, data, optimizer and scaler settings (lesson 06).

    Every rank builds the same model from ``seed`` and draws the same *global* batch for a step
    with :meth:`batch`; rank ``r`` of ``W`` trains on the ``r``-th of ``W`` equal contiguous
    chunks of it, split into ``accum_steps`` equal micro-batches. ``amp_dtype`` float32 means
    autocast is off (``amp_enabled`` is False). ``poison`` lists ``(step, index)`` pairs: that
    row of that step's global batch is set to inf, so whichever rank holds it overflows.
    """

    sizes: tuple[int, ...] = (16, 32, 4)
    steps: int = 4
    global_batch: int = 32
    accum_steps: int = 2
    lr: float = 0.1
    momentum: float = 0.9
    amp_dtype: torch.dtype = torch.float16
    device_type: str = "cpu"
    init_scale: float = 2.0**10
    growth_interval: int = 2
    seed: int = 0
    poison: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.global_batch % self.accum_steps:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of accum_steps "
                f"{self.accum_steps}"
            )

    @property
    def amp_enabled(self) -> bool:
        """Whether autocast is on (False when ``amp_dtype`` is float32)."""
        return self.amp_dtype != torch.float32

    def micro_batch_size(self, world_size: int) -> int:
        """Rows per micro-batch on each rank; ValueError if the batch does not split evenly."""
        if self.global_batch % (world_size * self.accum_steps):
            raise ValueError(
                f"a global batch of {self.global_batch} does not split into {world_size} ranks "
                f"x {self.accum_steps} micro-batches"
            )
        return self.global_batch // (world_size * self.accum_steps)

    def make_model(self) -> nn.Module:
        """The model, in float32 on the CPU; the same weights on every call."""
        torch.manual_seed(self.seed)
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:], strict=True)):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(self.sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers)

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """SGD with momentum over ``params``."""
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch ``(x, y)`` of optimizer step ``step`` (float32 and long, CPU)."""
        gen = torch.Generator().manual_seed(self.seed * 100_003 + step)
        x = torch.randn(self.global_batch, self.sizes[0], generator=gen)
        y = torch.randint(0, self.sizes[-1], (self.global_batch,), generator=gen)
        for poison_step, index in self.poison:
            if poison_step == step:
                x[index] = float("inf")
        return x, y

    @staticmethod
    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the rows given."""
        return nn.functional.cross_entropy(logits, target)


def amp_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a distributed run with a one-process run (lesson 06).

    Splitting a batch over ranks and micro-batches changes the order of roundings; in float32
    that costs a few ulps, under bfloat16 or float16 autocast more. The graders use these.
    """
    if dtype == torch.float32:
        return 1e-4, 1e-5
    if dtype == torch.bfloat16:
        return 2e-2, 2e-3
    return 5e-3, 5e-4


# --------------------------------------------------------------------------------------------
# The lesson's widget


class DDPExplorer:
    """Lesson 06's widget: world size and accumulation controls over a live data-parallel run.

    Every change launches a short run of :func:`course.ddp_train.train_worker` (real processes)
    and redraws each rank's loss and loss scale, with the all-reduce calls and bytes per step.
    The results of the last run are kept in ``results`` so tests can drive the controls and
    see what changed.
    """

    GLOBAL_BATCH = 192  # splits evenly into 1-4 ranks x 1, 2, 4 or 8 micro-batches
    POISON_STEP = 5

    def __init__(
        self,
        data: tuple[torch.Tensor, torch.Tensor] | None = None,
        world_size: int = 2,
        accum_steps: int = 2,
        poison: bool = False,
        steps: int = 12,
        backend: str | None = None,
    ) -> None:
        import ipywidgets as W

        from course.ddp_train import digits_train
        from course.plotting import new_figure

        self.data = digits_train() if data is None else data
        self.steps = steps
        self.backend = backend
        self.results: list[dict] = []
        self.world_size = W.IntSlider(
            value=world_size, min=1, max=4, description="world size", continuous_update=False
        )
        self.accum_steps = W.Dropdown(
            options=[1, 2, 4, 8], value=accum_steps, description="micro-batches"
        )
        self.poison = W.Checkbox(
            value=poison, description=f"inf on the last rank at step {self.POISON_STEP}"
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax_loss, self.ax_scale) = new_figure(9.5, 3.4, ncols=2)
        for control in (self.world_size, self.accum_steps, self.poison):
            control.observe(lambda change: self.update(), names="value")
        self.widget = W.VBox(
            [W.HBox([self.world_size, self.accum_steps, self.poison]), self.stats, self.output]
        )
        self.update()

    def spec(self):
        """The :class:`course.ddp_train.TrainSpec` the controls describe."""
        from course.ddp_train import TrainSpec

        ws = self.world_size.value
        poison = ((self.POISON_STEP, ws - 1),) if self.poison.value else ()
        return TrainSpec(
            steps=self.steps,
            global_batch=self.GLOBAL_BATCH,
            accum_steps=self.accum_steps.value,
            init_scale=2.0**16,
            growth_interval=4,
            poison=poison,
        )

    def update(self) -> None:
        """Run the ranks with the current controls and redraw."""
        from IPython.display import display

        from course.ddp_train import train_worker

        ws = self.world_size.value
        backend = pick_backend(ws, self.backend)
        spec = self.spec()
        try:
            self.results = launch(
                train_worker,
                ws,
                (spec, self.data),
                backend=backend.name,
                timeout=120,
                show_output=False,
            )
        except LaunchError as exc:
            self.results = []
            self.stats.value = f"<pre>the launch failed: {exc}</pre>"
            return
        steps = range(spec.steps)
        self.ax_loss.clear()
        self.ax_scale.clear()
        for res in self.results:
            self.ax_loss.plot(steps, res["losses"], marker=".", label=f"rank {res['rank']}")
            self.ax_scale.step(
                steps,
                res["scales"],
                where="post",
                label=f"rank {res['rank']}",
                linewidth=2 + 2 * (ws - 1 - res["rank"]),
                alpha=0.7,
            )
        self.ax_loss.set(xlabel="optimizer step", ylabel="local loss", title="each rank's loss")
        self.ax_scale.set(
            xlabel="optimizer step",
            ylabel="scale after the step",
            yscale="log",
            title="each rank's loss scale",
        )
        self.ax_loss.legend(fontsize="small")
        self.ax_scale.legend(fontsize="small")
        r0 = self.results[0]
        skipped = [s for s, flag in enumerate(r0["skipped"]) if flag]
        same = len({res["digest"] for res in self.results}) == 1
        micro = spec.global_batch // (ws * spec.accum_steps)
        self.stats.value = (
            f"{describe_backend(backend, ws)}<br>"
            f"{spec.global_batch} samples per step = {ws} rank(s) x {spec.accum_steps} "
            f"micro-batch(es) of {micro}; all-reduce calls per step: <b>{r0['calls'][-1]}</b> "
            f"({r0['bytes'][-1] / 1024:.0f} KiB); skipped steps: <b>{skipped or 'none'}</b>; "
            f"final weights {'<b>identical</b>' if same else '<b>DIFFERENT</b>'} on every rank"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
