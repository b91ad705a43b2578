"""Wrong answers to lesson 04's exercises that the graders must reject."""

LESSON = "04-batchnorm"

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
}
