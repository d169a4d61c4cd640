"Property tests of the credit rules (flowgrpo_nb.credit, from nbs/05_credit.ipynb)."
import math
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings, strategies as st, HealthCheck

from flowgrpo_nb.credit import (METHODS, Credit, CreditConfig, calibrate_exploration, compute_credit, credit_dense,
                                credit_flow_grpo, credit_stepwise, credit_turning_point, find_turning_points,
                                group_stats, step_gains, step_spans, synthetic_values, turning_point_rewards)

torch.set_num_threads(1)
FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# every variant of every rule whose choices change the arithmetic
CONFIGS = ([CreditConfig(method='flow_grpo', global_std=g) for g in (True, False)]
           + [CreditConfig(method=m, untrained=u) for m in ('stepwise', 'dense') for u in ('fold', 'drop')]
           + [CreditConfig(method='turning_point', tp_constraint=c, tp_balance=b, untrained=u)
              for c in (True, False) for b in (True, False) for u in ('fold', 'drop')])
CFG_IDS = [f"{c.method}-{c.global_std}-{c.untrained}-{c.tp_constraint}-{c.tp_balance}" for c in CONFIGS]


@st.composite
def batches(draw, integer=True, max_groups=3, max_g=4, max_k=6):
    """(V [B, K+1] float64, group [B] non-contiguous ids, trained [K] with the last step untrained).
    integer=True: values in -3..3 (many ties and zero gains, which exercise the sign rules); else standard normal."""
    P = draw(st.integers(1, max_groups))
    sizes = [draw(st.integers(2, max_g)) for _ in range(P)]
    K = draw(st.integers(2, max_k))
    ids = draw(st.lists(st.integers(-50, 50), min_size=P, max_size=P, unique=True))
    group = torch.tensor([i for i, n in zip(ids, sizes) for _ in range(n)])
    B = len(group)
    perm = torch.tensor(draw(st.permutations(range(B))))
    group = group[perm]
    win = draw(st.lists(st.booleans(), min_size=K - 1, max_size=K - 1).filter(any))
    trained = torch.tensor(win + [False])
    if integer: V = torch.tensor(draw(st.lists(st.integers(-3, 3), min_size=B * (K + 1), max_size=B * (K + 1))))
    else: V = torch.randn(B * (K + 1), generator=torch.Generator().manual_seed(draw(st.integers(0, 2**32))))
    return V.to(torch.float64).reshape(B, K + 1), group, trained


def _adv(V, group, trained, cfg): return compute_credit(V, group, trained, cfg).advantages


# ---------------------------------------------------------------- gains

@FAST
@given(batches(integer=False), st.sampled_from(['fold', 'drop']))
def test_gains_telescope(b, untrained):
    V, group, trained = b
    g = step_gains(V, trained, untrained)
    assert (g[:, ~trained] == 0).all()
    start, end = step_spans(trained, untrained)
    first = start[0]
    if untrained == 'fold':  # trained gains telescope from the first trained state to R
        torch.testing.assert_close(g.sum(1), V[:, -1] - V[:, first])
    else:  # each trained step earns only its own gain
        torch.testing.assert_close(g[:, start], V[:, start + 1] - V[:, start])
    # over the full window, both telescope to R(x_K) - V_0 when the last (ODE) step changes nothing
    Vf = V.clone(); Vf[:, -2] = Vf[:, -1]
    full = torch.arange(V.shape[1] - 1) < V.shape[1] - 2
    torch.testing.assert_close(step_gains(Vf, full, untrained).sum(1), Vf[:, -1] - Vf[:, 0])


# ---------------------------------------------------------------- invariances

@FAST
@given(batches(integer=False))
def test_identical_rewards_give_zero_advantages(b):
    V, group, trained = b
    first = torch.tensor([int((group == g).nonzero()[0]) for g in group])
    same = V[first]  # every sample a copy of its group's first: rewards identical step by step within each group
    flat = V[first, -1:].expand_as(V)  # and a value that never changes along the trajectory either
    for cfg in CONFIGS:
        # Stepwise normalises over the steps too: copies still differ from step to step, so only `flat` is
        # "identical rewards" for it
        if cfg.method != 'stepwise': assert (_adv(same, group, trained, cfg) == 0).all(), cfg
        assert (_adv(flat, group, trained, cfg) == 0).all(), cfg


