"""Wrong answers to lesson 07's exercises that the graders must reject, and valid ones they
must accept."""

_WORKER_LOOP = """
    optimizer = config.make_optimizer(model.parameters())
    losses = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        loss = config.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
"""

#: A correct backward peak, for the shard_memory variants wrong elsewhere.
_PEAK = """
def _backward_peak(model, world_size, policy):
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in model.parameters() if id(p) not in in_blocks])
    peaks = []
    for unit in units:
        grad = policy.param_dtype or unit[0].dtype
        padded = sum(math.ceil(p.shape[0] / world_size) * world_size * (p.numel() // p.shape[0])
                     for p in unit)
        full = sum(p.numel() for p in unit)
        peaks.append(full * grad.itemsize + padded * (policy.reduce_dtype or grad).itemsize)
    return max(peaks)

"""


def _shard_memory(comment: str, **parts: str) -> str:
    """A shard_memory that is right except for ``parts`` (see the defaults below)."""
    given = {
        "element": "p.element_size()",
        "grad_element": "p.element_size()",
        "units": "blocks + [root]",
        "padded_rows": "math.ceil(p.shape[0] / world_size) * world_size",
        "reduce": "policy.reduce_dtype or grad",
        **parts,
    }
    return f"""
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # {comment}
    params = list(model.parameters())
    rows = lambda p: math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * {given["element"]} for p in params)
    grads = sum(rows(p) * {given["grad_element"]} for p in params)
    state = 2 * sharded + 4 * len(params) if optimizer == "adamw" else sharded
    in_blocks = {{id(p) for p in model.blocks.parameters()}}
    blocks = [list(b.parameters()) for b in model.blocks]
    root = [p for p in params if id(p) not in in_blocks]
    embed, head = list(model.embed.parameters()), list(model.head.parameters())
    units = {given["units"]}
    gathered, peaks = [], []
    for unit in units:
        grad = policy.param_dtype or unit[0].dtype
        full = sum(p.numel() for p in unit)
        padded = sum({given["padded_rows"]} * (p.numel() // p.shape[0]) for p in unit)
        gathered.append(full * grad.itemsize)
        peaks.append(full * grad.itemsize + padded * ({given["reduce"]}).itemsize)
    return {{"params": sharded, "grads": grads, "optimizer": state, "gathered": max(gathered),
            "backward_peak": max(peaks)}}
"""


