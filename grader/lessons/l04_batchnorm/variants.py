"""Wrong answers to lesson 04's exercises that the graders must reject, and valid ones they keep."""

_HOOKS = """
    def to_float32(module, args):
        return tuple(a.float() for a in args)

    def to_float16(module, args, output):
        return output.half()
"""

VARIANTS = {
    "norms_in_half_too": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: converts the normalization layers to float16 as well.
    return model.half()
""",
    ),
    "only_batchnorm2d": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: only nn.BatchNorm2d is kept in float32; BatchNorm1d/3d, LayerNorm, GroupNorm are not.
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, nn.BatchNorm2d):
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "norm_base_class": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: BatchNorm's base class _NormBase also covers InstanceNorm1d/2d/3d, which the
    # task's list does not name: they stay float32.
    norm_types = (nn.modules.batchnorm._NormBase, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.float()
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "instance_norm_kept": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: adds the InstanceNorm classes to the task's list.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
                  nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.float()
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "rms_norm_kept": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: adds nn.RMSNorm to the task's list.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm,
                  nn.RMSNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.float()
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "exact_type_match": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: compares exact types, so subclasses of the norm layers become float16.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if type(module) in norm_types:
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "float32_output": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: the normalization layers return float32 instead of casting back to float16.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.register_forward_pre_hook(to_float32)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "half_then_float": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: the round trip through float16 turns running variances above 65504 into inf.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    model.half()
    for module in model.modules():
        if isinstance(module, norm_types):
            module.float()
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
    return model
""",
    ),
    "norm_input_not_cast": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: keeps the normalization layers' tensors in float32 but never casts their input, so
    # they compute on float16 input (CPU kernels accept float16 input with float32 weights and
    # return float16, so nothing fails here; the tests watch what F.batch_norm etc. receive).
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
    for module in model.modules():
        if not isinstance(module, norm_types):
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "other_buffers_left_float32": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: converts only the parameters outside the normalization layers; floating point
    # buffers of the other modules stay float32 (the contract sends every one to float16).
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
    return model
""",
    ),
    "affine_round_trip": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: saves and restores only the running statistics around model.half(), so the
    # weight and bias of every normalization layer make a round trip through float16 and come
    # back rounded (finite, close, but no longer their exact float32 values).
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    norms = [m for m in model.modules() if isinstance(m, norm_types)]
    saved = [{n: b.clone() for n, b in m.named_buffers(recurse=False)} for m in norms]
    model.half()
    for m, buffers in zip(norms, saved):
        m.float()
        for n, b in buffers.items():
            setattr(m, n, b)
        m.register_forward_pre_hook(to_float32)
        m.register_forward_hook(to_float16)
    return model
""",
    ),
    "root_tensors_skipped": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: walks the children recursively and converts each child's own tensors, but never
    # the root module's: a model class that holds a parameter or buffer itself keeps it float32.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    def convert(module):
        for child in module.children():
            if isinstance(child, norm_types):
                child.register_forward_pre_hook(to_float32)
                child.register_forward_hook(to_float16)
                continue
            for p in child.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in child.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(child, name, b.half())
            convert(child)

    convert(model)
    return model
""",
    ),
    "momentum_unchanged": (
        "bn_momentum",
        """
def pytorch_momentum(keras_momentum):
    # Wrong: the two conventions weigh opposite terms; the number cannot be reused as is.
    k = float(keras_momentum)
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {keras_momentum!r}")
    return k
""",
    ),
    "momentum_reciprocal": (
        "bn_momentum",
        """
def pytorch_momentum(keras_momentum):
    # Wrong: momentum is a weight, not a rate; 1 / keras is not the other convention.
    k = float(keras_momentum)
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {keras_momentum!r}")
    return 1.0 / k
""",
    ),
    "momentum_nan_accepted": (
        "bn_momentum",
        """
def pytorch_momentum(keras_momentum):
    # Wrong: rejects values below 0 and above 1 one comparison at a time, so NaN (for which
    # every comparison is False) slips through and becomes a NaN momentum.
    k = float(keras_momentum)
    if k < 0.0 or k > 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {keras_momentum!r}")
    return 1.0 - k
""",
    ),
    "integer_buffers_halved": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Wrong: converts every buffer outside the normalization layers to float16, integer ones too
    # (.half() converts only floating point tensors; a counter or an index buffer must stay long).
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
"""
        + _HOOKS
        + """
    for module in model.modules():
        if isinstance(module, norm_types):
            module.register_forward_pre_hook(to_float32)
            module.register_forward_hook(to_float16)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                setattr(module, name, b.half())
    return model
""",
    ),
    "momentum_float32_tensor": (
        "bn_momentum",
        """
def pytorch_momentum(keras_momentum):
    # Wrong: computes 1 - k in a float32 tensor, so the result carries float32's rounding
    # (0.9 comes back as 0.100000024) instead of the Python float 1 - k.
    k = float(keras_momentum)
    if not 0.0 <= k <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {keras_momentum!r}")
    return float(1 - torch.tensor(k))
""",
    ),
}

