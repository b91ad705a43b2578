"""Wrong answers to lesson 06's exercises that the graders must reject."""

LESSON = "06-multi-gpu"

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
}
