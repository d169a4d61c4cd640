"The update's shortcuts change nothing: pairs with zero advantage left out, and the per-step gradient diagnostic."
import copy
import pytest, torch
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.train import GRPOTrainer

def trainer(base, tmp_path, name, **kw):
    pol, task = base
    cfg = preset_config('dense+smoke', calibrate=False, log_with='none', eval_images=0, prompts_per_step=4,
                        group_size=4, minibatch=8, **kw)
    return GRPOTrainer(cfg, tmp_path/name, policy=copy.deepcopy(pol), task=task, progress=False)

@pytest.mark.parametrize('fast', [False, True])
def test_skipping_zero_advantages_keeps_the_gradient(base, tmp_path, fast):
    """One step with and without the skip from the same rollout: the same gradient and adapter.

    On the eager path up to float summation order. On the bf16 fast path the skip changes which rows share a matrix
    product, and where bf16 is emulated (CPUs without AVX-512 BF16 or AMX) their rounding differs with the batch:
    there the gradients agree to 1% of their norm (and Adam's first step, which divides by |g|, is not compared)."""
    a, b = (trainer(base, tmp_path, 'skip', skip_zero_adv=True, fast=fast),
            trainer(base, tmp_path, 'full', skip_zero_adv=False, fast=fast))
    c = a.collect(0)
    assert (c['advantages'][:, c['rollout'].trained] == 0).any()  # there is something to skip
    sa, sb = a.update(c['rollout'], c['advantages']), b.update(c['rollout'], c['advantages'])
    assert 0 < sa['skipped'] < 1 and sb['skipped'] == 0
    if fast:
        ga, gb = (torch.cat([p.grad.flatten() for p in t.params]) for t in (a, b))
        assert (ga - gb).norm() <= 1e-2 * gb.norm(), float((ga - gb).norm() / gb.norm())
        return
    for pa, pb in zip(a.params, b.params):
        torch.testing.assert_close(pa.grad, pb.grad, rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(pa, pb, rtol=0, atol=1e-6)
    assert sa['loss'] == pytest.approx(sb['loss'], rel=1e-5, abs=1e-7)  # a mean of ~0 (advantages are centred)

@pytest.mark.parametrize('fast', [False, True])
def test_all_pairs_skipped_still_steps_adam(base, tmp_path, fast):
    """Advantages all zero: the skip gives zero gradients and AdamW still steps (its moments move the adapter), exactly
    as without the skip on the eager path; on the bf16 path the first step's rounding (see above) leaves the two
    adapters apart, so there the zero-advantage step is checked to be a step of Adam's moments alone."""
    one = dict(updates_per_rollout=1)  # one Adam step per update call
    a, b = (trainer(base, tmp_path, 'skip0', skip_zero_adv=True, fast=fast, **one),
            trainer(base, tmp_path, 'full0', skip_zero_adv=False, fast=fast, **one))
    c = a.collect(0)
    for t in (a, b): t.update(c['rollout'], c['advantages'])      # a first step that moves the adapter
    zero = torch.zeros_like(c['advantages'])
    before = [p.detach().clone() for p in a.params]
    sa, sb = a.update(c['rollout'], zero), b.update(c['rollout'], zero)
    assert sa['skipped'] == 1 and all(p.grad is not None and not p.grad.any() for p in a.params)
    assert (all(s['step'] == 2 for s in a.opt.state.values())
            and any(not torch.equal(p, q) for p, q in zip(a.params, before)))
    if not fast:
        for pa, pb in zip(a.params, b.params): torch.testing.assert_close(pa, pb, rtol=0, atol=1e-6)

def test_grad_shares_are_a_diagnostic(base, tmp_path):
    "Shares sum to 1, are 0 where the credit is 0, and the update after them is bitwise the update without them."
    a, b = trainer(base, tmp_path, 'diag'), trainer(base, tmp_path, 'nodiag')
    c = a.collect(0)
    ro, A = c['rollout'], c['advantages']
    shares = a.grad_shares(ro, A)
    ks = ro.trained.nonzero().flatten().tolist()
    assert sorted(shares) == sorted(f'grad_share_{k}' for k in ks)
    assert sum(shares.values()) == pytest.approx(1.0)
    mb = slice(0, a.cfg.minibatch)
    for k in ks:
        if not A[mb, k].any(): assert shares[f'grad_share_{k}'] == 0
    a.update(ro, A); b.update(ro, A)
    for pa, pb in zip(a.params, b.params): assert torch.equal(pa, pb)

def test_update_logs_what_a_collapse_shows_first(base, tmp_path):
    "The adapter's norm and the update's, the ratio's mean and spread, the share of groups without reward spread."
    a = trainer(base, tmp_path, 'norms', fast=False, updates_per_rollout=1)
    c = a.collect(0)
    assert 0 <= c['stats']['zero_spread'] <= 1
    s = a.update(c['rollout'], c['advantages'])
    assert s['adapter_norm'] > 0 and s['update_norm'] > 0
    # one optimizer step per batch on the eager path: the ratio never leaves 1
    assert s['ratio_mean'] == 1.0 and s['ratio_std'] == 0.0

def test_a_collapse_is_warned_once(base, tmp_path):
    a = trainer(base, tmp_path, 'warn', fast=False)
    a.history, a.step = [dict(step=0, eval_overall=0.70), dict(step=5, eval_overall=0.72)], 10
    with pytest.warns(UserWarning,
                      match=r'step 10: the held-out score 0.300 is 0.420 below its best 0.720 \(step 5\), a collapse'):
        a._warn_collapse(0.30)
    a.history.append(dict(step=10, eval_overall=0.30)); a.step = 15
    import warnings
    with warnings.catch_warnings(): warnings.simplefilter('error'); a._warn_collapse(0.20)  # the first collapse only

@pytest.mark.parametrize('method,beta', [('flow_grpo', 0.04), ('dense', 0.0)])
def test_backward_in_chunks_is_the_same_gradient(tmp_path, method, beta):
    """backward_pairs splits a minibatch's pairs over several graphs (memory at full size): the gradient and the logged
    statistics stay the same."""
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.task import load_task
    from flowgrpo_nb.train import GRPOTrainer
    task, grads, stats = load_task('partial'), {}, {}
    for bp in (0, 2):
        cfg = preset_config(f'{method}+smoke', steps=1, eval_images=0, log_with='none', minibatch=8,
                            updates_per_rollout=1, diag_every=0, beta=beta, calib_iters=0, backward_pairs=bp,
                            fast=False)
        tr = GRPOTrainer(cfg, tmp_path/str(bp), task=task, progress=False)
        c = tr.collect(0)
        ks = c['rollout'].trained.nonzero().flatten().tolist()
        st = dict(loss=[], clipfrac=[], approx_kl=[], kl=[], grad_norm=[], skipped=[])
        tr.opt.zero_grad(set_to_none=True)
        rows = torch.arange(c['rollout'].B)
        if bp: assert len(tr._pairs(c['advantages'], ks, rows)[3]) > bp  # indeed more than one chunk
        tr._backward(c['rollout'], c['advantages'], ks, rows, 1, st, None)
        grads[bp], stats[bp] = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in tr.params], st
    assert any(g.abs().max() > 0 for g in grads[0])
    for a, b in zip(grads[0], grads[2]): torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
    for k in ('loss', 'clipfrac', 'approx_kl', 'kl', 'skipped', 'ratio_mean'):
        assert (len(stats[0].get(k, [])) == len(stats[2].get(k, []))
                and all(abs(x - y) <= 1e-6 + 1e-4 * abs(x)
                        for x, y in zip(stats[0].get(k, []), stats[2].get(k, [])))), k