VALID = {
    "norm_wrapper_modules": (
        "keep_norm_fp32",
        """
class _Float32Norm(nn.Module):
    # Runs the wrapped normalization layer on float32 input and hands back float16.
    def __init__(self, norm):
        super().__init__()
        self.norm = norm

    def forward(self, x):
        return self.norm(x.float()).half()


def half_with_fp32_norm(model):
    # Valid: wraps every normalization layer in a module that casts in and out, instead of hooks.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)

    def convert(module):
        for name, child in list(module.named_children()):
            if isinstance(child, norm_types):
                setattr(module, name, _Float32Norm(child))
            else:
                convert(child)
        for p in module.parameters(recurse=False):
            p.data = p.data.to(torch.float16)
        for name, b in list(module.named_buffers(recurse=False)):
            if torch.is_floating_point(b):
                module.register_buffer(name, b.to(torch.float16))

    convert(model)
    return model
""",
    ),
    "norm_save_and_restore": (
        "keep_norm_fp32",
        """
import copy


def half_with_fp32_norm(model):
    # Valid: keeps a float32 copy of every normalization layer's state, converts the whole model
    # with .half(), then puts the norms back to float32 from the copies (not through float16).
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
    norms = [m for m in model.modules() if isinstance(m, norm_types)]
    saved = [copy.deepcopy(m.state_dict()) for m in norms]
    model.half()
    for m, state in zip(norms, saved):
        m.float()
        m.load_state_dict(state)
        m.register_forward_pre_hook(lambda mod, args: (args[0].to(torch.float32),) + args[1:])
        m.register_forward_hook(lambda mod, args, out: out.to(torch.float16))
    return model
""",
    ),
    "forward_wrapped_copy": (
        "keep_norm_fp32",
        """
import copy


def half_with_fp32_norm(model):
    # Valid: works on a copy and returns it; finds the norms through torch's _BatchNorm base;
    # wraps each norm instance's forward (no hooks); converts the other modules' own tensors.
    model = copy.deepcopy(model)
    norm_types = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)

    def float32_inside(forward):
        def wrapped(x):
            return forward(x.to(torch.float32)).to(torch.float16)

        return wrapped

    for module in model.modules():
        if isinstance(module, norm_types):
            module.forward = float32_inside(module.forward)
            continue
        for p in module.parameters(recurse=False):
            p.data = p.data.to(torch.float16)
        for name, b in module.named_buffers(recurse=False):
            if b.is_floating_point():
                module.register_buffer(name, b.to(torch.float16))
    return model
""",
    ),
    "cast_all_but_norm_tensors": (
        "keep_norm_fp32",
        """
def half_with_fp32_norm(model):
    # Valid: collects the norms' tensors first and casts every other floating point tensor,
    # found through named_parameters/named_buffers of each module; hooks written with .to().
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
    norms = [m for m in model.modules() if isinstance(m, norm_types)]
    keep = {id(t) for m in norms for t in [*m.parameters(), *m.buffers()]}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            if id(p) not in keep and p.is_floating_point():
                p.data = p.data.to(torch.half)
        for name, b in list(m.named_buffers(recurse=False)):
            if id(b) not in keep and b.is_floating_point():
                setattr(m, name, b.to(torch.half))
    for m in norms:
        m.register_forward_pre_hook(lambda mod, args: (args[0].to(torch.float32), *args[1:]))
        m.register_forward_hook(lambda mod, args, out: out.to(torch.half))
    return model
""",
    ),
    "momentum_fraction": (
        "bn_momentum",
        """
import math
from fractions import Fraction


def pytorch_momentum(keras_momentum):
    # Valid: checks finiteness and range separately, computes 1 - k exactly and rounds once.
    k = float(keras_momentum)
    if math.isnan(k) or k < 0 or k > 1:
        raise ValueError(f"Keras momentum must lie in [0, 1], got {keras_momentum!r}")
    return float(1 - Fraction(k))
""",
    ),
    "helper_named_wrap": (
        "keep_norm_fp32",
        """
def _wrap(module):
    # The student's own helper, named like one of the hidden tests' helpers: keeps one
    # normalization layer in float32 between a cast in and a cast out.
    module.float()
    module.register_forward_pre_hook(
        lambda m, args: tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a
                              for a in args))
    module.register_forward_hook(lambda m, args, output: output.half())
    return module


def half_with_fp32_norm(model):
    # Valid: the norm layers handled by a module-level helper called _wrap.
    norm_types = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.LayerNorm, nn.GroupNorm)
    for module in model.modules():
        if isinstance(module, norm_types):
            _wrap(module)
        else:
            for p in module.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in module.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(module, name, b.half())
    return model
""",
    ),
    "momentum_not_in_range": (
        "bn_momentum",
        """
def pytorch_momentum(keras_momentum):
    # Valid: the range test written as a negated chain, the result as float(1 - k).
    if not (0 <= keras_momentum <= 1):
        raise ValueError("momentum is a weight between 0 and 1")
    return float(1 - float(keras_momentum))
""",
    ),
}
