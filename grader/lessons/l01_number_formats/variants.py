"""Lesson 01's exercises: wrong answers the graders must reject (``VARIANTS``, each a real
misconception, commented) and valid answers written differently from the reference (``VALID``)."""

VARIANTS = {
    # fp16_bits ---------------------------------------------------------------------------------
    "bits_without_mask": (
        "fp16_bits",
        """
def fp16_bits(x):
    # Wrong: int16 is signed; without the 0xFFFF mask a negative number's sign comes out as -1.
    bits = x.view(torch.int16).to(torch.int32)
    return bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
""",
    ),
    "bits_from_the_value": (
        "fp16_bits",
        """
def fp16_bits(x):
    # Wrong: reads the fields off the value with frexp, not off the bits: -0.0 gets sign 0,
    # subnormals, inf and nan get made-up exponents.
    sign = (x < 0).long()
    mantissa, exponent = torch.frexp(x.float().abs())
    exponent = (exponent.long() + 14).clamp(0, 31)
    mantissa = ((mantissa.double() * 2 - 1) * 1024).round().long().clamp(0, 1023)
    return sign, exponent, mantissa
""",
    ),
    "bits_unbiased_exponent": (
        "fp16_bits",
        """
def fp16_bits(x):
    # Wrong: returns the power of two (exponent bits minus the bias 15), not the stored bits.
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, ((bits >> 10) & 0x1F) - 15, bits & 0x3FF
""",
    ),
    # fp16_fate ---------------------------------------------------------------------------------
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
    "fate_zero_is_flushed": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Wrong: every 0 after the cast counts as flushed, also values that were exactly 0 before.
    h = x.half()
    fate = torch.zeros(x.shape, dtype=torch.long)
    fate[(h != 0) & (h.abs() < 2.0**-14)] = 1
    fate[h == 0] = 2
    fate[torch.isinf(h) & torch.isfinite(x)] = 3
    return fate
""",
    ),
    "fate_inf_input_overflows": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Wrong: every inf after the cast counts as an overflow, also values that already were inf.
    h = x.half()
    fate = torch.zeros(x.shape, dtype=torch.long)
    fate[(h != 0) & (h.abs() < 2.0**-14)] = 1
    fate[(h == 0) & (x != 0)] = 2
    fate[torch.isinf(h)] = 3
    return fate
""",
    ),
    # kahan_sum ---------------------------------------------------------------------------------
    "kahan_in_float32": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: accumulates in float32 and casts at the end.
    return torch.as_tensor(values, dtype=torch.float32).sum().to(dtype)
""",
    ),
    "kahan_without_compensation": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: a plain running sum in dtype; the compensation c is what Kahan adds.
    s = torch.zeros((), dtype=dtype)
    for v in torch.as_tensor(values, dtype=dtype).flatten():
        s = s + v
    return s
""",
    ),
    "kahan_trusts_torch_sum": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: torch.sum of a float16 tensor is not Kahan's recurrence (it accumulates wider and
    # in its own order), so its last bit differs on some inputs.
    return torch.as_tensor(values, dtype=dtype).sum()
""",
    ),
    "kahan_final_correction": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: the recurrence, then a final correction s - c (the contract returns s itself); on a
    # small value followed by a large one c is itself rounded, and s - c is a different number.
    xs = torch.as_tensor(values, dtype=dtype).flatten()
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=dtype)
    for v in xs:
        y = v - c
        t = s + y
        c = (t - s) - y
        s = t
    return s - c
""",
    ),
    "kahan_neumaier": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: Neumaier's variant (compensate by whichever operand is larger, add c at the end) is
    # a different recurrence with different results, not the one the task states.
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=dtype)
    for v in torch.as_tensor(values, dtype=dtype).flatten():
        t = s + v
        if s.abs() >= v.abs():
            c = c + ((s - t) + v)
        else:
            c = c + ((v - t) + s)
        s = t
    return s + c
""",
    ),
    "kahan_compensation_in_float32": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # Wrong: s is rounded to dtype, but y, c and the differences are kept in float32.
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=torch.float32)
    for v in torch.as_tensor(values, dtype=dtype).flatten():
        y = v.float() - c
        t = (s.float() + y).to(dtype)
        c = (t.float() - s.float()) - y
        s = t
    return s
""",
    ),
    # underflow_fraction ------------------------------------------------------------------------
    "underflow_counts_zeros": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: divides by every element, zeros included, instead of by the non-zero ones.
    total = lost = 0
    for g in grads:
        g = g.float()
        total += g.numel()
        lost += int((((g * scale).half() == 0) & (g != 0)).sum())
    return lost / total if total else 0.0
