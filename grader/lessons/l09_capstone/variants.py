"""Wrong answers to lesson 09's exercises that the graders must reject, and valid alternatives
that must keep full marks."""

_COMPARE_HEAD = """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data
    dev = train_tokens.device
    out = {}
"""

# One run; SEED_HERE, SCALER_ON, TRAIN_AUTOCAST, EVAL_TOKENS, EVAL_WINDOWS are replaced per
# variant.
_COMPARE_RUN = """
        SEED_HERE
        model = model_fn().to(dev)
        block = model.config.block_size
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device_type, enabled=SCALER_ON)
        batches = random_batches(train_tokens, batch_size, block, seed, device=dev)
        losses = []
        for _ in range(steps):
            x, y = next(batches)
            with torch.autocast(device_type, dtype=amp_dtype, enabled=TRAIN_AUTOCAST):
                loss = lm_loss(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
        xv, yv = val_batch(EVAL_TOKENS, block, max_windows=EVAL_WINDOWS, device=dev)
        with torch.no_grad(), torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
            out[f"{name}_val_loss"] = lm_loss(model(xv), yv).item()
        out[f"{name}_losses"] = losses
    out["difference"] = out["amp_val_loss"] - out["fp32_val_loss"]
    return out
"""

_RIGHT = {
    "SEED_HERE": "torch.manual_seed(seed)",
    "SCALER_ON": "amp and amp_dtype == torch.float16",
    "TRAIN_AUTOCAST": "amp",
    "EVAL_TOKENS": "val_tokens",
    "EVAL_WINDOWS": "None",
}


def _compare(seed_once: bool = False, **changes: str) -> str:
    run = _COMPARE_RUN
    for key, value in {**_RIGHT, **changes}.items():
        run = run.replace(key, value)
    loop = '    for name, amp in (("fp32", False), ("amp", True)):'
    if seed_once:
        return (
            _COMPARE_HEAD
            + "    torch.manual_seed(seed)\n"
            + loop
            + run.replace("        torch.manual_seed(seed)\n", "", 1)
        )
    return _COMPARE_HEAD + loop + run


# The three functions of distributed_step as the solution writes them; variants change a line.
STEP_SOLUTION = """
def distributed_step(model, optimizer, scaler, scheduler, micro_batches, amp_dtype,
                     max_grad_norm):
    device = next(model.parameters()).device
    world = dist.get_world_size() if dist.is_initialized() else 1
    # on the model's device: nccl (GPUs) all-reduces CUDA tensors only
    counts = torch.tensor(sum(int((y != IGNORE).sum()) for _, y in micro_batches),
                          dtype=torch.float64, device=device)
    total = torch.zeros((), dtype=torch.float64, device=device)
    if world > 1:
        dist.all_reduce(counts)
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = contextlib.nullcontext() if last or world == 1 else model.no_sync()
        with sync:
            with torch.autocast(device.type, dtype=amp_dtype):
                loss_sum = lm_loss(model(x), y, reduction="sum")
            # DDP averages the ranks' gradients: times the world size, over every rank's tokens
            scaler.scale(loss_sum * (world / counts.item())).backward()
        total += loss_sum.detach().double()
    if world > 1:
        dist.all_reduce(total)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scale = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = not scaler.is_enabled() or scaler.get_scale() >= scale
    if stepped:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return (total / counts).item(), stepped


def save_checkpoint(path, model, optimizer, scaler, scheduler, position):
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scaler": scaler.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {"cpu": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},
        "position": position,
    }
    torch.save(state, path)


def load_checkpoint(path, model, optimizer, scaler, scheduler):
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    scheduler.load_state_dict(state["scheduler"])
    torch.set_rng_state(state["rng"]["cpu"])
    if state["rng"]["cuda"]:
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
    return state["position"]
"""


def _step(old: str, new: str) -> str:
    assert old in STEP_SOLUTION, old
    return "\n" + STEP_SOLUTION.replace(old, new, 1)


_NO_SYNC = "sync = contextlib.nullcontext() if last or world == 1 else model.no_sync()"
_SCALED_BACKWARD = "scaler.scale(loss_sum * (world / counts.item())).backward()"
_UNSCALE_CLIP = """    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
"""

_FLOPS_HEAD = """
def transformer_flops(config, tokens):
    d, t, L = config.d_model, config.block_size, config.n_layer
"""