VARIANTS = {
    "fsdp_reduce_dtype_left_bf16": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: reduce_dtype left unset, so FSDP2 reduce-scatters in param_dtype (bfloat16), where
    # the contract asks config.reduce_dtype (float32).
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_reduce_dtype_hard_coded_float32": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: reduce_dtype hard-coded to float32 (the usual recipe) instead of the config's.
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_root_not_wrapped": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: only the blocks are sharded; the root's embed and head stay plain replicated
    # tensors whose gradients nobody averages (and, in bfloat16, get bfloat16 activations).
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP
        + """
    state = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v.detach().float())
             for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_local_shards_state_dict": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: returns each rank's local shards, not the full (gathered) tensors.
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP
        + """
    state = {k: v.to_local() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_loss_times_world_size": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: the loss multiplied by the world size before backward ("the reduce-scatter sums,
    # so undo the 1/world_size"): FSDP2 averages, so every gradient is world_size times too
    # large. AdamW's step hardly changes (it divides by the gradient's running RMS), so the
    # weights and the reported losses look right; the gradient the optimizer used does not.
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP.replace("loss.backward()", "(loss * world_size).backward()")
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_loss_divided_by_world_size": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: the loss divided by the world size as DDP scripts once did by hand: FSDP2's
    # reduce-scatter already averages, so the gradient is world_size times too small.
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP.replace("loss.backward()", "(loss / world_size).backward()")
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_whole_batch_on_every_rank": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: every rank trains on the whole global batch instead of its chunk (the averaged
    # gradient looks right, but each rank does all the work and reports the whole batch's loss).
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
    optimizer = config.make_optimizer(model.parameters())
    losses = []
    for step in range(config.steps):
        x, y = config.batch(step)
        loss = config.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "shard_memory_unsharded": (
        "shard_memory",
        _PEAK
        + """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: counts the unsharded model on every rank (what DDP holds, not FSDP).
    params = list(model.parameters())
    full = sum(p.numel() * p.element_size() for p in params)
    state = 2 * full + 4 * len(params) if optimizer == "adamw" else full
    dtype_size = lambda p: (policy.param_dtype or p.dtype).itemsize
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in params if id(p) not in in_blocks])
    gathered = max(sum(p.numel() * dtype_size(p) for p in unit) for unit in units)
    return {"params": full, "grads": full, "optimizer": state, "gathered": gathered,
            "backward_peak": _backward_peak(model, world_size, policy)}
""",
    ),
    "shard_memory_optimizer_bf16": (
        "shard_memory",
        _PEAK
        + """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: counts the optimizer state in bfloat16 (2 bytes), as if it followed param_dtype;
    # AdamW's state lives on the float32 shards.
    params = list(model.parameters())
    rows = lambda p: math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * p.element_size() for p in params)
    if optimizer == "adamw":
        state = 2 * sum(rows(p) * 2 for p in params) + 4 * len(params)
    else:
        state = sum(rows(p) * 2 for p in params)
    dtype_size = lambda p: (policy.param_dtype or p.dtype).itemsize
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in params if id(p) not in in_blocks])
    gathered = max(sum(p.numel() * dtype_size(p) for p in unit) for unit in units)
    return {"params": sharded, "grads": sharded, "optimizer": state, "gathered": gathered,
            "backward_peak": _backward_peak(model, world_size, policy)}
""",
    ),
    "shard_memory_floor_rows": (
        "shard_memory",
        _PEAK
        + """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: rows // world_size, so rank 0's share of a row count that does not divide evenly
    # is too small (torch.chunk gives rank 0 ceil(rows / world_size)).
    params = list(model.parameters())
    rows = lambda p: (p.shape[0] // world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * p.element_size() for p in params)
    state = 2 * sharded + 4 * len(params) if optimizer == "adamw" else sharded
    dtype_size = lambda p: (policy.param_dtype or p.dtype).itemsize
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in params if id(p) not in in_blocks])
    gathered = max(sum(p.numel() * dtype_size(p) for p in unit) for unit in units)
    return {"params": sharded, "grads": sharded, "optimizer": state, "gathered": gathered,
            "backward_peak": _backward_peak(model, world_size, policy)}
""",
    ),
    "shard_memory_gathered_whole_model": (
        "shard_memory",
        _PEAK
        + """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: the gathered copy counted for the whole model, as if it were one unit.
    params = list(model.parameters())
    rows = lambda p: math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * p.element_size() for p in params)
    state = 2 * sharded + 4 * len(params) if optimizer == "adamw" else sharded
    dtype_size = lambda p: (policy.param_dtype or p.dtype).itemsize
    gathered = sum(p.numel() * dtype_size(p) for p in params)
    return {"params": sharded, "grads": sharded, "optimizer": state, "gathered": gathered,
            "backward_peak": _backward_peak(model, world_size, policy)}
""",
    ),
    "shard_memory_grads_in_reduce_dtype": (
        "shard_memory",
        _shard_memory(
            "Wrong: the sharded gradients counted in reduce_dtype; FSDP2 casts the reduced "
            "gradient back to the parameter's dtype.",
            grad_element="(policy.reduce_dtype or policy.param_dtype or p.dtype).itemsize",
        ),
    ),
    "shard_memory_four_bytes_per_element": (
        "shard_memory",
        _shard_memory(
            "Wrong: 4 bytes per element of every shard, as if every parameter were float32.",
            element="4",
            grad_element="4",
        ),
    ),
    "shard_memory_root_forgotten": (
        "shard_memory",
        _shard_memory(
            "Wrong: only the blocks counted as units; the root is one too.", units="blocks"
        ),
    ),
    "shard_memory_embed_head_separate_units": (
        "shard_memory",
        _shard_memory(
            "Wrong: embed and head counted as two units; fully_shard(model) makes one root "
            "unit of every parameter outside the blocks.",
            units="blocks + [embed, head]",
        ),
    ),
    "shard_memory_peak_unpadded": (
        "shard_memory",
        _shard_memory(
            "Wrong: the reduce-scatter input counted without the padding to equal shards.",
            padded_rows="p.shape[0]",
        ),
    ),
    "shard_memory_peak_reduce_in_gradient_dtype": (
        "shard_memory",
        _shard_memory(
            "Wrong: the reduce-scatter input counted in the gradients' dtype, as if reduce_dtype "
            "cost no memory.",
            reduce="grad",
        ),
    ),
    "shard_memory_float32_when_param_dtype_none": (
        "shard_memory",
        _shard_memory(
            "Wrong: takes float32 for the compute dtype when param_dtype is None, where each unit "
            "gathers in its own dtype (bfloat16 for a bfloat16 root)."
        ).replace("policy.param_dtype or unit[0].dtype", "policy.param_dtype or torch.float32"),
    ),
    "shard_memory_reduce_float32_when_none": (
        "shard_memory",
        _shard_memory(
            "Wrong: reduces in float32 when reduce_dtype is None, where FSDP2 reduces in the "
            "gradients' dtype.",
            reduce="policy.reduce_dtype or torch.float32",
        ),
    ),
    "sr_round_to_nearest": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: plain round-to-nearest; deterministic and biased for values below half a spacing.
    return x.to(torch.bfloat16)
""",
    ),
    "sr_noise_too_narrow": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: uniform noise of the wrong width, [0, 2^15) instead of [0, 2^16): values in the
    # lower half of a gap never round up, the others too rarely (biased toward zero).
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 15, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "sr_negative_wrong_way": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: the probability is computed on the signed value, so negative numbers round away
    # from zero with the probability of rounding toward it (their mantissa the wrong way).
    bits = x.contiguous().view(torch.int32)
    lo = (bits & -65536).view(torch.float32)
    hi = ((bits & -65536) + 65536).view(torch.float32)
    down = torch.minimum(lo, hi)
    up = torch.maximum(lo, hi)
    p = torch.where(up > down, (x - down) / (up - down), torch.zeros_like(x))
    p = torch.where(x < 0, 1 - p, p)
    u = torch.rand(x.shape, device=x.device, generator=generator)
    return torch.where(u < p, up, down).to(torch.bfloat16)
""",
    ),
    "fsdp_calls_course_worker": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: hands in the course's own FSDP2 run (course.sharded.sharded_worker) instead of
    # writing the sharding and the training loop.
    run = sharded_worker(rank, world_size, RunSpec(config))
    return {"state_dict": run["state_dict"], "losses": run["losses"]}
""",
    ),
    "fsdp_course_shard_model_under_another_name": (
        "fsdp_amp_worker",
        """
from course.sharded import shard_model as wrap_for_fsdp


def fsdp_amp_worker(rank, world_size, config):
    # Wrong: lets the course's shard_model (imported under another name) do the sharding the
    # exercise asks for.
    model = wrap_for_fsdp(config.make_model(), config.param_dtype, config.reduce_dtype)
"""
        + _WORKER_LOOP
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "shard_memory_calls_measure_memory": (
        "shard_memory",
        """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: measures real ranks with the lesson's rank_bytes (section 4) instead of counting
    # (rebuilding the config from the model's shapes).
    config = FSDPConfig(
        n_in=model.embed.in_features, width=model.embed.out_features,
        hidden=model.blocks[0].fc1.out_features, depth=len(model.blocks),
        n_out=model.head.out_features, param_dtype=policy.param_dtype,
        reduce_dtype=policy.reduce_dtype,
        unit_dtypes=(model.embed.weight.dtype, *(b.fc1.weight.dtype for b in model.blocks)))
    rank0 = launch(rank_bytes, world_size, (config, optimizer), backend="gloo")[0]
    return {k: rank0[k] for k in ("params", "grads", "optimizer", "gathered", "backward_peak")}
""",
    ),
    "sr_float32_noise_then_nearest": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: adds uniform noise of half a gap either side in float32, then rounds to nearest.
    # Just above a power of two the gap below is half the gap above, so the noisy value can
    # round to a bfloat16 number below the lower neighbour.
    bits = x.contiguous().view(torch.int32)
    lo = (bits & -65536).view(torch.float32)
    hi = ((bits & -65536) + 65536).view(torch.float32)
    u = torch.rand(x.shape, device=x.device, generator=generator) - 0.5
    return torch.where(x == lo, x, x + u * (hi - lo)).to(torch.bfloat16)
""",
    ),
    "sr_fresh_generator_every_call": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: ignores the generator it is given and seeds a fresh one identically on every call,
    # so every call rounds the same way (reproducible, but never independent).
    generator = torch.Generator(device=x.device).manual_seed(0)
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "sr_fixed_dither_by_position": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: a fixed dither pattern by element position (a golden-ratio sequence) instead of
    # random numbers: right on average along the tensor, the same pattern on every call.
    bits = x.contiguous().view(torch.int32)
    index = torch.arange(x.numel(), dtype=torch.float64, device=x.device).reshape(x.shape)
    noise = ((index * 0.6180339887498949) % 1 * 65536).to(torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "sr_five_random_bits": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: 5 random bits instead of 16 (noise in steps of 2^11): the probability of rounding
    # up is floor(low / 2^11) / 32, biased toward zero by up to 1/32 of a gap.
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 32, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator) << 11
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "sr_probability_shifted": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: rounds away from zero with probability fraction + 0.03 (an off-by-a-little
    # threshold): biased away from zero by 3% of a gap.
    bits = x.contiguous().view(torch.int32)
    lo_bits = bits & -65536
    frac = (bits & 65535).double() / 65536
    u = torch.rand(x.shape, dtype=torch.float64, device=x.device, generator=generator)
    up = (u < frac + 0.03) & (frac > 0)
    return torch.where(up, lo_bits + 65536, lo_bits).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "sr_own_generator_when_none": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: without a generator, draws from a new torch.Generator() (always the same default
    # seed) instead of torch's global generator.
    if generator is None:
        generator = torch.Generator(device=x.device)
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
    "fsdp_autocast_instead_of_param_dtype": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: no param_dtype in the policy, the forward and the loss under torch.autocast instead
    # (section 3's pattern). On a CPU the numbers come out the same, but FSDP2 then all-gathers
    # the float32 shards, twice the bytes the config's bfloat16 param_dtype sends.
    model = config.make_model()
    policy = MixedPrecisionPolicy(reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
    optimizer = config.make_optimizer(model.parameters())
    low = config.param_dtype not in (None, torch.float32)
    losses = []
    for step in range(config.steps):
        x, y = config.batch(step)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        with torch.autocast("cpu", dtype=config.param_dtype if low else torch.bfloat16,
                            enabled=low):
            loss = config.loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "fsdp_adamw_default_weight_decay": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Wrong: AdamW built by hand with the config's lr only, so its weight decay is AdamW's
    # default (0.01) instead of config.weight_decay.
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP.replace(
            "config.make_optimizer(model.parameters())",
            "torch.optim.AdamW(model.parameters(), lr=config.lr)",
        )
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "shard_memory_largest_by_parameter_count": (
        "shard_memory",
        """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: "the largest unit" read as the unit with the most parameters, whose gathered copy
    # and backward peak are reported; with units stored in different dtypes another unit can
    # hold more bytes.
    params = list(model.parameters())
    rows = lambda p: math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * p.element_size() for p in params)
    state = 2 * sharded + 4 * len(params) if optimizer == "adamw" else sharded
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in params if id(p) not in in_blocks])
    unit = max(units, key=lambda u: sum(p.numel() for p in u))
    grad = policy.param_dtype or unit[0].dtype
    full = sum(p.numel() for p in unit)
    padded = sum(math.ceil(p.shape[0] / world_size) * world_size * (p.numel() // p.shape[0])
                 for p in unit)
    return {"params": sharded, "grads": sharded, "optimizer": state,
            "gathered": full * grad.itemsize,
            "backward_peak": full * grad.itemsize + padded * (policy.reduce_dtype or grad).itemsize}
""",
    ),
    "shard_memory_peak_of_largest_gathered_unit": (
        "shard_memory",
        """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Wrong: finds the unit with the largest gathered copy and reports that unit's backward
    # peak; another unit's peak can be larger (a float32 reduction adds more to a bfloat16
    # unit's peak than to a float32 unit's).
    params = list(model.parameters())
    rows = lambda p: math.ceil(p.shape[0] / world_size) * (p.numel() // p.shape[0])
    sharded = sum(rows(p) * p.element_size() for p in params)
    state = 2 * sharded + 4 * len(params) if optimizer == "adamw" else sharded
    in_blocks = {id(p) for p in model.blocks.parameters()}
    units = [list(b.parameters()) for b in model.blocks]
    units.append([p for p in params if id(p) not in in_blocks])
    gathered = lambda u: sum(p.numel() for p in u) * (policy.param_dtype or u[0].dtype).itemsize
    unit = max(units, key=gathered)
    grad = policy.param_dtype or unit[0].dtype
    padded = sum(math.ceil(p.shape[0] / world_size) * world_size * (p.numel() // p.shape[0])
                 for p in unit)
    return {"params": sharded, "grads": sharded, "optimizer": state, "gathered": gathered(unit),
            "backward_peak": gathered(unit) + padded * (policy.reduce_dtype or grad).itemsize}
""",
    ),
    "sr_gap_of_nearest_power": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: takes the gap from the power of two nearest x (the exponent of x rounded to the
    # nearest bfloat16 number) on both sides. Just below a power of two that x rounds up to,
    # that is twice the real gap: the value nearer zero it picks is two steps below x's upper
    # neighbour, not the neighbour below x. The mean stays right.
    ax = x.abs()
    e = torch.floor(torch.log2(ax.to(torch.bfloat16).float())).clamp(min=-126)
    gap = torch.exp2(e - 7)
    lo = torch.floor(ax / gap) * gap
    p = (ax - lo) / gap
    u = torch.rand(x.shape, device=x.device, generator=generator)
    out = torch.where(u < p, lo + gap, lo) * torch.where(x < 0, -1.0, 1.0)
    return torch.where(x.isnan() | x.isinf(), x, out).to(torch.bfloat16)
""",
    ),
    "sr_nan_payload_to_inf": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Wrong: the bit trick alone. A NaN whose payload lies only in the low 16 bits has inf's top
    # 16 bits, so unless its noise carries it comes back as inf (or -inf).
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device,
                          generator=generator)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)
""",
    ),
}

VALID = {
    "fsdp_dcp_full_state_dict": (
        "fsdp_amp_worker",
        """
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh


def fsdp_amp_worker(rank, world_size, config):
    # Valid: the full state dict from torch.distributed.checkpoint, its own CPU mesh, the policy
    # as keywords built once per module, the blocks by index, zero_grad() with its default.
    model = config.make_model()
    mesh = init_device_mesh("cpu", (world_size,))
    for i in range(len(model.blocks)):
        fully_shard(model.blocks[i], mesh=mesh, mp_policy=MixedPrecisionPolicy(
            reduce_dtype=config.reduce_dtype, param_dtype=config.param_dtype))
    fully_shard(model, mesh=mesh, mp_policy=MixedPrecisionPolicy(
        reduce_dtype=config.reduce_dtype, param_dtype=config.param_dtype))
    optimizer = config.make_optimizer(model.parameters())
    losses = []
    for step, (x, y) in enumerate(config.batch(s) for s in range(config.steps)):
        optimizer.zero_grad()
        loss = config.loss_fn(model(torch.chunk(x, world_size)[rank]),
                              torch.chunk(y, world_size)[rank])
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {"state_dict": dict(state), "losses": losses}
""",
    ),
    "fsdp_destroys_process_group": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Valid: ends as an FSDP script does, with dist.destroy_process_group().
    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
"""
        + _WORKER_LOOP
        + """
    state = {k: v.full_tensor() for k, v in model.state_dict().items()}
    dist.barrier()
    dist.destroy_process_group()
    return {"state_dict": state, "losses": losses}
""",
    ),
    "shard_memory_meta_chunks": (
        "shard_memory",
        """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Valid: rank 0's shard from torch.chunk on a meta tensor; units by module, not by id.
    def rank0(p):
        return torch.empty(p.shape, dtype=p.dtype, device="meta").chunk(world_size)[0]

    nbytes = lambda t: t.numel() * t.element_size()
    shards = [rank0(p) for p in model.parameters()]
    params = sum(nbytes(s) for s in shards)
    if optimizer == "adamw":
        state = sum(2 * nbytes(s) + torch.tensor(0.0).element_size() for s in shards)
    else:
        state = params
    compute = lambda p: torch.empty(p.shape, dtype=policy.param_dtype or p.dtype, device="meta")
    unit_sizes = [sum(nbytes(compute(p)) for p in block.parameters()) for block in model.blocks]
    root = sum(nbytes(compute(p)) for name, p in model.named_parameters()
               if not name.startswith("blocks."))
    units = [list(block.parameters()) for block in model.blocks]
    units.append([p for name, p in model.named_parameters() if not name.startswith("blocks.")])
    peaks = []
    for unit in units:
        grads = [compute(p) for p in unit]
        reduce = policy.reduce_dtype or grads[0].dtype
        sent = [torch.empty(p.shape, dtype=reduce, device="meta").chunk(world_size)[0]
                for p in unit]
        peaks.append(sum(nbytes(g) for g in grads) + world_size * sum(nbytes(t) for t in sent))
    return {"params": int(params), "grads": int(params), "optimizer": int(state),
            "gathered": int(max(unit_sizes + [root])), "backward_peak": int(max(peaks))}
""",
    ),
    "sr_float_neighbours": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Valid: find both neighbours, then round away from zero with probability distance / gap,
    # computed in float64 with torch.rand; NaNs passed through as they are.
    bits = x.contiguous().view(torch.int32)
    lo = (bits & -65536).view(torch.float32)
    hi = ((bits & -65536) + 65536).view(torch.float32)
    gap = (hi.double() - lo.double()).abs()
    p = (x.double() - lo.double()).abs() / gap
    u = torch.rand(x.shape, dtype=torch.float64, device=x.device, generator=generator)
    return torch.where(x.isnan(), x, torch.where(u < p, hi, lo)).to(torch.bfloat16)
""",
    ),
    "fsdp_policy_once_named_parameters": (
        "fsdp_amp_worker",
        """
def fsdp_amp_worker(rank, world_size, config):
    # Valid: one policy object, the blocks through children(), the state from named_parameters
    # (this model has no buffers), the loss and batch split written out by hand.
    model = config.make_model()
    policy = MixedPrecisionPolicy(config.param_dtype, config.reduce_dtype)
    mesh = rank_mesh()
    for block in model.blocks.children():
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    optimizer = config.make_optimizer(model.parameters())
    losses = []
    for step in range(config.steps):
        x, y = config.batch(step)
        per_rank = x.shape[0] // world_size
        rows = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = config.loss_fn(model(x[rows]), y[rows])
        loss.backward()
        optimizer.step()
        for p in model.parameters():
            p.grad = None
        losses.append(loss.detach().item())
    state = {n: p.detach().full_tensor() for n, p in model.named_parameters()}
    return {"state_dict": state, "losses": losses}
""",
    ),
    "shard_memory_real_chunks": (
        "shard_memory",
        """
def shard_memory(model, world_size, policy, optimizer="adamw"):
    # Valid: rank 0's shard as a view from torch.chunk on the real parameter; units walked as
    # modules, the root's as everything outside model.blocks.
    first = [p.detach().chunk(world_size, dim=0)[0] for p in model.parameters()]
    shard = sum(t.nbytes for t in first)
    state = (2 * shard + 4 * len(first)) if optimizer == "adamw" else shard
    size = (lambda p: policy.param_dtype.itemsize) if policy.param_dtype else (
        lambda p: p.element_size())
    block_ids = {id(p) for p in model.blocks.parameters()}
    units = [sum(p.numel() * size(p) for p in b.parameters()) for b in model.blocks]
    units.append(sum(p.numel() * size(p) for p in model.parameters() if id(p) not in block_ids))
    peaks = []
    for unit in [list(b.parameters()) for b in model.blocks] + [
        [p for p in model.parameters() if id(p) not in block_ids]
    ]:
        grad_size = policy.param_dtype.itemsize if policy.param_dtype else unit[0].element_size()
        reduce_size = policy.reduce_dtype.itemsize if policy.reduce_dtype else grad_size
        padded = sum(-(-p.shape[0] // world_size) * world_size * p[0].numel() for p in unit)
        peaks.append(sum(p.numel() for p in unit) * grad_size + padded * reduce_size)
    return {"params": shard, "grads": shard, "optimizer": state, "gathered": max(units),
            "backward_peak": max(peaks)}
""",
    ),
    "sr_int64_bits": (
        "stochastic_round_bf16",
        """
def stochastic_round_bf16(x, generator=None):
    # Valid: the bit trick in int64 (no int32 overflow to think about), the low 16 bits
    # cleared with a shift; NaNs set back afterwards through a mask.
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    noise = torch.randint(0, 65536, x.shape, device=x.device, generator=generator)
    rounded = ((bits + noise) >> 16) << 16
    out = rounded.to(torch.int32).view(torch.float32).to(torch.bfloat16)
    out[x.isnan()] = float("nan")
    return out
""",
    ),
}