""",
    ),
    "underflow_casts_before_scaling": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: casts to float16 first and scales afterwards; by then the small values are gone.
    nonzero = lost = 0
    for g in grads:
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int(((g.half() * scale) == 0)[keep].sum())
    return lost / nonzero if nonzero else 0.0
""",
    ),
    "underflow_counts_subnormals": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: counts values that become subnormal as lost too; they lose precision, not their value.
    nonzero = lost = 0
    for g in grads:
        g = g.float()
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int(((g * scale).half().abs() < 2.0**-14)[keep].sum())
    return lost / nonzero if nonzero else 0.0
""",
    ),
    "underflow_returns_tensor": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: counts right but returns the 0-d tensor of the division, not a Python float.
    if not grads:
        return 0.0
    flat = torch.cat([g.float().flatten() for g in grads])
    nonzero = flat != 0
    if not bool(nonzero.any()):
        return 0.0
    lost = ((flat * scale).half() == 0) & nonzero
    return lost.sum() / nonzero.sum()
""",
    ),
    "underflow_scales_in_input_dtype": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: multiplies in the gradient's own dtype, (g * scale).half(), not in float32 as stated;
    # a bfloat16 product is rounded to bfloat16 first, and just above 2^-25 that tips it to 0.
    nonzero = lost = 0
    for g in grads:
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int(((g * scale).half() == 0)[keep].sum())
    return lost / nonzero if nonzero else 0.0
""",
    ),
    "underflow_empty_returns_int": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: right whenever something is non-zero, but returns the int 0, not the float 0.0 the
    # task asks for, when nothing is.
    nonzero = lost = 0
    for g in grads:
        g = g.float()
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int(((g * scale).half() == 0)[keep].sum())
    return lost / nonzero if nonzero else 0
""",
    ),
    "underflow_tie_survives": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Wrong: counts a product as lost only below 2^-25; 2^-25 itself lies halfway between 0 and
    # 2^-24 and rounds to even, 0, so it is lost too.
    nonzero = lost = 0
    for g in grads:
        product = g.float() * scale
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int((keep & (product.abs() < 2.0**-25)).sum())
    return lost / nonzero if nonzero else 0.0
""",
    ),
    # max_safe_scale ----------------------------------------------------------------------------
    "safe_scale_trusts_log2": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: trusts floor(log2(65504 / a)); the division rounds, so just above a boundary the
    # answer is one power of two too large.
    amax = max((g.detach().abs().max().double().item() for g in grads if g.numel()), default=0.0)
    if amax == 0.0:
        raise ValueError("every gradient is zero")
    return float(2.0 ** math.floor(math.log2(65504.0 / amax)))
""",
    ),
    "safe_scale_ignores_sign": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: the largest value, not the largest magnitude: large negative gradients overflow too.
    amax = max((g.detach().max().double().item() for g in grads if g.numel()), default=0.0)
    if amax <= 0.0:
        raise ValueError("every gradient is zero")
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while amax * 2.0**k > 65504.0:
        k -= 1
    return float(2.0**k)
""",
    ),
    "safe_scale_strictly_below": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: requires |g| * 2^k < 65504; 65504 itself is a float16 number and does not overflow.
    amax = max((g.detach().abs().max().double().item() for g in grads if g.numel()), default=0.0)
    if amax == 0.0:
        raise ValueError("every gradient is zero")
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) < 65504.0:
        k += 1
    while amax * 2.0**k >= 65504.0:
        k -= 1
    return float(2.0**k)
""",
    ),
    "safe_scale_abs_of_max": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: |max(g)| instead of max(|g|): a negative gradient larger in magnitude than every
    # positive one is missed.
    amax = max((abs(g.detach().max().double().item()) for g in grads if g.numel()), default=0.0)
    if amax == 0.0:
        raise ValueError("every gradient is zero")
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while amax * 2.0**k > 65504.0:
        k -= 1
    return float(2.0**k)
""",
    ),
    "safe_scale_first_tensor": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: takes the largest magnitude of the first non-zero tensor only; the largest gradient
    # of the list may sit in any of its tensors.
    nonzero = [g for g in grads if g.numel() and bool((g != 0).any())]
    if not nonzero:
        raise ValueError("every gradient is zero")
    amax = nonzero[0].detach().abs().max().double().item()
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while amax * 2.0**k > 65504.0:
        k -= 1
    return float(2.0**k)
""",
    ),
    "safe_scale_returns_int": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: the right k, but 2**k with an int k >= 0 is a Python int, not the float asked for.
    amax = max((g.detach().abs().max().double().item() for g in grads if g.numel()), default=0.0)
    if amax == 0.0:
        raise ValueError("every gradient is zero")
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while amax * 2.0**k > 65504.0:
        k -= 1
    return 2**k