VARIANTS = {
    # Seeds once for both runs: the AMP run starts from different initial weights.
    "train_compare_seeds_once": ("train_compare", _compare(seed_once=True)),
    # float16 without a GradScaler: small gradients underflow to zero in float16.
    "train_compare_no_scaler_in_fp16": ("train_compare", _compare(SCALER_ON="False")),
    # Autocast only at evaluation: the "AMP" run trains in fp32.
    "train_compare_autocast_only_at_eval": ("train_compare", _compare(TRAIN_AUTOCAST="False")),
    # Validation loss on the training text: measures memorisation, not generalisation.
    "train_compare_evaluates_on_train": ("train_compare", _compare(EVAL_TOKENS="train_tokens")),
    # Computes the loss outside autocast: the 16-bit logits go into cross-entropy as they are, so
    # the loss (and its gradient) is computed in 16 bits instead of autocast's float32.
    "train_compare_loss_outside_autocast": (
        "train_compare",
        _compare().replace(
            "                loss = lm_loss(model(x), y)\n",
            "                logits = model(x)\n            loss = lm_loss(logits, y)\n",
        ),
    ),
    # Evaluates the AMP run in float32: the validation loss is not the mixed-precision model's.
    "train_compare_evaluates_amp_in_fp32": (
        "train_compare",
        _compare().replace(
            "dtype=amp_dtype, enabled=amp):\n            out[", "enabled=False):\n            out["
        ),
    ),
    # Counts the forward pass only: training also runs backward, 2x the forward.
    "flops_forgets_backward": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Counts the projections but not attention's score and value matmuls.
    "flops_forgets_attention": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff)
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Counts the tied matrix twice, as if the embedding lookup were a matmul as well.
    "flops_counts_tied_head_twice": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return 3 * tokens * (L * per_layer + 2 * 2 * d * config.vocab_size)