def test_dropping_zero_advantage_rows_scales_the_gradient_by_the_kept_fraction(base, tmp_path):
    """Half the rows' advantages set to 0 by hand: with `drop_zero_adv_rows` (the released TempFlow/Flash update) the
    trainer's gradient is the default's divided by the kept fraction of the pairs, and nothing else differs."""
    one = dict(updates_per_rollout=1, max_grad_norm=1e9)  # one backward pass per update, its gradient not clipped
    a, b = (trainer(base, tmp_path, 'kept', **one), trainer(base, tmp_path, 'dropped', drop_zero_adv_rows=True, **one))
    c = a.collect(0)
    ro, A = c['rollout'], c['advantages'].clone()
    A[::2] = 0                                             # every other row: a tied group's rows
    ks = ro.trained.nonzero().flatten()
    assert A[1::2][:, ks].ne(0).any(1).all()               # the other rows all carry credit
    kept = float(ro.pairs[1::2][:, ks].sum() / ro.pairs[:, ks].sum())
    assert 0 < kept < 1
    sa, sb = a.update(ro, A), b.update(ro, A)
    for pa, pb in zip(a.params, b.params): torch.testing.assert_close(pa.grad, kept * pb.grad, rtol=1e-5, atol=1e-12)
    assert sa['loss'] == pytest.approx(kept * sb['loss'], rel=1e-5)
