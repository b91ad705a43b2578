"""Lesson 03's exercises: wrong answers the graders must reject (``VARIANTS``) and valid answers
written differently from the reference (``VALID``)."""

VARIANTS = {
    "trace_leaves_hooks_on_error": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: no try/finally, so a forward pass that raises leaves every hook on the model.
    found, handles = {}, []
    for name, module in model.named_modules():
        if name:
            def hook(module, args, output, name=name):
                if isinstance(output, (tuple, list)):
                    output = next(t for t in output if isinstance(t, torch.Tensor))
                found[name] = output.dtype
            handles.append(module.register_forward_hook(hook))
    with torch.amp.autocast(device_type, dtype=dtype):
        model(*inputs)
    for handle in handles:
        handle.remove()
    return found
""",
    ),
    "trace_includes_root": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: hooks the root module too, so the model itself ('') appears in the result.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            def hook(module, args, output, name=name):
                if isinstance(output, (tuple, list)):
                    output = next(t for t in output if isinstance(t, torch.Tensor))
                found[name] = output.dtype
            handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_records_input_dtype": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: records the dtype of each module's first input instead of its output.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    found[name] = args[0].dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_takes_element_zero": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: takes output[0] of a tuple even when that element is not a tensor.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = output[0]
                    found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_lists_unrun_modules": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: gives every submodule an entry, None for those that never ran (they have no output).
    found = {name: None for name, _ in model.named_modules() if name}
    handles = []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next(t for t in output if isinstance(t, torch.Tensor))
                    found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "predict_cpu_answer": (
        "predict_cuda_dtypes",
        """
# Wrong: what the CPU measures (everything in low precision), taken for CUDA.
predict_cuda_dtypes = {name: torch.float16 for name in [
    "conv", "bn", "relu", "pool", "flatten", "fc1", "norm", "gelu", "block", "block.fc",
    "block.act", "fc2", "log_probs"]}
""",
    ),
    "predict_batchnorm_float32": (
        "predict_cuda_dtypes",
        """
# Wrong: believes BatchNorm runs in float32 under autocast (it is on no list).
_h, _s = torch.float16, torch.float32
predict_cuda_dtypes = {"conv": _h, "bn": _s, "relu": _s, "pool": _s, "flatten": _s, "fc1": _h,
                       "norm": _s, "gelu": _s, "block": _s, "block.fc": _h, "block.act": _h,
                       "fc2": _h, "log_probs": _s}
""",
    ),
    "predict_ignores_inherited_dtypes": (
        "predict_cuda_dtypes",
        """
# Wrong: knows the lists, but gives every layer on no list float16 (gelu after layer_norm and the
# residual add of a float32 and a float16 tensor are float32).
_h, _s = torch.float16, torch.float32
predict_cuda_dtypes = {"conv": _h, "bn": _h, "relu": _h, "pool": _h, "flatten": _h, "fc1": _h,
                       "norm": _s, "gelu": _h, "block": _h, "block.fc": _h, "block.act": _h,
                       "fc2": _h, "log_probs": _s}
""",
    ),
    "predict_residual_keeps_last_dtype": (
        "predict_cuda_dtypes",
        """
# Wrong: gives the residual block the dtype of its last op (tanh, float16), forgetting that
# x + act(fc(x)) adds a float32 x and promotes to float32.
_h, _s = torch.float16, torch.float32
predict_cuda_dtypes = {"conv": _h, "bn": _h, "relu": _h, "pool": _h, "flatten": _h, "fc1": _h,
                       "norm": _s, "gelu": _s, "block": _h, "block.fc": _h, "block.act": _h,
                       "fc2": _h, "log_probs": _s}
""",
    ),
    "predict_gelu_float16": (
        "predict_cuda_dtypes",
        """
# Wrong: thinks an activation always returns the autocast dtype, but gelu is on no list and its
# input (layer_norm's output) is float32.
_h, _s = torch.float16, torch.float32
predict_cuda_dtypes = {"conv": _h, "bn": _h, "relu": _h, "pool": _h, "flatten": _h, "fc1": _h,
                       "norm": _s, "gelu": _h, "block": _s, "block.fc": _h, "block.act": _h,
                       "fc2": _h, "log_probs": _s}
""",
    ),
    "predict_tanh_float32": (
        "predict_cuda_dtypes",
        """
# Wrong: puts tanh on the float32 list with exp and log (it is on no list: float16 in, float16 out).
_h, _s = torch.float16, torch.float32
predict_cuda_dtypes = {"conv": _h, "bn": _h, "relu": _h, "pool": _h, "flatten": _h, "fc1": _h,
                       "norm": _s, "gelu": _s, "block": _s, "block.fc": _h, "block.act": _s,
                       "fc2": _h, "log_probs": _s}
""",
    ),
    "trace_leaves_only": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: hooks only modules without children, so containers (an nn.Sequential) are missing.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name and not list(module.children()):
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next(t for t in output if isinstance(t, torch.Tensor))
                    found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_ignores_dtype": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: autocast without dtype= runs in the device's default (bfloat16 on the CPU), whatever
    # dtype was asked for.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                    if output is not None:
                        found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_tuple_only": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: looks inside tuples only, so a module that returns a list crashes the hook.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, tuple):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                    if output is not None:
                        found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_none_for_no_tensor": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: a module whose output holds no tensor (a number) gets an entry of None instead of
    # no entry.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                    found[name] = getattr(output, "dtype", None)
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_assumes_tensor_output": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: reads output.dtype whenever the output is not a tuple or list, so a module that
    # returns a number makes the hook (and the forward pass) raise.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                        if output is None:
                            return
                    found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_floating_only": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: records floating point outputs only, so a module that returns an integer tensor
    # (an argmax) has no entry; its output's dtype is torch.int64.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                    if isinstance(output, torch.Tensor) and output.is_floating_point():
                        found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_first_element_only": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: looks only at element 0 of a tuple and skips the module when that is not a tensor,
    # instead of taking the first element that is one.
    found, handles = {}, []
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = output[0] if output else None
                    if isinstance(output, torch.Tensor):
                        found[name] = output.dtype
                handles.append(module.register_forward_hook(hook))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for handle in handles:
            handle.remove()
    return found
""",
    ),
    "trace_clears_every_hook": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Wrong: cleans up by clearing every forward hook of every module, someone else's too.
    found = {}
    try:
        for name, module in model.named_modules():
            if name:
                def hook(module, args, output, name=name):
                    if isinstance(output, (tuple, list)):
                        output = next((t for t in output if isinstance(t, torch.Tensor)), None)
                    if isinstance(output, torch.Tensor):
                        found[name] = output.dtype
                module.register_forward_hook(hook)
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for module in model.modules():
            module._forward_hooks.clear()
    return found