def _transform(V, a, b): return V * a + b


@FAST
@given(batches(integer=False), st.floats(0.1, 10), st.floats(-10, 10))
def test_shift_and_scale_exact_when_eps_scales(b, a, c):
    "A(aV + c) with eps·a equals A(V) with eps: the only non-invariance is eps itself."
    V, group, trained = b
    for cfg in CONFIGS:
        if cfg.method == 'turning_point':  # signs of float differences may flip by rounding under aV + c
            continue
        A1 = _adv(V, group, trained, cfg)
        A2 = _adv(_transform(V, a, c), group, trained, replace(cfg, eps=cfg.eps * a))
        torch.testing.assert_close(A2, A1, rtol=1e-6, atol=1e-6 * (1 + abs(c) / a))


@FAST
@given(batches(), st.integers(-2, 2), st.integers(-5, 5))
def test_shift_and_scale_with_default_eps(b, log2a, c):
    """All four rules with the default eps. Integer values make a group's std 0 or >= sqrt(n-1)/n >= 1/n; with
    |A| <= 2 sqrt(n) (before clipping) that bounds the eps effect by 2 n^1.5 eps |1 - a| / a.
    a = 2^j and integer c keep a V + c exact: TP-GRPO's balancing ranks by |Gt|, and exact ties of |Gt| (common with
    discrete rewards) would otherwise be broken differently by rounding."""
    V, group, trained = b
    a = 2.0 ** log2a
    n = V.shape[0] * V.shape[1]  # bigger than any statistic's sample count
    for cfg in CONFIGS:
        c1 = compute_credit(V, group, trained, cfg)
        c2 = compute_credit(_transform(V, a, c), group, trained, cfg)
        tol = 2 * n ** 1.5 * cfg.eps * abs(1 - a) / a + 1e-9
        assert (c1.advantages - c2.advantages).abs().max() <= tol, cfg
        if cfg.method == 'turning_point':  # integer values: the sign rules see exactly the same signs
            torch.testing.assert_close(c2.turning_points.kept, c1.turning_points.kept)
            torch.testing.assert_close(c2.turning_points.found, c1.turning_points.found)


