"""Lesson 01's hidden inputs, from the builders its drivers and judges share: the cases that tell
a wrong answer apart are in every draw."""

from __future__ import annotations

import math

import torch

from grader.lessons.l01_number_formats.inputs import safe_scale_inputs, underflow_inputs

SEEDS = range(200)
TIE = 2.0**-25


def test_every_underflow_draw_holds_the_float16_tie_and_its_neighbours():
    for seed in SEEDS:
        trials = underflow_inputs(seed)
        with_tie = 0
        for gs, scale in trials:
            products = torch.cat([g.float().flatten() * scale for g in gs]).abs()
            has_tie = bool((products == TIE).any())
            if math.log2(scale).is_integer():
                above = torch.nextafter(torch.tensor(TIE), torch.tensor(1.0))
                below = torch.nextafter(torch.tensor(TIE), torch.tensor(0.0))
                assert has_tie, (seed, scale)
                assert bool((products == above).any()) and bool((products == below).any())
            with_tie += has_tie
        assert with_tie >= 10, seed
        # What the three products become in float16: the tie and below flush, above survives.
        tie = torch.tensor([TIE, TIE * (1 - 2.0**-24), TIE * (1 + 2.0**-23)]).half()
        assert tie.tolist() == [0.0, 0.0, 2.0**-24]


def test_every_safe_scale_draw_has_non_zero_gradients_that_sum_to_zero():
    for seed in SEEDS:
        _trials, cancelling = safe_scale_inputs(seed)
        assert len(cancelling) == 3, seed
        for gs in cancelling:
            values = torch.cat([g.double().flatten() for g in gs])
            assert bool((values != 0).any()), seed
            assert float(values.sum()) == 0.0, seed
            # Summed in the gradients' own dtype, in the order given, the sum is exactly 0 too.
            assert float(sum(g.sum() for g in gs)) == 0.0, seed
        # A tensor and its negation: the list cancels although no tensor does on its own.
        pair = cancelling[1]
        assert len(pair) == 2 and float(pair[0].double().sum()) != 0.0
