"""Wrong answers to lesson 06's exercises that the graders must reject, and valid ones they keep."""

VARIANTS = {
    "ddp_loss_not_divided": (
        "ddp_amp_worker",
        """
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: each micro-batch's loss is not divided by accum_steps, so the accumulated gradient
    # is accum_steps times the mean.
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        micro = list(zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else ddp_model.no_sync():
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    loss = config.loss_fn(ddp_model(xm), ym)
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "ddp_without_no_sync": (
        "ddp_amp_worker",
        """
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: no no_sync(), so DDP all-reduces after every micro-batch (right weights, wasted
    # communication).
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        for xm, ym in zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)):
            with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                    enabled=config.amp_enabled):
                loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "ddp_every_rank_whole_batch": (
        "ddp_amp_worker",
        """
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: every rank trains on the whole global batch, so no data is split. The averaged
    # gradient is the same as one process's, so the weights match; only the work is repeated
    # world_size times (the graders look at the rows each rank feeds its model).
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        micro = list(zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else ddp_model.no_sync():
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "fp16_cast_then_divide": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: casts to float16 before dividing by the world size, so a value above 65504 is
    # already inf although its share (value / world size) would fit.
    buffer = tensor.half() / dist.get_world_size(group)
    dist.all_reduce(buffer, group=group)
    return buffer.float()
""",
    ),
    "fp16_float32_on_the_wire": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: rounds to float16 but communicates float32, so nothing is saved on the wire.
    buffer = (tensor / dist.get_world_size(group)).half().float()
    dist.all_reduce(buffer, group=group)
    return buffer
""",
    ),
    "fp16_sum_then_divide": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: sums in float16 before dividing, so 40000 + 40000 overflows to inf.
    buffer = tensor.half()
    dist.all_reduce(buffer, group=group)
    return buffer.float() / dist.get_world_size(group)
""",
    ),
    "fp16_fixed_half_prescale": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: prescales by a fixed 1/2 before the float16 cast and divides the rest out after
    # the sum; exact on 1 or 2 ranks, but on 4 ranks holding 40000 each the float16 sum of the
    # halves is 80000: inf.
    buffer = (tensor.float() / 2).half()
    dist.all_reduce(buffer, group=group)
    return buffer.float() * 2 / dist.get_world_size(group)
""",
    ),
    "fp16_fixed_quarter_prescale": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: prescales by a fixed 1/4 and rescales after the sum. Exact on 4 ranks, and on 2 it
    # differs only where a quarter of a value is below float16's smallest subnormal step.
    buffer = (tensor.float() / 4).half()
    dist.all_reduce(buffer, group=group)
    return buffer.float() * 4 / dist.get_world_size(group)
""",
    ),
    "fp16_fixed_eighth_prescale": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: prescales by a fixed 1/8 and rescales after the sum; dividing by a power of two
    # changes float16 rounding only in the subnormals.
    buffer = (tensor.float() / 8).half()
    dist.all_reduce(buffer, group=group)
    return buffer.float() * 8 / dist.get_world_size(group)
