"""Wrong answers to lesson 01's exercises that the graders must reject."""

LESSON = "01-number-formats"

VARIANTS = {
    "fate_decided_before_cast": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Wrong: decides by the value before the cast, so edge values are misjudged.
    a = x.abs()
    fate = torch.zeros(x.shape, dtype=torch.long)
    fate[(a > 0) & (a < 2.0**-14)] = 1
    fate[(a > 0) & (a < 2.0**-24)] = 2
    fate[torch.isfinite(x) & (a > 65504)] = 3
    return fate
""",
    ),
    "kahan_in_float32": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: accumulates in float32 and casts at the end.
    return torch.as_tensor(values, dtype=torch.float32).sum().to(dtype)
""",
    ),
}