""",
    ),
    "safe_scale_in_float32": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: compares in float32; a float64 magnitude just above a boundary rounds onto it in
    # float32, and the scale comes out one power of two too large.
    present = [g.detach().abs().max().float() for g in grads if g.numel()]
    amax = torch.stack(present).max() if present else torch.tensor(0.0)
    if amax == 0:
        raise ValueError("every gradient is zero")
    k = 0
    while amax * 2.0**k > 65504.0:
        k -= 1
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    return float(2.0**k)
""",
    ),
    "safe_scale_in_gradient_dtype": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: compares amax * 2^k with 65504 in the gradient's own dtype; in bfloat16 65504 rounds
    # to 65536, so a power-of-two amax gets a scale twice too large (and float32 overflows).
    present = [g.detach().abs().max() for g in grads if g.numel()]
    if not present or max(float(p) for p in present) == 0.0:
        raise ValueError("every gradient is zero")
    amax = max(present, key=float)
    k = 0
    while amax * 2.0**k > 65504.0:
        k -= 1
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    return float(2.0**k)
""",
    ),
    "safe_scale_raises_when_sum_is_zero": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Wrong: raises when the gradients sum to zero; non-zero gradients that cancel still have a
    # largest magnitude, and only all-zero gradients leave no scale to find.
    if float(sum(g.detach().double().sum() for g in grads)) == 0.0:
        raise ValueError("every gradient is zero")
    amax = max(g.detach().abs().max().double().item() for g in grads if g.numel())
    k = math.floor(math.log2(65504.0 / amax))
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while amax * 2.0**k > 65504.0:
        k -= 1
    return float(2.0**k)
""",
    ),
}

VALID = {
    # fp16_bits ---------------------------------------------------------------------------------
    "bits_by_integer_division": (
        "fp16_bits",
        """
def fp16_bits(x):
    # The fields by integer arithmetic on the 16 bits as an unsigned number (int64 results).
    u = x.view(torch.int16).to(torch.int64) % 65536
    return u // 32768, (u // 1024) % 32, u % 1024
""",
    ),
    "bits_by_bitwise_functions": (
        "fp16_bits",
        """
def fp16_bits(x):
    # torch's named bitwise functions instead of operators.
    bits = torch.bitwise_and(x.view(torch.int16).int(), 0xFFFF)
    sign = torch.bitwise_right_shift(bits, 15)
    exponent = torch.bitwise_and(torch.bitwise_right_shift(bits, 10), 0b11111)
    mantissa = torch.bitwise_and(bits, 0b1111111111)
    return sign, exponent, mantissa
""",
    ),
    "bits_viewed_as_uint16": (
        "fp16_bits",
        """
def fp16_bits(x):
    # The bits viewed as unsigned 16-bit integers, so no sign to mask off; widened for the shifts.
    bits = x.view(torch.uint16).to(torch.int32)
    return bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
""",
    ),
    "bits_masked_in_int16": (
        "fp16_bits",
        """
def fp16_bits(x):
    # Stays in int16: the arithmetic shift copies the sign bit, and each mask keeps only the field.
    bits = x.view(torch.int16)
    return (bits >> 15) & 1, (bits >> 10) & 0x1F, bits & 0x3FF
""",
    ),
    # fp16_fate ---------------------------------------------------------------------------------
    "fate_by_where": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Nested torch.where, overflow checked first.
    h = x.to(torch.float16)
    subnormal = (h != 0) & (h.abs() < 2.0**-14)
    flushed = (h == 0) & (x != 0)
    overflow = h.isinf() & ~x.isinf()
    return torch.where(overflow, 3, torch.where(flushed, 2, torch.where(subnormal, 1, 0))).long()
""",
    ),
    "fate_by_float16_bits": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Read the fate off the float16 bit pattern: exponent field 0 is subnormal (or zero),
    # exponent 31 with mantissa 0 is inf.
    bits = x.half().view(torch.int16).int() & 0x7FFF
    exponent, mantissa = bits >> 10, bits & 0x3FF
    fate = torch.zeros_like(bits, dtype=torch.long)
    fate[(exponent == 0) & (mantissa != 0)] = 1
    fate[(bits == 0) & (x != 0)] = 2
    fate[(exponent == 31) & (mantissa == 0) & torch.isfinite(x)] = 3
    return fate
""",
    ),
    "fate_thresholds_before_cast": (
        "fp16_fate",
        """
def fp16_fate(x):
    # Flush and overflow read off the float32 value by the exact rounding thresholds (at most
    # 2^-25 rounds to 0, from 65520 up to inf); subnormal from the cast value.
    a = x.abs()
    h = x.half()
    fate = torch.zeros(x.shape, dtype=torch.long, device=x.device)
    fate[(h != 0) & (h.abs() < torch.finfo(torch.float16).smallest_normal)] = 1
    fate[(x != 0) & (a <= 2.0**-25)] = 2
    fate[torch.isfinite(x) & (a >= 65520.0)] = 3
    return fate
""",
    ),
    # kahan_sum ---------------------------------------------------------------------------------
    "kahan_indexed_loop": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # The same recurrence over indices, updating c and s together.
    xs = torch.as_tensor(values, dtype=dtype).reshape(-1)
    s = c = torch.tensor(0.0, dtype=dtype)
    for i in range(xs.numel()):
        y = xs[i] - c
        t = s + y
        c, s = (t - s) - y, t
    return s