""",
    ),
    "bn_average_of_rank_means": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Wrong: averages each rank's mean and mean square, which weights a rank with 1 sample like
    # a rank with 100 (right only when every rank has the same batch size).
    x32 = x.float()
    dims = [d for d in range(x32.dim()) if d != 1]
    world_size = dist.get_world_size(group)
    mean = x32.mean(dim=dims)
    square = (x32 * x32).mean(dim=dims)
    dist.all_reduce(mean, group=group)
    dist.all_reduce(square, group=group)
    mean, square = mean / world_size, square / world_size
    return mean, square - mean * mean
""",
    ),
    "bn_unbiased_variance": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Wrong: divides by count - 1 (torch.var's default); BatchNorm normalizes with the biased
    # variance, dividing by the count.
    x32 = x.float()
    dims = [d for d in range(x32.dim()) if d != 1]
    shape = [1] * x32.dim()
    shape[1] = x32.shape[1]
    count = torch.tensor([x32.numel() // x32.shape[1]], dtype=torch.float32)
    packed = torch.cat([count, x32.sum(dim=dims)])
    dist.all_reduce(packed, group=group)
    mean = packed[1:] / packed[0]
    squares = ((x32 - mean.view(shape)) ** 2).sum(dim=dims)
    dist.all_reduce(squares, group=group)
    return mean, squares / (packed[0] - 1)
""",
    ),
    "bn_reduce_in_fp16": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Wrong: reduces in the input's dtype; for float16 input the per-channel sums overflow.
    dims = [d for d in range(x.dim()) if d != 1]
    shape = [1] * x.dim()
    shape[1] = x.shape[1]
    count = torch.tensor([x.numel() // x.shape[1]], dtype=x.dtype)
    packed = torch.cat([count, x.sum(dim=dims)])
    dist.all_reduce(packed, group=group)
    mean = packed[1:] / packed[0]
    squares = ((x - mean.view(shape)) ** 2).sum(dim=dims)
    dist.all_reduce(squares, group=group)
    return mean.float(), (squares / packed[0]).float()
""",
    ),
    "fp16_ignores_group": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: ignores the group argument: divides by the default group's size and all-reduces
    # over every rank, so a mean over a sub-group comes out as the mean over all ranks.
    buffer = (tensor.float() / dist.get_world_size()).half()
    dist.all_reduce(buffer)
    return buffer.float()
""",
    ),
    "fp16_group_size_of_world": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: sums over the group but divides by the size of the default group, which is the
    # group's size only when the group is every rank.
    buffer = (tensor.float() / dist.get_world_size()).half()
    dist.all_reduce(buffer, group=group)
    return buffer.float()
""",
    ),
    "bn_ignores_group": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Wrong: all-reduces over the default group whatever group is passed, so the statistics of
    # a sub-group include every rank's samples.
    x32 = x.float()
    dims = [d for d in range(x32.dim()) if d != 1]
    shape = [1] * x32.dim()
    shape[1] = x32.shape[1]
    count = torch.tensor([x32.numel() // x32.shape[1]], dtype=torch.float32)
    packed = torch.cat([count, x32.sum(dim=dims)])
    dist.all_reduce(packed)
    mean = packed[1:] / packed[0]
    squares = ((x32 - mean.view(shape)) ** 2).sum(dim=dims)
    dist.all_reduce(squares)
    return mean, squares / packed[0]
""",
    ),
    "ddp_backward_under_autocast": (
        "ddp_amp_worker",
        """
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: the backward is inside the autocast block. The weights come out the same here, but
    # autocast is meant for the forward pass and the loss only; backward ops run in the dtypes
    # autocast chose for their forward ops without it.
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        micro = list(zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else ddp_model.no_sync():
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
                    scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "fp16_all_gather_then_sum": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Wrong: gathers every rank's float16 share and sums them locally in float32. The wire is
    # float16 and the mean is close, but every rank receives world_size tensors instead of one
    # all-reduced tensor.
    world_size = dist.get_world_size(group)
    share = (tensor / world_size).half()
    parts = [torch.empty_like(share) for _ in range(world_size)]
    dist.all_gather(parts, share, group=group)
    return torch.stack([p.float() for p in parts]).sum(dim=0)
""",
    ),
    "bn_one_pass_float32": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Wrong: E[x^2] - E[x]^2 from one float32 all-reduce of sums and sums of squares. Right when
    # the mean is small, but the subtraction cancels when the mean is large against the spread
    # (values near 500 with a spread near 1 lose most of the variance's digits).
    x32 = x.float()
    c = x32.shape[1]
    dims = [d for d in range(x32.dim()) if d != 1]
    n = torch.tensor([float(x32.numel() // c)])
    packed = torch.cat([n, x32.sum(dim=dims), (x32 * x32).sum(dim=dims)])
    dist.all_reduce(packed, group=group)
    mean = packed[1:c + 1] / packed[0]
    return mean, packed[c + 1:] / packed[0] - mean * mean
""",
    ),
    "ddp_sgd_without_momentum": (
        "ddp_amp_worker",
        """
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: an optimizer of its own, SGD at config.lr without config.momentum. The visible tests
    # compare the worker with itself (2 micro-batches against 1), so they cannot tell.
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=config.lr)
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        micro = list(zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else ddp_model.no_sync():
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "ddp_scaler_growth_interval_fixed": (
        "ddp_amp_worker",
        """
import contextlib

from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Wrong: the GradScaler grows every 2 steps whatever config.growth_interval says (2 is what
    # the visible tests use).
    model = config.make_model()
    ddp_model = DDP(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=2)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        micro = list(zip(x.chunk(config.accum_steps), y.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(micro):
            with contextlib.nullcontext() if i == len(micro) - 1 else ddp_model.no_sync():
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    loss = config.loss_fn(ddp_model(xm), ym) / config.accum_steps
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
}

VALID = {
    "ddp_unscale_then_step": (
        "ddp_amp_worker",
        """
from contextlib import nullcontext

from torch.nn.parallel import DistributedDataParallel


def ddp_amp_worker(rank, world_size, config):
    # Valid: the optimizer gets the plain model's parameters (the same tensors DDP holds), the
    # gradients are unscaled explicitly before scaler.step, and the loss scaling is written with
    # a separate variable.
    model = config.make_model()
    ddp_model = DistributedDataParallel(model)
    optimizer = config.make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(device=config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        x, y = config.batch(step)
        mine_x = x.chunk(world_size)[rank].chunk(config.accum_steps)
        mine_y = y.chunk(world_size)[rank].chunk(config.accum_steps)
        for i in range(config.accum_steps):
            context = ddp_model.no_sync() if i + 1 < config.accum_steps else nullcontext()
            with context:
                with torch.autocast(device_type=config.device_type, dtype=config.amp_dtype,
                                    enabled=config.amp_enabled):
                    logits = ddp_model(mine_x[i])
                    loss = config.loss_fn(logits, mine_y[i]) / config.accum_steps
                scaled = scaler.scale(loss)
                scaled.backward()
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scales.append(scaler.get_scale())
    return {"state_dict": model.state_dict(), "scales": scales}
""",
    ),
    "bn_all_gather_like_syncbn": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Valid: SyncBatchNorm's road. Each rank's count, mean and sum of squared deviations from its
    # own mean are all-gathered (same shape on every rank), then merged rank by rank as
    # batch_norm_gather_stats_with_counts does (Chan et al.), in float32.
    x32 = x.float()
    c = x32.shape[1]
    flat = x32.transpose(0, 1).reshape(c, -1)
    n = float(flat.shape[1])
    mean = flat.mean(dim=1)
    m2 = ((flat - mean[:, None]) ** 2).sum(dim=1)
    mine = torch.cat([torch.tensor([n]), mean, m2])
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    total, avg, var_n = 0.0, torch.zeros(c), torch.zeros(c)
    for stats in every:
        count, m, v = stats[0], stats[1:c + 1], stats[c + 1:]
        factor = 1.0 / (total + count)
        var_n = var_n + v + (avg - m) ** 2 * total * count * factor
        avg = total * factor * avg + count * factor * m
        total = total + count
    return avg, var_n / total
""",
    ),
    "ddp_slices_and_module_state": (
        "ddp_amp_worker",
        """
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_amp_worker(rank, world_size, config):
    # Valid: slices the share by index, splits it with torch.split, enters no_sync() only for
    # the first micro-batches, multiplies by 1 / accum_steps, returns the wrapped module's state.
    ddp_model = DDP(config.make_model())
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    share = config.global_batch // world_size
    size = share // config.accum_steps
    scales = []

    def micro_step(xm, ym):
        with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                enabled=config.amp_enabled):
            loss = config.loss_fn(ddp_model(xm), ym) * (1.0 / config.accum_steps)
        scaler.scale(loss).backward()

    for step in range(config.steps):
        x, y = config.batch(step)
        xs = torch.split(x[rank * share:(rank + 1) * share], size)
        ys = torch.split(y[rank * share:(rank + 1) * share], size)
        with ddp_model.no_sync():
            for xm, ym in zip(xs[:-1], ys[:-1]):
                micro_step(xm, ym)
        micro_step(xs[-1], ys[-1])
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        scales.append(float(scaler.get_scale()))
    return {"scales": scales, "state_dict": ddp_model.module.state_dict()}
""",
    ),
    "ddp_exit_stack": (
        "ddp_amp_worker",
        """
import contextlib

import torch.nn.parallel


def ddp_amp_worker(rank, world_size, config):
    # Valid: an ExitStack chooses the context, gradients are zeroed (not set to None) before
    # each step, and the state dict is copied out.
    model = config.make_model()
    ddp_model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = config.make_optimizer(ddp_model.parameters())
    scaler = torch.amp.GradScaler(config.device_type, init_scale=config.init_scale,
                                  growth_interval=config.growth_interval)
    scales = []
    for step in range(config.steps):
        optimizer.zero_grad(set_to_none=False)
        x, y = config.batch(step)
        x_share, y_share = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        pieces = list(zip(x_share.chunk(config.accum_steps), y_share.chunk(config.accum_steps)))
        for i, (xm, ym) in enumerate(pieces):
            with contextlib.ExitStack() as stack:
                if i < len(pieces) - 1:
                    stack.enter_context(ddp_model.no_sync())
                with torch.amp.autocast(config.device_type, dtype=config.amp_dtype,
                                        enabled=config.amp_enabled):
                    out = ddp_model(xm)
                    loss = config.loss_fn(out, ym) / config.accum_steps
                scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    return {"state_dict": {k: v.clone() for k, v in model.state_dict().items()},
            "scales": scales}
""",
    ),
    "fp16_mul_and_to": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Valid: multiplies by 1 / world_size (exact for 2 ranks) and uses .to() and ReduceOp.SUM.
    share = tensor.mul(1.0 / dist.get_world_size(group=group)).to(torch.float16)
    dist.all_reduce(share, op=dist.ReduceOp.SUM, group=group)
    return share.to(torch.float32)
""",
    ),
    "fp16_double_then_half": (
        "fp16_allreduce_mean",
        """
def fp16_allreduce_mean(tensor, group=None):
    # Valid: divides in float64 before casting; the share rounds to the same float16.
    wire = torch.div(tensor.double(), dist.get_world_size(group)).half().contiguous()
    dist.all_reduce(wire, group=group)
    return wire.float().reshape(tensor.shape)
""",
    ),
    "bn_float64_one_pass": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Valid: one all-reduce of count, sum and sum of squares, in float64 (so E[x^2] - E[x]^2
    # loses nothing that matters), returned as float32.
    c = x.shape[1]
    flat = x.detach().double().transpose(0, 1).reshape(c, -1)
    stats = torch.cat([torch.full((1,), float(flat.shape[1]), dtype=torch.float64),
                       flat.sum(dim=1), (flat * flat).sum(dim=1)])
    dist.all_reduce(stats, group=group)
    n, s, q = stats[0], stats[1:c + 1], stats[c + 1:]
    mean = s / n
    return mean.float(), (q / n - mean * mean).float()
""",
    ),
    "bn_merge_local_moments": (
        "sync_bn_stats",
        """
def sync_bn_stats(x, group=None):
    # Valid: each rank's count, mean and sum of squared deviations from its own mean, merged
    # (Chan et al.): M2 = sum of M2_r + n_r * (mean_r - mean)^2, in float32.
    dims = [d for d in range(x.dim()) if d != 1]
    x32 = x.to(torch.float32)
    n = torch.tensor(float(x32.numel() // x32.shape[1]))
    local_mean = x32.mean(dim=dims)
    shape = [1] * x32.dim()
    shape[1] = -1
    local_m2 = ((x32 - local_mean.view(shape)) ** 2).sum(dim=dims)
    total = n.clone()
    dist.all_reduce(total, group=group)
    weighted = local_mean * n
    dist.all_reduce(weighted, group=group)
    mean = weighted / total
    m2 = local_m2 + n * (local_mean - mean) ** 2
    dist.all_reduce(m2, group=group)
    return mean, m2 / total
""",
    ),
}