@FAST
@given(batches(), st.data())
def test_permuting_the_batch_permutes_the_credit(b, data):
    V, group, trained = b
    perm = torch.tensor(data.draw(st.permutations(range(len(group)))))
    relabel = data.draw(st.integers(1, 7))  # group ids are labels: any injective relabelling changes nothing
    for cfg in CONFIGS:
        c1 = compute_credit(V, group, trained, cfg)
        c2 = compute_credit(V[perm], group[perm] * relabel + 3, trained, cfg)
        torch.testing.assert_close(c2.advantages, c1.advantages[perm], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(c2.rewards, c1.rewards[perm])
        if c1.turning_points is not None:
            torch.testing.assert_close(c2.turning_points.kept, c1.turning_points.kept[perm])


# ---------------------------------------------------------------- turning points

def _signs(x): return 0 if x == 0 else (1 if x > 0 else -1)


def _reference_turning_points(V, trained, constraint, untrained):
    "The sign rules of SPEC 5.4 written out with Python floats, one sample at a time."
    start, end = (t.tolist() for t in step_spans(trained, untrained))
    out = []
    for row in V.tolist():
        R, gt = row[-1], row[-1] - row[0]
        r = [row[e] - row[s] for s, e in zip(start, end)]
        s_ = [_signs(x) * _signs(gt) for x in r]
        agree = [_signs(x) != 0 and _signs(x) == _signs(R - row[e]) for x, e in zip(r, end)]
        fired = {}
        for j, k in enumerate(start):
            if j == 0: ok = s_[0] > 0 and (agree[0] or not constraint)
            else: ok = s_[j - 1] < 0 and s_[j] > 0 and (agree[j] or not constraint)
            if ok: fired[k] = 'first' if j == 0 else 'interior'
        out.append(fired)
    return out


@settings(max_examples=100, deadline=None)
@given(batches(), st.booleans(), st.booleans(), st.sampled_from(['fold', 'drop']))
def test_turning_points_only_where_the_sign_rule_holds(b, constraint, balance, untrained):
    V, group, trained = b
    cfg = CreditConfig(method='turning_point', tp_constraint=constraint, tp_balance=balance, untrained=untrained)
    r, tp = turning_point_rewards(V, trained, cfg)
    ref = _reference_turning_points(V, trained, constraint, untrained)
    for i, fired in enumerate(ref):
        for k in range(len(trained)):
            assert bool(tp.interior[i, k]) == (fired.get(k) == 'interior'), (i, k, fired)
            assert bool(tp.first[i, k]) == (fired.get(k) == 'first'), (i, k, fired)
    assert not (tp.interior & tp.first).any()
    assert all(torch.equal(x, y) for x, y in zip(find_turning_points(V, trained, constraint, untrained),
                                                 (tp.interior, tp.first)))
    assert not (tp.kept & ~tp.found).any()
    # a kept turning point's reward is R - V_k (replace, not add); every other trained step keeps its gain
    r_agg = V[:, -1:] - V[:, :-1]
    g = step_gains(V, trained, untrained)
    torch.testing.assert_close(r, torch.where(tp.kept, r_agg, g))
    assert (tp.found.any(1) <= (tp.gt != 0)).all()  # a zero global trend never triggers
    # balancing: when both signs occur, each sign keeps at least min(n+, n-) (more only on exact ties of |Gt|),
    # and a dropped turning point never beats a kept one of its sign
    pos, neg = tp.found & (tp.gt > 0)[:, None], tp.found & (tp.gt < 0)[:, None]
    n = min(int(pos.sum()), int(neg.sum()))
    if balance and n > 0:
        mag = tp.gt.abs()[:, None].expand_as(tp.kept)
        for side in (pos, neg):
            kept, dropped = side & tp.kept, side & tp.dropped
            assert int(kept.sum()) >= n
            if dropped.any(): assert mag[dropped].max() <= mag[kept].min()
        assert min(int((pos & tp.kept).sum()), int((neg & tp.kept).sum())) == n
    else:
        assert (tp.kept == tp.found).all()


def test_balancing_keeps_the_largest_trends():
    "Distinct |Gt|: exactly min(n+, n-) of each sign survive, the largest."
    # five samples whose first step is a turning point (constraint holds): Gt = 0.1, 0.5, 0.3, -0.2, -0.4
    gt = torch.tensor([0.1, 0.5, 0.3, -0.2, -0.4], dtype=torch.float64)
    V = torch.stack([torch.zeros(5, dtype=torch.float64), gt / 2, gt, gt], 1)  # [5, K+1 = 4]
    trained = torch.tensor([True, True, False])
    _, tp = turning_point_rewards(V, trained)
    assert tp.first[:, 0].all()
    assert tp.kept[:, 0].tolist() == [False, True, True, True, True]


# ---------------------------------------------------------------- rules against their formulas

@FAST
@given(batches(integer=False))
def test_rules_match_their_formulas(b):
    V, group, trained = b
    B, K = V.shape[0], V.shape[1] - 1
    eps = 1e-4
    A_fg = credit_flow_grpo(V, group, trained, CreditConfig(global_std=True)).advantages
    A_fl = credit_flow_grpo(V, group, trained, CreditConfig(global_std=False)).advantages
    A_sw, A_dn = credit_stepwise(V, group, trained).advantages, credit_dense(V, group, trained).advantages
    g = step_gains(V, trained)
    R = V[:, -1]
    for i in range(B):
        m = group == group[i]
        ref_fg = ((R[i] - R[m].mean()) / (R.std(unbiased=False) + eps)).clamp(-5, 5)
        ref_fl = ((R[i] - R[m].mean()) / (R[m].std(unbiased=False) + eps)).clamp(-5, 5)
        gm = g[m][:, trained]
        ref_sw = ((g[i, trained] - gm.mean()) / (gm.std(unbiased=False) + eps)).clamp(-5, 5)
        ref_dn = ((g[i, trained] - gm.mean(0)) / (gm.std(0, unbiased=False) + eps)).clamp(-5, 5)
        torch.testing.assert_close(A_fg[i, trained], ref_fg.expand(int(trained.sum())))
        torch.testing.assert_close(A_fl[i, trained], ref_fl.expand(int(trained.sum())))
        torch.testing.assert_close(A_sw[i, trained], ref_sw)
        torch.testing.assert_close(A_dn[i, trained], ref_dn)
    for A in (A_fg, A_fl, A_sw, A_dn): assert (A[:, ~trained] == 0).all() and (A.abs() <= 5).all()


def test_credit_turning_point_agrees_with_compute_credit():
    V, group = synthetic_values(P=3, G=4, K=8, seed=1)
    trained = torch.arange(8) < 7
    tp = credit_turning_point(V, group, trained)
    c = compute_credit(V, group, trained, CreditConfig(method='turning_point'))
    assert (isinstance(c, Credit) and torch.equal(tp.advantages, c.advantages)
            and torch.equal(tp.turning_points.kept, c.turning_points.kept))
    assert compute_credit(V, group, trained).turning_points is None


def test_group_stats_joint_and_masked():
    x = torch.tensor([[1., 2., 100.], [3., 4., -100.], [5., 6., 7.], [7., 8., 9.]])
    group = torch.tensor([9, 9, -1, -1])
    mask = torch.tensor([True, True, False])
    mean, std = group_stats(x, group, mask, joint=True)
    torch.testing.assert_close(mean[0, 0], torch.tensor(2.5))
    torch.testing.assert_close(std[0, 0], torch.tensor([1., 2., 3., 4.]).std(unbiased=False))
    mean, std = group_stats(x, group, unbiased=True)
    torch.testing.assert_close(std[2], torch.tensor([math.sqrt(2)] * 3))


# ---------------------------------------------------------------- bad input

@FAST
@given(batches(), st.sampled_from(METHODS))
def test_groups_of_size_one_raise(b, method):
    V, group, trained = b
    V = torch.cat([V, V[:1]]); group = torch.cat([group, torch.tensor([1000])])
    with pytest.raises(ValueError, match=r"group id\(s\) \[1000\] have a single sample"):
        compute_credit(V, group, trained, CreditConfig(method=method))


@pytest.mark.parametrize('method', METHODS)
def test_group_of_size_one_warn_zero(method):
    V, group = synthetic_values(P=2, G=3, K=5)
    V = torch.cat([V, V[:1]]); group = torch.cat([group, torch.tensor([7])])
    trained = torch.arange(5) < 4
    cfg = CreditConfig(method=method, global_std=False)  # the batch's std would see the extra row
    with pytest.warns(UserWarning, match="advantages are set to 0"):
        c = compute_credit(V, group, trained, replace(cfg, group_size_one='warn_zero'))
    assert (c.advantages[-1] == 0).all()
    assert torch.equal(c.advantages[:-1], compute_credit(V[:-1], group[:-1], trained, cfg).advantages)


@pytest.mark.parametrize('method', METHODS)
def test_non_finite_values_name_the_sample_and_group(method):
    V, group = synthetic_values(P=2, G=3, K=5)
    trained = torch.arange(5) < 4
    V[4, 5] = float('inf')
    with pytest.raises(ValueError, match=r"V\[4, 5\]=inf: sample 4 \(group 1\)"):
        compute_credit(V, group, trained, CreditConfig(method=method))


def test_unread_columns_may_be_nan():
    V, group = synthetic_values(P=2, G=3, K=5)
    V[:, :-1] = float('nan')  # Flow-GRPO reads only the final reward
    assert torch.isfinite(credit_flow_grpo(V, group, torch.arange(5) < 4).advantages).all()


@pytest.mark.parametrize('trained, msg', [
    (torch.ones(3, dtype=torch.bool), r"allowed a bool tensor of shape \[K\] = \(5,\)"),
    (torch.tensor([1, 1, 1, 0, 0]), "got a torch.int64 tensor"),
    (torch.tensor([True, True, True, True, True]), r"trained\[4\]=True: the last step"),
    (torch.zeros(5, dtype=torch.bool), "no step is trained"),
])
def test_bad_trained_mask(trained, msg):
    V, group = synthetic_values(P=2, G=3, K=5)
    for method in METHODS:
        with pytest.raises(ValueError, match=msg): compute_credit(V, group, trained, CreditConfig(method=method))


def test_bad_values_and_groups():
    V, group = synthetic_values(P=2, G=3, K=5)
    trained = torch.arange(5) < 4
    with pytest.raises(ValueError, match=r"V: got a torch.float32 tensor of shape \(6,\)"):
        compute_credit(V[:, 0], group, trained)
    with pytest.raises(ValueError, match="V: got a torch.int64"): compute_credit(V.long(), group, trained)
    with pytest.raises(ValueError, match=r"allowed a bool tensor of shape \[K\] = \(4,\)"):
        compute_credit(V[:, :-1], group, trained)  # values for a different K
    with pytest.raises(ValueError, match=r"group: got a torch.int64 tensor of shape \(5,\)"):
        compute_credit(V, group[:5], trained)
    with pytest.raises(ValueError, match="group: got a torch.float32"): compute_credit(V, group.float(), trained)


@pytest.mark.parametrize('kw, msg', [
    (dict(method='grpo'), "CreditConfig.method='grpo': allowed"), (dict(eps=-1.0), "CreditConfig.eps=-1.0"),
    (dict(adv_clip=0), "CreditConfig.adv_clip=0"), (dict(untrained='skip'), "CreditConfig.untrained='skip'"),
    (dict(group_size_one='ignore'), "CreditConfig.group_size_one='ignore'"),
    (dict(tp_balance='yes'), "CreditConfig.tp_balance='yes': allowed True or False"),
])
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg.replace('(', r'\(')): CreditConfig(**kw)