""",
    ),
    # Halves attention's score and value matmuls for the causal mask, against the stated
    # convention (the full context is counted).
    "flops_causal_half_attention": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 2 * t * d
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Adds the embedding lookups as matmuls (token and position), against the stated convention.
    "flops_counts_position_embedding": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size + 2 * d * t)
""",
    ),
    # Measures with torch's counter on the CPU itself: attention runs there in the CPU flash
    # kernel, which FlopCounterMode does not list, so the count has no attention at all.
    "flops_measured_on_the_cpu": (
        "transformer_flops",
        """
from torch.utils.flop_counter import FlopCounterMode


def transformer_flops(config, tokens):
    net = GPT(config)
    idx = torch.zeros(tokens // config.block_size, config.block_size, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        lm_loss(net(idx), idx).backward()
    return int(counter.get_total_flops())
""",
    ),
    # backward() inside the autocast block: the same numbers on a CPU, against the recipe
    # (autocast covers the forward pass and the loss; backward runs outside it).
    "train_compare_backward_inside_autocast": (
        "train_compare",
        _compare().replace(
            "                loss = lm_loss(model(x), y)\n"
            "            optimizer.zero_grad()\n"
            "            scaler.scale(loss).backward()\n",
            "                loss = lm_loss(model(x), y)\n"
            "                optimizer.zero_grad()\n"
            "                scaler.scale(loss).backward()\n",
        ),
    ),
    # Evaluates on val_batch's default 64 windows, not the whole held-out text.
    "train_compare_evaluates_64_windows": ("train_compare", _compare(EVAL_WINDOWS="64")),
    # Steps the optimizer itself on the scaled gradients (never unscaled; an overflowing step is
    # not skipped). AdamW is nearly blind to the scale, except through its eps.
    "train_compare_optimizer_steps_scaled_grads": (
        "train_compare",
        _compare().replace(
            "            scaler.step(optimizer)\n            scaler.update()\n",
            "            optimizer.step()\n",
        ),
    ),
    # Autocast in bfloat16 whatever amp_dtype says (the scaler still follows amp_dtype).
    "train_compare_autocast_always_bf16": (
        "train_compare",
        _compare().replace(
            "with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):\n                loss",
            "with torch.autocast(device_type, dtype=torch.bfloat16, enabled=amp):\n"
            "                loss",
        ),
    ),
    # All-reduces after every micro-batch (no no_sync): the same gradients, accum times the
    # communication.
    "step_without_no_sync": (
        "distributed_step",
        _step(_NO_SYNC, "sync = contextlib.nullcontext()"),
    ),
    # no_sync() on every micro-batch, the last included: the gradients are never all-reduced.
    "step_no_sync_on_every_micro_batch": (
        "distributed_step",
        _step(_NO_SYNC, "sync = model.no_sync() if world > 1 else contextlib.nullcontext()"),
    ),
    # Divides by this rank's own token count: the ranks' tokens weigh differently.
    "step_loss_over_local_tokens": (
        "distributed_step",
        _step(_SCALED_BACKWARD, "scaler.scale(loss_sum / local).backward()").replace(
            "    if world > 1:\n        dist.all_reduce(counts)\n",
            "    local = counts.item()\n    if world > 1:\n        dist.all_reduce(counts)\n",
            1,
        ),
    ),
    # Clips the scaled gradients, then unscales: the clip threshold meets gradients scale times
    # too large, and the step gets gradients clipped far below max_grad_norm.
    "step_clips_before_unscale": (
        "distributed_step",
        _step(
            _UNSCALE_CLIP,
            """    torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.unscale_(optimizer)
""",
        ),
    ),
    # Steps the schedule on every step, skipped ones included.
    "step_schedule_on_skipped_steps": (
        "distributed_step",
        _step("    if stepped:\n        scheduler.step()\n", "    scheduler.step()\n"),
    ),
    # Saves no RNG state: a resumed run draws other dropout masks.
    "step_checkpoint_without_rng": (
        "distributed_step",
        _step('    torch.set_rng_state(state["rng"]["cpu"])\n', ""),
    ),
    # Loses the data position: a resumed run starts again at step 0.
    "step_checkpoint_loses_data_position": (
        "distributed_step",
        _step('    return state["position"]\n', "    return 0\n"),
    ),
    # Loads the checkpoint onto the training device (the model's): on a GPU the generator states
    # arrive as CUDA tensors, which torch.set_rng_state refuses. On the CPU every run resumes
    # bit for bit; the tests also load into a model on the meta device, a GPU's stand-in.
    "step_checkpoint_loaded_onto_the_device": (
        "distributed_step",
        _step('map_location="cpu"', "map_location=next(model.parameters()).device"),
    ),
    # Saves no scheduler state: a resumed run restarts the warm-up.
    "step_checkpoint_without_scheduler": (
        "distributed_step",
        _step('    scheduler.load_state_dict(state["scheduler"])\n', ""),
    ),  # "Stepped" when the scale is unchanged: a step taken that grows the scale counts as
    # skipped, and the schedule misses it.
    "step_stepped_when_scale_unchanged": (
        "distributed_step",
        _step("scaler.get_scale() >= scale", "scaler.get_scale() == scale"),
    ),
    # no_sync() and the all-reduces whatever the world: without a process group (a world of 1,
    # the bare GPT) there is no no_sync and no default group.
    "step_collectives_without_a_group": (
        "distributed_step",
        _step(_NO_SYNC, "sync = contextlib.nullcontext() if last else model.no_sync()")
        .replace(
            "    if world > 1:\n        dist.all_reduce(counts)\n", "    dist.all_reduce(counts)\n"
        )
        .replace(
            "    if world > 1:\n        dist.all_reduce(total)\n", "    dist.all_reduce(total)\n"
        ),
    ),
    # Saves and restores the CPU generator only: on a GPU dropout's masks come from the CUDA
    # generators, and a resumed run draws other ones.
    "step_checkpoint_cpu_generator_only": (
        "distributed_step",
        _step(
            '"cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},',
            '"cuda": []},',
        ),
    ),
    # Divides by all ranks' tokens but does not multiply by the world size: DDP's average then
    # halves the gradient (2 ranks), which clipping and AdamW hide from the weights.
    "step_loss_over_all_tokens_not_times_world": (
        "distributed_step",
        _step(_SCALED_BACKWARD, "scaler.scale(loss_sum / counts.item()).backward()"),
    ),
    # Never moves anything to the device: the model stays where model_fn built it and the
    # batches are made on random_batches' default device, the CPU (on a GPU the first forward
    # pass fails; on the CPU the numbers are the same).
    "train_compare_never_moves_to_the_device": (
        "train_compare",
        _compare()
        .replace("model = model_fn().to(dev)", "model = model_fn()")
        .replace("seed, device=dev)", "seed)")
        .replace("max_windows=EVAL_WINDOWS, device=dev)", "max_windows=None)")
        .replace("max_windows=None, device=dev)", "max_windows=None)"),
    ),
    # Makes the batches on the data's device but leaves the model where model_fn built it.
    "train_compare_model_never_moved": (
        "train_compare",
        _compare().replace("model = model_fn().to(dev)", "model = model_fn()"),
    ),
    # Moves the model, but makes the batches on random_batches' default device (the CPU).
    "train_compare_batches_on_the_cpu": (
        "train_compare",
        _compare().replace("seed, device=dev)", "seed)"),
    ),
    # Moves the model to the device type ("cpu" in the tests), not to the data's device.
    "train_compare_model_to_device_type": (
        "train_compare",
        _compare().replace("model = model_fn().to(dev)", "model = model_fn().to(device_type)"),
    ),
    # Trains on the data's device but makes the held-out batch on val_batch's default, the CPU.
    "train_compare_val_batch_without_device": (
        "train_compare",
        _compare().replace("max_windows=None, device=dev)", "max_windows=None)"),
    ),
}