""",
    ),
    "lse_without_max_shift": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: exponentiates without subtracting the maximum, so large inputs overflow to inf.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        out = x.exp().sum(dim=-1).log()
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_without_cast_inputs": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: custom_fwd without cast_inputs, so under CPU autocast the forward runs in bfloat16.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_gradient_ignores_grad_output": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: the backward returns the softmax without multiplying by the incoming gradient.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_other_device_type": (
        "custom_fwd_function",
        """
_OTHER_DEVICE = "cpu" if env.device_type == "cuda" else "cuda"


class LogSumExp32(torch.autograd.Function):
    # Wrong: decorated for the other device type (device_type="cuda" copied from an example on a
    # CPU run), so the decorator ignores this device's autocast and the forward runs in low
    # precision.
    @staticmethod
    @torch.amp.custom_fwd(device_type=_OTHER_DEVICE, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=_OTHER_DEVICE)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_always_float32": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: no decorators; casts to float32 by hand always, so outside autocast a float64 input
    # gives a float32 result (not the input's dtype) and gradcheck in float64 fails.
    @staticmethod
    def forward(ctx, x):
        x = x.float()
        m = x.amax(dim=-1, keepdim=True)
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_squeeze_drops_batch": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: keeps the reduced dimension and then calls a bare .squeeze(), which also drops a
    # batch dimension of size 1 (shape (1, 11) gives shape () instead of (1,)).
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = ((x - m).exp().sum(dim=-1, keepdim=True).log() + m).squeeze()
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.reshape(x.shape[:-1] + (1,)) * (x - out.reshape(x.shape[:-1] + (1,))).exp()
""",
    ),
    "lse_float32_out_outside_autocast": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: casts float16 and bfloat16 inputs up to float32 by hand, so outside autocast a
    # float16 input gives a float32 result instead of the input's dtype.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_without_custom_bwd": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: no custom_bwd on backward, so a backward() called inside an autocast region runs
    # the backward's ops under that autocast.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, out = ctx.saved_tensors
        return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
    "lse_casts_float64_under_autocast": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Wrong: no decorators; under autocast it casts every floating input to float32 by hand,
    # float64 too, so a float64 input under autocast gives a float32 result.
    @staticmethod
    def forward(ctx, x):
        if torch.is_autocast_enabled(env.device_type):
            x = x.float()
        with torch.amp.autocast(env.device_type, enabled=False):
            m = x.amax(dim=-1, keepdim=True)
            m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        with torch.amp.autocast(env.device_type, enabled=False):
            x, out = ctx.saved_tensors
            return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
}


VALID = {
    "trace_global_hook": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # One global forward hook for every module, mapped back to names; removed in finally.
    names = {id(m): n for n, m in model.named_modules() if n}
    found = {}

    def hook(module, args, output):
        name = names.get(id(module))
        if name is None:
            return
        if not isinstance(output, torch.Tensor):
            tensors = [o for o in output if isinstance(o, torch.Tensor)] if isinstance(
                output, (tuple, list)) else []
            if not tensors:
                return
            output = tensors[0]
        found[name] = output.dtype

    handle = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        with torch.autocast(device_type=device_type, dtype=dtype):
            model(*inputs)
    finally:
        handle.remove()
    return found
""",
    ),
    "trace_exit_stack": (
        "trace_dtypes",
        """
import contextlib


def trace_dtypes(model, inputs, device_type, dtype):
    # contextlib.ExitStack removes every hook however the block is left.
    found = {}
    with contextlib.ExitStack() as stack:
        for name, module in model.named_modules():
            if not name:
                continue
            def record(module, args, output, name=name):
                items = output if isinstance(output, (tuple, list)) else (output,)
                first = next((t for t in items if isinstance(t, torch.Tensor)), None)
                if first is not None:
                    found[name] = first.dtype
            stack.callback(module.register_forward_hook(record).remove)
        stack.enter_context(torch.amp.autocast(device_type, dtype=dtype))
        model(*inputs)
    return found
""",
    ),
    "trace_hooks_always_call": (
        "trace_dtypes",
        """
def trace_dtypes(model, inputs, device_type, dtype):
    # Hooks keyed by module (not by name), registered with always_call=True; the tensors of a
    # tuple or list are filtered first, and the handles removed in finally.
    names = {module: name for name, module in model.named_modules() if name}
    found, handles = {}, []

    def hook(module, args, output):
        items = list(output) if isinstance(output, (tuple, list)) else [output]
        tensors = [t for t in items if torch.is_tensor(t)]
        if tensors:
            found[names[module]] = tensors[0].dtype

    try:
        handles = [m.register_forward_hook(hook, always_call=True) for m in names]
        with torch.amp.autocast(device_type=device_type, dtype=dtype):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return found
""",
    ),
    "predict_from_float32_set": (
        "predict_cuda_dtypes",
        """
# Every layer float16 except those that end in float32 (layer_norm, log_softmax, and what
# inherits float32 from them: gelu, and the residual add with a float32 operand).
_in_float32 = {"norm", "gelu", "block", "log_probs"}
predict_cuda_dtypes = {
    name: torch.float32 if name in _in_float32 else torch.float16
    for name in ["conv", "bn", "relu", "pool", "flatten", "fc1", "norm", "gelu", "block",
                 "block.fc", "block.act", "fc2", "log_probs"]
}
""",
    ),
    "predict_with_aliases": (
        "predict_cuda_dtypes",
        """
# torch.half and torch.float are the same dtype objects as torch.float16 and torch.float32.
predict_cuda_dtypes = dict(zip(
    ["conv", "bn", "relu", "pool", "flatten", "fc1", "norm", "gelu", "block", "block.fc",
     "block.act", "fc2", "log_probs"],
    [torch.half] * 6 + [torch.float] * 3 + [torch.half] * 3 + [torch.float],
))
""",
    ),
    "lse_saves_softmax": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # Saves the softmax itself for the backward pass.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = torch.max(x, dim=-1, keepdim=True).values
        m = torch.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0)
        shifted = torch.exp(x - m)
        total = torch.sum(shifted, dim=-1, keepdim=True)
        ctx.save_for_backward(shifted / total)
        return (torch.log(total) + m).squeeze(-1)

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        (softmax,) = ctx.saved_tensors
        return grad[..., None] * softmax
""",
    ),
    "lse_torch_logsumexp": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # torch.logsumexp subtracts the maximum itself; the backward recomputes the softmax.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.logsumexp(x, dim=-1)

    @staticmethod
    @torch.amp.custom_bwd(device_type=env.device_type)
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return torch.softmax(x, dim=-1) * grad.unsqueeze(-1)
""",
    ),
    "lse_backward_autocast_off_by_hand": (
        "custom_fwd_function",
        """
class LogSumExp32(torch.autograd.Function):
    # No custom_bwd: the backward turns autocast off itself, so it runs with autocast off even
    # when backward() is called inside an autocast region.
    @staticmethod
    @torch.amp.custom_fwd(device_type=env.device_type, cast_inputs=torch.float32)
    def forward(ctx, x):
        m = x.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        out = (x - m).exp().sum(dim=-1).log() + m.squeeze(-1)
        ctx.save_for_backward(x, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        with torch.autocast(env.device_type, enabled=False):
            x, out = ctx.saved_tensors
            return grad.unsqueeze(-1) * (x - out.unsqueeze(-1)).exp()
""",
    ),
}