# ---------------------------------------------------------------- exploration calibration

@FAST
@given(st.integers(1, 6), st.integers(0, 12), st.floats(0, 0.3), st.integers(1, 1000),
       st.sampled_from(['hold', 'raise']))
def test_calibration_rule(K, iters, clamp_min, seed, no_signal):
    gen = torch.Generator().manual_seed(seed)
    trained = torch.rand(K, generator=gen) < 0.6
    psi0 = torch.rand(K, generator=gen)
    fn = lambda psi: torch.randint(-1, 2, (5, K), generator=gen).float()
    cal = calibrate_exploration(fn, psi0, iters, eps1=2, eps2=0.05, clamp_min=clamp_min, trained=trained,
                                no_signal=no_signal)
    assert len(cal.history) == iters
    assert torch.equal(cal.psi[~trained], psi0[~trained])
    psi = psi0.clone()
    for h, nxt in zip(cal.history, [h.psi for h in cal.history[1:]] + [cal.psi]):
        assert torch.equal(h.psi, psi)
        step = torch.where((h.n_pos - h.n_neg).abs() < 2, 0.05, -0.05)
        if no_signal == 'hold': step = torch.where(h.n_pos + h.n_neg < 2, 0.0, step)  # no gain either way: psi stays
        psi = torch.where(trained, (psi + step).clamp(min=clamp_min), psi)
        torch.testing.assert_close(nxt, psi)
        assert ((h.n_pos + h.n_neg) <= 5).all()


def test_calibration_bad_input():
    fn = lambda psi: torch.zeros(4, 3)
    with pytest.raises(ValueError, match="iters=-1"): calibrate_exploration(fn, torch.ones(3), -1)
    with pytest.raises(ValueError, match="eps2=0"): calibrate_exploration(fn, torch.ones(3), 2, eps2=0)
    with pytest.raises(ValueError, match="trained="):
        calibrate_exploration(fn, torch.ones(3), 2, trained=torch.ones(2, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"returned torch.Size\(\[4, 3\]\) in round 0"):
        calibrate_exploration(fn, torch.ones(5), 2)
    cal = calibrate_exploration(fn, torch.ones(3), 2)  # all-zero rewards carry no signal: psi holds by default
    assert cal.to_dict()['psi'] == pytest.approx([1.0, 1.0, 1.0])
    cal = calibrate_exploration(fn, torch.ones(3), 2, no_signal='raise')  # the literal rule reads them as balanced
    assert cal.to_dict()['psi'] == pytest.approx([1.02, 1.02, 1.0])
    with pytest.raises(ValueError, match="no_signal='never'"):
        calibrate_exploration(fn, torch.ones(3), 2, no_signal='never')