VALID = {
    # The checkpoint's CUDA generators, as lesson 05's valid answers take them: guarded by
    # torch.accelerator, read through torch.cuda.random.
    "step_checkpoint_accelerator_guard": (
        "distributed_step",
        _step(
            '"cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},',
            '"cuda": [torch.cuda.random.get_rng_state(i)\n'
            "                         for i in range(torch.accelerator.device_count())]\n"
            "                if torch.accelerator.is_available() else []},",
        ).replace(
            '    if state["rng"]["cuda"]:\n        torch.cuda.set_rng_state_all(',
            '    if state["rng"]["cuda"] and torch.accelerator.is_available():\n'
            "        torch.cuda.random.set_rng_state_all(",
            1,
        ),
    ),
    # Each GPU selected in turn (torch.cuda.device(i) to save, torch.cuda.set_device(i) to load).
    "step_checkpoint_cuda_device_context": (
        "distributed_step",
        _step(
            '"cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},',
            '"cuda": _gpu_states()},',
        ).replace(
            '        torch.cuda.set_rng_state_all(state["rng"]["cuda"])\n',
            '        for i, gpu_state in enumerate(state["rng"]["cuda"]):\n'
            "            torch.cuda.set_device(i)\n"
            "            torch.cuda.set_rng_state(gpu_state)\n"
            "        torch.cuda.set_device(0)\n",
            1,
        )
        + """

def _gpu_states():
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            with torch.cuda.device(i):
                gpus.append(torch.cuda.get_rng_state())
    return gpus
""",
    ),
    # torch.cuda's functions imported by name at the top of the file, before any test.
    "step_checkpoint_cuda_imported_functions": (
        "distributed_step",
        "\nfrom torch.cuda import get_rng_state_all, set_rng_state_all\n"
        + _step(
            '"cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []},',
            '"cuda": get_rng_state_all() if torch.cuda.is_available() else []},',
        ).replace(
            'torch.cuda.set_rng_state_all(state["rng"]["cuda"])',
            'set_rng_state_all(state["rng"]["cuda"])',
            1,
        ),
    ),
    # Autocast's device type read from the data (x.device.type, train_tokens.device.type).
    "train_compare_autocast_on_the_data_device_type": (
        "train_compare",
        _compare()
        .replace("torch.autocast(device_type,", "torch.autocast(x.device.type,", 1)
        .replace("torch.autocast(device_type,", "torch.autocast(train_tokens.device.type,", 1),
    ),
    # The loss as the micro-batch's mean, weighted by its share of all the ranks' tokens; the
    # checkpoint written to a temporary file and renamed (a crash never leaves half a file).
    "step_mean_loss_weighted_and_atomic_checkpoint": (
        "distributed_step",
        _step(
            _SCALED_BACKWARD,
            "n_here = int((y != IGNORE).sum())\n"
            "            mean = loss_sum / max(n_here, 1)\n"
            "            scaler.scale(mean * (n_here * world / counts.item())).backward()",
        ).replace(
            "    torch.save(state, path)\n",
            "    tmp = str(path) + '.tmp'\n    torch.save(state, tmp)\n"
            "    __import__('os').replace(tmp, path)\n",
            1,
        ),
    ),
    # Measures a copy of the model on the meta device: there attention takes the math path
    # (full-context matmuls), so torch's counter reproduces the convention exactly.
    "flops_measured_on_meta": (
        "transformer_flops",
        """
from course.benchmark import count_gpt_flops


def transformer_flops(config, tokens):
    return int(count_gpt_flops(config, tokens // config.block_size))
""",
    ),
    # The training loss as the mean of equal-length per-window means: the same per-token mean,
    # its sum in another order (the loss differs in the last bits).
    "train_compare_mean_of_window_means": (
        "train_compare",
        _compare().replace(
            "                loss = lm_loss(model(x), y)\n",
            "                logits = model(x)\n"
            "                loss = torch.stack([lm_loss(logits[i : i + 1], y[i : i + 1])\n"
            "                                    for i in range(len(y))]).mean()\n",
        ),
    ),
    # One helper per run, plain backward when the scaler is off, set_to_none spelled out, the
    # loss through F.cross_entropy directly: the same computation, written differently.
    "train_compare_helper_per_run": (
        "train_compare",
        """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data

    def run(amp):
        torch.manual_seed(seed)
        model = model_fn().to(train_tokens.device)
        block = model.config.block_size
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        use_scaler = amp and amp_dtype == torch.float16
        scaler = torch.amp.GradScaler(device_type, enabled=use_scaler)
        stream = random_batches(train_tokens, batch_size, block, seed, device=train_tokens.device)
        losses = []
        for _, (x, y) in zip(range(steps), stream):
            with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            if use_scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            losses.append(loss.item())
        model.eval()
        xv, yv = val_batch(val_tokens, block, max_windows=None, device=val_tokens.device)
        with torch.no_grad():
            with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
                val = float(lm_loss(model(xv), yv))
        return val, losses

    fp32_val, fp32_losses = run(False)
    amp_val, amp_losses = run(True)
    return {"fp32_val_loss": fp32_val, "amp_val_loss": amp_val,
            "difference": amp_val - fp32_val,
            "fp32_losses": fp32_losses, "amp_losses": amp_losses}
""",
    ),
    # The two runs as data (a settings table), torch.amp.autocast spelled out, the scaler always
    # built and switched by `enabled`, evaluation in eval() mode: again the same computation.
    "train_compare_settings_table": (
        "train_compare",
        """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data
    device = train_tokens.device
    settings = {"fp32": dict(autocast=False, scale=False),
                "amp": dict(autocast=True, scale=amp_dtype == torch.float16)}
    result = {}
    for name, s in settings.items():
        torch.manual_seed(seed)
        model = model_fn().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device_type, enabled=s["scale"])
        batches = iter(random_batches(train_tokens, batch_size, model.config.block_size, seed,
                                      device=device))
        history = []
        for _ in range(steps):
            inputs, targets = next(batches)
            optimizer.zero_grad()
            with torch.amp.autocast(device_type, dtype=amp_dtype, enabled=s["autocast"]):
                loss = lm_loss(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            history.append(loss.detach().item())
        model.eval()
        inputs, targets = val_batch(val_tokens, model.config.block_size, max_windows=None,
                                    device=device)
        with torch.no_grad(), torch.amp.autocast(device_type, dtype=amp_dtype,
                                                 enabled=s["autocast"]):
            result[f"{name}_val_loss"] = lm_loss(model(inputs), targets).item()
        result[f"{name}_losses"] = history
    result["difference"] = result["amp_val_loss"] - result["fp32_val_loss"]
    return result
""",
    ),
    # Per-layer sums, matmul by matmul, as (rows, inner, columns) products.
    "flops_per_matmul_sum": (
        "transformer_flops",
        """
def transformer_flops(config, tokens):
    d, t, f = config.d_model, config.block_size, config.d_ff
    seqs = tokens // t
    forward = 0
    for _layer in range(config.n_layer):
        for rows, inner, cols in ((tokens, d, 3 * d), (tokens, d, d), (tokens, d, f),
                                  (tokens, f, d)):
            forward += 2 * rows * inner * cols
        forward += seqs * config.n_head * 2 * t * (d // config.n_head) * t  # scores
        forward += seqs * config.n_head * 2 * t * t * (d // config.n_head)  # values
    forward += 2 * tokens * d * config.vocab_size
    return int(forward + 2 * forward)
""",
    ),
    # The closed form: 6 FLOPs per matmul weight per token, plus 12 * L * T * d per token.
    "flops_closed_form": (
        "transformer_flops",
        """
def transformer_flops(config, tokens):
    d = config.d_model
    matmul_weights = config.n_layer * (4 * d * d + 2 * d * config.d_ff) + d * config.vocab_size
    return 6 * matmul_weights * tokens + 12 * config.n_layer * config.block_size * d * tokens
""",
    ),
}
