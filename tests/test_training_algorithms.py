"""The four update schemes, run as real torchrun jobs on gloo, against
single-process references written from DESIGN §2.

Tolerance: parameters agree to 1e-5 (absolute) after the stated steps; the
only differences are float summation order (allreduce vs rank-ordered sums).
"""

from __future__ import annotations

import pytest
import torch

from tests.trainjobs import Reference, max_diff, run_job

pytestmark = pytest.mark.slow

TOL = 1e-5
STEPS = 6


def ssgd_reference(workers: int, batch_size: int, steps: int, **opts) -> dict[str, torch.Tensor]:
    """One process at batch N*b with the same global batches."""
    ref = Reference(workers=1, batch_size=workers * batch_size, **opts)
    model = ref.model()
    cfg = ref.cfg
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay)
    for t in range(steps):
        for p, g in zip(model.parameters(), ref.grads(model, t, 0), strict=True):
            p.grad = g
        opt.step()
    return model.state_dict()


def odsgd_reference(steps: int, **opts) -> dict[str, torch.Tensor]:
    """OD-SGD's update rule, all workers simulated in one process; returns W_g(T)."""
    ref = Reference(algorithm="odsgd", servers=1, **opts)
    cfg = ref.cfg
    n = cfg.workers
    glob = ref.model()
    gopt = torch.optim.SGD(glob.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay)
    local = [ref.model() for _ in range(n)]
    lopts = [torch.optim.SGD(m.parameters(), lr=cfg.effective_lr_local,
                             momentum=cfg.effective_momentum_local, weight_decay=cfg.weight_decay)
             for m in local]
    for t in range(steps):
        grads = [ref.grads(local[k], t, k) for k in range(n)]  # g_t^k on W_k(t)
        w_g = [p.detach().clone() for p in glob.parameters()]  # W_g(t)
        for i, p in enumerate(glob.parameters()):  # W_g(t+1) = GlobalOpt(W_g(t), mean g)
            total = grads[0][i].clone()
            for k in range(1, n):
                total.add_(grads[k][i])
            p.grad = total.div_(n)
        gopt.step()
        for k, m in enumerate(local):
            with torch.no_grad():
                for i, p in enumerate(m.parameters()):
                    if t < cfg.warmup_steps:  # SSGD-PS: W_k(t+1) = W_g(t+1)
                        p.copy_(list(glob.parameters())[i])
                        continue
                    g = grads[k][i]
                    if cfg.compensation.value == "dc":
                        g = g + cfg.dc_lambda * g * g * (w_g[i] - p)
                    p.copy_(w_g[i])
                    p.grad = g
            if t >= cfg.warmup_steps:
                lopts[k].step()
    return glob.state_dict()


@pytest.mark.parametrize("overlap", [True, False], ids=["overlap", "flat"])
def test_ssgd_allreduce_equals_one_process_at_n_times_batch(tmp_path, overlap):
    summary, params = run_job(tmp_path, algorithm="ssgd", comm="allreduce", workers=2,
                              batch_size=16, steps=STEPS, overlap=overlap, bucket_mb=0.01)
    assert summary["workers"] == 2 and summary["steps"] == STEPS
    assert max_diff(params, ssgd_reference(2, 16, STEPS)) < TOL


def test_ssgd_ps_equals_allreduce_with_two_shards(tmp_path):
    summary, params = run_job(tmp_path, algorithm="ssgd", comm="ps", workers=2, servers=2,
                              batch_size=16, steps=STEPS, weight_decay=1e-3)
    assert max_diff(params, ssgd_reference(2, 16, STEPS, weight_decay=1e-3)) < TOL
    # Each worker pushes and pulls its whole flat gradient every step.
    per_step = summary["parameter_bytes"]
    assert summary["bytes_sent"]["0"] == STEPS * per_step
    assert summary["bytes_received"]["1"] == STEPS * per_step


def test_asgd_one_worker_is_plain_sgd_at_lr_async(tmp_path):
    summary, params = run_job(tmp_path, algorithm="asgd", workers=1, servers=1, batch_size=32,
                              steps=STEPS, lr=0.05)
    ref = Reference(workers=1, batch_size=32)
    model = ref.model()
    for t in range(STEPS):
        grads = ref.grads(model, t, 0)
        with torch.no_grad():
            for p, g in zip(model.parameters(), grads, strict=True):
                p.add_(g, alpha=-0.05)  # lr_async = lr / N = lr
    assert max_diff(params, model.state_dict()) < TOL
    # One worker: every gradient is applied to the version it was computed on.
    assert summary["staleness"]["histogram"] == {"0": STEPS}


@pytest.mark.parametrize(
    "workers,compensation,warmup",
    [(1, "none", 0), (2, "none", 0), (2, "dc", 2), (1, "dc", 1)],
    ids=["n1", "n2", "n2-dc-warmup", "n1-dc-warmup"],
)
def test_odsgd_matches_reference_update_rule(tmp_path, workers, compensation, warmup):
    opts = dict(workers=workers, batch_size=16, compensation=compensation, warmup_steps=warmup,
                lr_local=0.03, momentum_local=0.5, dc_lambda=0.5)
    _, params = run_job(tmp_path, algorithm="odsgd", servers=1, steps=STEPS, **opts)
    expected = odsgd_reference(STEPS, **opts)
    assert max_diff(params, expected) < TOL
    # The reference differs from plain SSGD, so matching it tests the OD-SGD rule.
    assert max_diff(expected, ssgd_reference(workers, 16, STEPS)) > 10 * TOL