""",
    ),
    "kahan_torch_functions": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # torch.add/torch.sub over the unbound elements, with a helper for one step.
    def step(state, v):
        s, c = state
        y = torch.sub(v, c)
        t = torch.add(s, y)
        return t, torch.sub(torch.sub(t, s), y)

    state = (torch.zeros((), dtype=dtype), torch.zeros((), dtype=dtype))
    for v in torch.as_tensor(values, dtype=dtype).flatten().unbind():
        state = step(state, v)
    return state[0]
""",
    ),
    "kahan_negated_compensation": (
        "kahan_sum",
        """
def kahan_sum(values, dtype=torch.float16):
    # The same recurrence with c kept negated: y = v + c, c = y - (t - s). Negation is exact, so
    # every rounded result is the same.
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=dtype)
    for v in torch.as_tensor(values, dtype=dtype).flatten():
        y = v + c
        t = s + y
        c = y - (t - s)
        s = t
    return s
""",
    ),
    # underflow_fraction ------------------------------------------------------------------------
    "underflow_one_tensor_in_torch": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Everything in one float32 tensor; the fraction computed by torch (in float32).
    if not grads:
        return 0.0
    flat = torch.cat([g.float().flatten() for g in grads])
    nonzero = flat != 0
    if not bool(nonzero.any()):
        return 0.0
    lost = ((flat * scale).half() == 0) & nonzero
    return (lost.sum() / nonzero.sum()).item()
""",
    ),
    "underflow_non_zero_values_first": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # Keep only the non-zero values of each tensor, then count which of them flush.
    kept = [g.float()[g.float() != 0] for g in grads]
    nonzero = sum(v.numel() for v in kept)
    lost = sum(int(((v * scale).half() == 0).sum()) for v in kept)
    return lost / nonzero if nonzero else 0.0
""",
    ),
    "underflow_threshold_on_the_product": (
        "underflow_fraction",
        """
def underflow_fraction(grads, scale):
    # The float32 product flushes exactly when its magnitude is at most 2^-25 (2^-25 itself ties
    # to even, 0); no float16 tensor is made.
    nonzero = lost = 0
    for g in grads:
        product = g.float() * scale
        keep = g != 0
        nonzero += int(keep.sum())
        lost += int((keep & (product.abs() <= 2.0**-25)).sum())
    return float(lost / nonzero) if nonzero else 0.0
""",
    ),
    # max_safe_scale ----------------------------------------------------------------------------
    "safe_scale_by_frexp": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Exact, without log2: a = m * 2^e with 0.5 <= m < 1, and 65504 = 0.99951171875 * 2^16, so
    # a * 2^k <= 65504 exactly when k <= 16 - e (if m <= 0.99951171875) or k <= 15 - e.
    amax = max((float(g.detach().abs().max()) for g in grads if g.numel()), default=0.0)
    if amax == 0.0:
        raise ValueError("all gradients are zero")
    m, e = math.frexp(amax)
    k = 16 - e if m <= 65504.0 / 2.0**16 else 15 - e
    return math.ldexp(1.0, k)
""",
    ),
    "safe_scale_by_search": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Walk the power of two down, then up, checking the condition itself at every step.
    present = [g.detach().abs().max().double() for g in grads if g.numel()]
    amax = torch.stack(present).max().item() if present else 0.0
    if amax == 0.0:
        raise ValueError("all gradients are zero")
    k = 0
    while amax * 2.0**k > 65504.0:
        k -= 1
    while amax * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    return 2.0**k
""",
    ),
    "safe_scale_by_bisection": (
        "max_safe_scale",
        """
def max_safe_scale(grads):
    # Bisection on k over float64's whole exponent range, testing the condition with ldexp.
    amax = 0.0
    for g in grads:
        if g.numel():
            amax = max(amax, float(g.detach().abs().max()))
    if amax == 0.0:
        raise ValueError("every gradient is zero")
    lo, hi = -1100, 1100
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if amax * math.ldexp(1.0, mid) <= 65504.0:
            lo = mid
        else:
            hi = mid - 1
    return math.ldexp(1.0, lo)
""",
    ),
}
