"""Unit tests for lesson 09's GPT (course.gpt) and its training script (course.gpt_train)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from course import gpt as G
from course import gpt_train as T
from course.benchmark import count_gpt_flops
from course.launch import launch
from grader import REPO_ROOT

NANO = G.GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, d_model=32, d_ff=64)


@pytest.fixture(scope="module")
def corpus():
    return G.stdlib_corpus(max_bytes=200_000)


def test_corpus_is_real_text_split_by_file_and_repeatable(corpus):
    train, val = corpus
    assert train.dtype == torch.uint8 and val.dtype == torch.uint8
    assert 150_000 <= len(train) + len(val) and len(val) >= 20_000
    assert b"def " in bytes(train[:50_000].tolist()) and b"import" in bytes(val.tolist())
    again = G.stdlib_corpus(max_bytes=200_000)
    assert torch.equal(again[0], train) and torch.equal(again[1], val)
    other = G.stdlib_corpus(max_bytes=200_000, seed=1)
    assert not torch.equal(other[1][:1000], val[:1000]), "the seed shuffles the files"
    with pytest.raises(ValueError):
        G.stdlib_corpus(val_fraction=1.0)


def test_batches_are_shifted_windows_and_repeat_with_the_seed(corpus):
    train, val = corpus
    a = G.random_batches(train, 4, 16, seed=3)
    b = G.random_batches(train, 4, 16, seed=3)
    for _ in range(2):
        (xa, ya), (xb, yb) = next(a), next(b)
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert xa.shape == (4, 16) and xa.dtype == torch.long
        assert torch.equal(xa[:, 1:], ya[:, :-1])
    xv, yv = G.val_batch(val, 16, max_windows=5)
    assert xv.shape == (5, 16) and torch.equal(xv.flatten()[1:], yv.flatten()[:-1])
    assert torch.equal(xv[1], val[16:32].long())


def test_gpt_is_causal_tied_and_sized_as_stated():
    torch.manual_seed(0)
    model = G.GPT(NANO)
    assert model.head.weight is model.tok_emb.weight
    idx = torch.randint(0, 256, (2, 16))
    logits = model(idx)
    assert logits.shape == (2, 16, 256)
    changed = idx.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    again = model(changed)
    assert torch.allclose(logits[:, :10], again[:, :10]), "position 10 must not affect earlier ones"
    assert not torch.allclose(logits[:, 10:], again[:, 10:])
    assert 0.3e6 < G.count_parameters(G.build_gpt("cpu")) < 0.6e6
    with torch.device("meta"):
        big = G.build_gpt("gpu")
    assert 95e6 < G.count_parameters(big) < 110e6
    with pytest.raises(ValueError):
        G.GPTConfig(d_model=30, n_head=4)


def test_meta_flop_count_follows_the_lessons_conventions():
    """count_gpt_flops (the benchmark's MFU numerator) = 3 x forward matmuls, attention over the
    full context, the tied head once, embedding lookups free."""
    for cfg in (NANO, G.CONFIGS["cpu"], replace(NANO, n_layer=3, block_size=8, d_ff=40)):
        tokens = 3 * cfg.block_size
        d, L = cfg.d_model, cfg.n_layer
        forward = 2 * tokens * (L * (4 * d * d + 2 * d * cfg.d_ff + 2 * cfg.block_size * d))
        forward += 2 * tokens * d * cfg.vocab_size
        assert count_gpt_flops(cfg, 3) == 3 * forward


def _train_rank(rank: int, world_size: int, spec: T.RunSpec) -> dict:
    return T.train(spec, torch.device("cpu"))


def test_interrupted_and_resumed_run_is_bit_identical(tmp_path):
    """2 gloo ranks, fp16 with a GradScaler, accumulation 2: 4 steps straight, against 2 steps,
    a checkpoint, and a fresh start that resumes from it."""
    base = T.RunSpec(
        config=NANO, steps=4, batch_size=2, accum=2, dtype="fp16", corpus_bytes=100_000
    )
    straight = launch(_train_rank, 2, (base,), show_output=False)
    ckpt = str(tmp_path / "run.pt")
    first = launch(
        _train_rank,
        2,
        (replace(base, checkpoint=ckpt, save_every=2, stop_after=2),),
        show_output=False,
    )
    resumed = launch(
        _train_rank, 2, (replace(base, checkpoint=ckpt, resume=True),), show_output=False
    )
    assert [r["start_step"] for r in resumed] == [2, 2]
    assert len(first[0]["losses"]) == 2 and len(resumed[0]["losses"]) == 2
    assert first[0]["losses"] + resumed[0]["losses"] == straight[0]["losses"]
    assert resumed[0]["digest"] == resumed[1]["digest"] == straight[0]["digest"]
    assert resumed[0]["scale"] == straight[0]["scale"]
    assert first[0]["digest"] != straight[0]["digest"], "the interrupted run stopped early"
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 2 and state["data_position"] == 4 and len(state["rng"]) == 2
    assert set(state) >= {"model", "optimizer", "scaler", "rng", "step", "data_position"}


def test_script_runs_under_torchrun_with_two_gloo_ranks(tmp_path):
    out = tmp_path / "result.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "course.gpt_train",
            "--steps",
            "2",
            "--d-model",
            "32",
            "--n-layer",
            "1",
            "--block-size",
            "16",
            "--batch-size",
            "2",
            "--dtype",
            "bf16",
            "--corpus-bytes",
            "100000",
            "--out",
            str(out),
        ],  # fmt: skip
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rank(s), backend gloo" in done.stdout
    result = json.loads(out.read_text())
    assert result["world_size"] == 2 and len(result["losses"]) == 2
    assert 4.0 < result["val_loss"] < 6.5


def test_resume_keeps_rng_states_on_the_cpu(tmp_path, monkeypatch):
    """A resume onto an accelerator: the meta device stands in for CUDA. Loading the checkpoint
    onto the model's device would hand ``torch.set_rng_state`` a non-CPU tensor, which it (and
    ``torch.cuda.set_rng_state``) refuses; the generator states must reach it as CPU
    ByteTensors while the weights go to the model's device."""
    model = G.GPT(NANO)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    ckpt = tmp_path / "run.pt"
    T.save_checkpoint(ckpt, model, optimizer, scaler, 3, 7, torch.device("cpu"), False)

    real_load, real_set = torch.load, torch.set_rng_state

    def load_like_a_device(f, map_location=None, **kwargs):
        state = real_load(f, map_location="cpu", **kwargs)
        if str(map_location) == "cpu":
            return state
        return _to_meta(state)

    seen = []

    def spy_set_rng_state(new_state):
        seen.append((new_state.device.type, new_state.dtype))
        return real_set(new_state)

    monkeypatch.setattr(torch, "load", load_like_a_device)
    monkeypatch.setattr(torch, "set_rng_state", spy_set_rng_state)
    with torch.device("meta"):  # built there: .to("meta") would untie the head
        on_device = G.GPT(NANO)
    opt_device = torch.optim.AdamW(on_device.parameters(), lr=1e-3)
    step, position = T.resume_checkpoint(
        ckpt, on_device, opt_device, torch.amp.GradScaler("cpu"), 0, torch.device("meta")
    )
    assert (step, position) == (3, 7)
    assert seen == [("cpu", torch.uint8)]
    assert next(on_device.parameters()).device.type == "meta"


def _to_meta(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to("meta")
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_to_meta(v) for v in obj)
    return obj
