"""Dense checks of flowgrpo_nb.study.fidelity and flowgrpo_nb.study.fidelity_report (the notebooks
nbs/06c_fidelity.ipynb and nbs/06i_fidelity_report.ipynb show the API)."""
import json, math, re, shutil, warnings
from pathlib import Path

import numpy as np, pytest, torch
from scipy import stats
from fastcore.script import anno_parser

from flowgrpo_nb.credit import CreditConfig, Credit, compute_credit, synthetic_values, METHODS
from flowgrpo_nb.flow import flow_sde_scale, step_coefficients
from flowgrpo_nb.study.fidelity import (Arm, MCValues, check_arms, arm_rollout, mc_values, true_gains, needed_states,
                                        arm_credits, compare_arm, paired_differences, arm_fidelity, fidelity_nfe,
                                        fidelity_table, FidelityConfig)
from flowgrpo_nb.study.fidelity_report import run_arm, report_arms, fidelity_report, fidelity_cli, compare_fidelity
from flowgrpo_nb.study.compare import read_fidelity
from flowgrpo_nb.study.stats import STATS, cluster_draws, boot_stats, percentile_ci as ci
from flowgrpo_nb.rollout import RolloutConfig, rollout
from flowgrpo_nb.task import Task, load_policy, load_task, balanced_prompts
from flowgrpo_nb.config import GRPOConfig, preset_config
from flowgrpo_nb.checkpoint import RunFolder, CheckpointError
from flowgrpo_nb.train import load_run_policy

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent

def brightness(images, prompts): return images.mean((1, 2, 3))  # a continuous reward: no ties hide errors

@pytest.fixture(scope='module')
def policy(): return load_policy('tiny')

def _ro(policy, **kw):
    cfg = RolloutConfig(**{**dict(K=4, group_size=3), **kw})
    return rollout(policy, ['a red circle', 'two squares'], cfg, brightness, torch.Generator().manual_seed(0))

def _task(): return Task('brightness', ['a red circle', 'two squares', 'a blue cross'], ['a green square'], brightness)

# -- Monte-Carlo values

def test_mc_values_ode_reproduces_the_rollout(policy):
    ro = _ro(policy, window_size=0)  # no SDE step: every continuation is the rollout's own ODE path
    mc = mc_values(policy, ro, 2, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(mc.V, ro.reward[:, None].expand(-1, ro.K + 1), atol=1e-5, rtol=0)
    assert mc.se.abs().max() < 1e-5 and mc.samples.shape == (ro.B, ro.K + 1, 2)

def test_mc_values_sde(policy):
    ro = _ro(policy)
    M = 3
    mc = mc_values(policy, ro, M, brightness, torch.Generator().manual_seed(1))
    assert mc.M == M and mc.V.shape == (ro.B, ro.K + 1)
    torch.testing.assert_close(mc.V[:, -1], ro.reward)
    torch.testing.assert_close(mc.V[:, -2], ro.reward, atol=1e-5, rtol=0)  # x_{K-1}: one ODE step left
    assert (mc.se[:, :ro.K - 1] > 0).all()  # stochastic continuations disagree
    assert mc.nfe == ro.B * M * ro.K * (ro.K - 1) // 2  # first velocities reused
    se = mc.samples.std(-1) / math.sqrt(M); se[:, -1] = 0
    torch.testing.assert_close(mc.se, se)
    again = mc_values(policy, ro, M, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(again.V, mc.V)

def test_mc_values_shared_noise_values_x0_once(policy):
    ro = _ro(policy, shared_noise=True)
    mc = mc_values(policy, ro, 2, brightness, torch.Generator().manual_seed(1))
    for g in range(2): assert torch.unique(mc.V[ro.group == g, 0]).numel() == 1
    assert mc.nfe == 2 * (2 * 3 + ro.B * 2 + ro.B * 1)  # x_0 once per group: 3 steps; x_1, x_2 per sample

def test_mc_values_states_subset(policy):
    ro = _ro(policy, K=5)
    mc = mc_values(policy, ro, 2, brightness, torch.Generator().manual_seed(1), states=[1, 3])
    assert mc.nfe == ro.B * 2 * ((5 - 1 - 1) + (5 - 1 - 3))
    assert mc.V[:, [0, 2, 4]].isnan().all() and not mc.V[:, [1, 3, 5]].isnan().any()
    none = mc_values(policy, ro, 2, brightness, states=[])
    assert none.nfe == 0 and none.V[:, :5].isnan().all()
    torch.testing.assert_close(none.V[:, 5], ro.reward)

def test_mc_values_errors(policy):
    ro = _ro(policy)
    for M in (1, 2.0, True):
        with pytest.raises(ValueError, match='must be an int >= 2'): mc_values(policy, ro, M, brightness)

def _mc(V, se): return MCValues(V, se, V[..., None].repeat(1, 1, 2), 0, 0)

def test_true_gains_fold_and_drop():
    V = torch.tensor([[0.1, 0.3, 0.2, 0.5, 0.7]])
    se = torch.tensor([[0.1, 0.2, 0.0, 0.3, 0.0]])
    trained = torch.tensor([True, False, True, False])
    g, s = true_gains(_mc(V, se), trained)  # fold: spans (0, 2), (2, 4)
    torch.testing.assert_close(g, torch.tensor([[0.1, 0, 0.5, 0]]))
    torch.testing.assert_close(s, torch.tensor([[0.1, 0, 0.0, 0]]))
    g, s = true_gains(_mc(V, se), trained, 'drop')  # spans (0, 1), (2, 3)
    torch.testing.assert_close(g, torch.tensor([[0.2, 0, 0.3, 0]]))
    torch.testing.assert_close(s, torch.tensor([[math.sqrt(0.05), 0, 0.3, 0]]))

def test_needed_states():
    trained = torch.tensor([False, True, True, False, False])
    assert needed_states(trained) == [1, 2]            # step 2's span (2, 5) ends at the reward
    assert needed_states(trained, 'drop') == [1, 2, 3]
    assert needed_states(trained, steps=[2]) == [2]
    assert needed_states(trained, steps=[0]) == []

# -- statistics

def _tied(seed, n=60):
    rng = np.random.default_rng(seed)
    y = np.round(rng.normal(size=n), 1)
    x = np.where(rng.random(n) < 0.8, 0.0, np.round(y + rng.normal(size=n), 1))  # 80% zeros: heavy ties
    return x, y

@pytest.mark.parametrize('seed', [0, 1, 2])
def test_kendall_tau_b_on_ties_equals_scipy(seed):
    x, y = _tied(seed)
    cl = np.repeat(np.arange(10), 6)
    draws = cluster_draws(10, 5, seed)
    bs = boot_stats(x, y, cl, draws)
    assert math.isclose(bs['kendall'][0], stats.kendalltau(x, y, variant='b').statistic, abs_tol=1e-12)
    assert math.isclose(bs['spearman'][0], stats.spearmanr(x, y).statistic, abs_tol=1e-12)
    assert math.isclose(bs['pearson'][0], stats.pearsonr(x, y).statistic, abs_tol=1e-12)
    # each resample: the statistic of the rows of the drawn clusters (duplicates included)
    for i, d in enumerate(draws):
        rows = np.concatenate([np.flatnonzero(cl == c) for c in d])
        assert math.isclose(bs['kendall'][1][i], stats.kendalltau(x[rows], y[rows], variant='b').statistic,
                            abs_tol=1e-10)
        assert math.isclose(bs['spearman'][1][i], stats.spearmanr(x[rows], y[rows]).statistic, abs_tol=1e-10)
        assert math.isclose(bs['pearson'][1][i], stats.pearsonr(x[rows], y[rows]).statistic, abs_tol=1e-10)

def test_kendall_differs_from_spearman_on_ties():
    x, y = _tied(0)
    bs = boot_stats(x, y, np.arange(60), cluster_draws(60, 3))
    assert abs(bs['kendall'][0] - bs['spearman'][0]) > 0.02

def test_boot_stats_unequal_clusters_and_constant():
    x, y = _tied(3, 20)
    cl = np.array([0] * 3 + [1] * 7 + [2] * 10)  # unequal sizes: Spearman's resamples ranked one by one
    bs = boot_stats(x, y, cl, cluster_draws(3, 4))
    d = cluster_draws(3, 4)[0]
    rows = np.concatenate([np.flatnonzero(cl == c) for c in d])
    r = stats.spearmanr(x[rows], y[rows]).statistic
    assert math.isclose(bs['spearman'][1][0], r, abs_tol=1e-10) or (math.isnan(r) and math.isnan(bs['spearman'][1][0]))
    flat = boot_stats(np.zeros(20), y, cl, cluster_draws(3, 4))
    assert all(math.isnan(flat[s][0]) and np.isnan(flat[s][1]).all() for s in STATS)

def _prompt_effect(seed=0, P=12, G=8):
    rng = np.random.default_rng(seed)
    cl = np.repeat(np.arange(P), G)
    effect = np.repeat(rng.normal(size=P), G) * 2
    y = effect + rng.normal(size=P * G)
    x = effect + 0.5 * rng.normal(size=P * G) + np.repeat(rng.normal(size=P), G)
    return x, y, cl

def test_clustered_ci_wider_than_iid():
    x, y, cl = _prompt_effect()
    clustered = boot_stats(x, y, cl, cluster_draws(12, 400))
    iid = boot_stats(x, y, np.arange(len(x)), cluster_draws(len(x), 400))
    w = lambda s: ci(s)[1] - ci(s)[0]
    for s in STATS:
        assert clustered[s][0] == pytest.approx(iid[s][0])
        assert w(clustered[s][1]) > 1.3 * w(iid[s][1]), s

def test_ci():
    assert ci(np.arange(101.0), 0.9) == pytest.approx((5.0, 95.0))
    assert ci(np.array([np.nan, 1.0, 1.0])) == (1.0, 1.0)
    assert all(math.isnan(v) for v in ci(np.array([np.nan])))

def test_paired_differences_are_paired():
    "Two credits that share the prompt effect: their individual intervals overlap, the paired one excludes 0."
    x, y, cl = _prompt_effect(1)
    rng = np.random.default_rng(5)
    a, b = y + 0.8 * rng.normal(size=len(y)), y + 1.6 * rng.normal(size=len(y))
    draws = cluster_draws(12, 400)
    boots = {'a': boot_stats(a, y, cl, draws), 'b': boot_stats(b, y, cl, draws)}
    pooled = {n: {q: {s: v[1] for s, v in bs.items()} for q in ('reward', 'advantage')} for n, bs in boots.items()}
    est = {n: {q: {s: v[0] for s, v in bs.items()} for q in ('reward', 'advantage')} for n, bs in boots.items()}
    d = {(r['quantity'], r['stat']): r for r in paired_differences(pooled, est)}
    r = d['advantage', 'kendall']
    assert r['diff'] == pytest.approx(boots['a']['kendall'][0] - boots['b']['kendall'][0])
    assert r['lo'] > 0 and r['share_above_0'] > 0.975
    assert ci(boots['a']['kendall'][1])[0] < ci(boots['b']['kendall'][1])[1]  # side by side they overlap
    assert len(d) == 2 * 3

def test_compare_arm_exact_truth():
    V, group = synthetic_values(P=3, G=6, K=6, seed=2)
    trained = torch.arange(6) < 5
    cr = compute_credit(V, group, trained, CreditConfig(method='dense'))
    truth, se = cr.rewards, torch.full_like(cr.rewards, 1e-3)  # pretend the lookahead is exact
    rows, pooled = compare_arm(truth, se, cr, group, [0, 1, 2, 3, 4], cluster_draws(3, 50))
    assert len(rows) == 2 * 6 and set(pooled) == {'reward', 'advantage'}
    for r in rows:
        if r['quantity'] == 'reward':
            assert math.isclose(r['pearson'], 1, abs_tol=1e-9) and math.isclose(r['kendall'], 1, abs_tol=1e-9)
            assert r['sign_agree'] == 1.0 and r['zero_credit'] == 0 and r['truth_reliability'] > 0.99
        assert r['n'] == (18 * 5 if r['step'] == 'all' else 18)
    assert next(r for r in rows if r['step'] == 'all')['n_sig'] == int((truth[:, trained].abs() > 2e-3).sum())

def test_compare_arm_zero_credit_is_not_a_sign():
    truth = torch.tensor([[0.5, 0.0], [-0.5, 0.0], [0.5, 0.0], [0.2, 0.0]])
    se = torch.full_like(truth, 0.1)  # the last row is not significant
    q = torch.tensor([[0.3, 0.0], [0.0, 0.0], [-0.1, 0.0], [0.0, 0.0]])
    r = compare_arm(truth, se, Credit(q, q), [0, 0, 1, 1], [0], cluster_draws(2, 10))[0][0]
    assert (r['step'], r['n_sig']) == (0, 3)
    assert math.isclose(r['zero_credit'], 1 / 3) and r['sign_agree'] == 0.5  # one right, one wrong, one not pushed
    assert r['share_credit_zero'] == 0.5 and r['share_truth_zero'] == 0.0

# -- arms and their samplers

def test_check_arms():
    cfgs = {m: preset_config(m, K=6) for m in METHODS}
    arms = check_arms(cfgs, group=3)
    assert all(isinstance(a, Arm) and a.rollout.group_size == 3 and a.psi is None for a in arms.values())
    assert arms['flow_grpo'].key == arms['turning_point'].key == arms['dense'].key != arms['stepwise'].key
    # the same steps written two ways explore alike
    assert check_arms({'a': preset_config('flow_grpo', K=6, window_size=5)})['a'].key == \
        check_arms({'b': cfgs['flow_grpo']})['b'].key
    psi = torch.full((6,), 0.5)
    withpsi = check_arms({'dense': (cfgs['dense'], psi)})['dense']
    assert withpsi.key != arms['dense'].key and torch.equal(withpsi.psi, psi)
    one = check_arms(cfgs, sampler_of=cfgs['flow_grpo'])
    assert len({a.key for a in one.values()}) == 1 and one['stepwise'].rollout.sampler == 'flow_sde'
    for bad, msg in [({}, 'non-empty dict'), ({'x': 3}, re.escape("arms['x']: expected a GRPOConfig")),
                     ({'f': (cfgs['flow_grpo'], psi)}, re.escape("arms['f']: psi is given but")),
                     ({'d': (cfgs['dense'], torch.ones(5))}, r"psi must be a finite, non-negative Tensor\[K=6\]"),
                     ({'d': (cfgs['dense'], torch.full((6,), float('nan')))}, 'psi must be'),
                     ({'k': preset_config('flow_grpo', K=4)}, None)]:
        if msg is None:
            with pytest.raises(ValueError, match="K=4 differs"): check_arms(bad, sampler_of=cfgs['flow_grpo'])
        else:
            with pytest.raises(ValueError, match=msg): check_arms(bad)
    with pytest.raises(ValueError, match='group=1'): check_arms(cfgs, group=1)

def test_stepwise_rollout_has_shared_noise_and_ddim_std(policy):
    arms = check_arms({m: preset_config(m, K=6) for m in ('flow_grpo', 'stepwise')}, group=3)
    t = policy.sigmas(6)
    s = arm_rollout(policy, ['a red circle', 'two squares'], arms['stepwise'], brightness)
    f = arm_rollout(policy, ['a red circle', 'two squares'], arms['flow_grpo'], brightness)
    first = s.group * 3
    assert (s.x[:, 0] == s.x[first, 0]).all() and not (s.x[:, 2] == s.x[first, 2]).all()
    assert not (f.x[:, 0] == f.x[f.group * 3, 0]).all()  # Flow-GRPO: one noise per sample
    ks = s.trained.nonzero().flatten()
    assert s.cfg.sampler == 'ddim' and s.cfg.level == 1.0 and ks.tolist() == [1, 2, 3]
    torch.testing.assert_close(s.std[:, ks], step_coefficients(t[ks], t[ks + 1], 'ddim', 1.0)[2].expand(s.B, -1))
    assert (s.std[:, ~s.trained] == 0).all()
    kf = f.trained.nonzero().flatten()
    torch.testing.assert_close(f.std[:, kf],
                               (flow_sde_scale(t[kf], t[kf + 1], 0.7) * (t[kf] - t[kf + 1]).sqrt()).expand(f.B, -1))

def test_dense_psi_drives_rollout_and_continuations(policy):
    cfg = preset_config('dense', K=4)
    t = policy.sigmas(4)
    psi = torch.tensor([0.3, 0.2, 0.1, 0.0])
    a = check_arms({'dense': (cfg, psi)}, group=2)['dense']
    ro = arm_rollout(policy, ['a red circle'], a, brightness)
    torch.testing.assert_close(ro.std[0, :3], psi[:3] * (t[:3] - t[1:4]).sqrt())
    zero = check_arms({'dense': (cfg, torch.zeros(4))}, group=2)['dense']  # psi = 0: the SDE is the ODE
    ro0 = arm_rollout(policy, ['a red circle'], zero, brightness)
    mc = mc_values(policy, ro0, 2, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(mc.V, ro0.reward[:, None].expand(-1, 5), atol=1e-5, rtol=0)

def test_stepwise_continuations_use_ddim_window(policy):
    a = check_arms({'s': preset_config('stepwise', K=6)}, group=2)['s']
    ro = arm_rollout(policy, ['a red circle', 'two squares'], a, brightness)
    mc = mc_values(policy, ro, 3, brightness, torch.Generator().manual_seed(1))
    assert mc.se[:, 4:].abs().max() < 1e-6            # after the window (steps 1-3): ODE only, deterministic
    assert (mc.se[:, 1] > 0).all() and (mc.se[:, 0] > 0).all()
    for k in (0, 1):  # before the window a group's states coincide (shared noise): valued once per group
        for g in range(2): assert torch.unique(mc.V[ro.group == g, k]).numel() == 1

def test_arm_credits_share_lookahead(policy):
    arms = check_arms({m: preset_config(m, K=4) for m in ('flow_grpo', 'dense', 'turning_point')}, group=3)
    ro = arm_rollout(policy, ['a red circle', 'two squares'], arms['dense'], brightness)
    n0 = policy.nfe.nfe['lookahead']
    cr = arm_credits(policy, ro, brightness, {n: a.cfg for n, a in arms.items()})
    # one ode:rest for both
    assert policy.nfe.nfe['lookahead'] - n0 == ro.B * sum(ro.K - 1 - k for k in range(ro.K - 1))
    torch.testing.assert_close(cr['flow_grpo'].rewards[:, 0], ro.reward)
    assert cr['turning_point'].turning_points is not None

# -- one model, every arm

@pytest.fixture(scope='module')
def small(policy):
    # trimmed window: steps 1-3
    arms = {'flow_grpo': preset_config('flow_grpo', K=4), 'stepwise': preset_config('stepwise', K=6),
            'dense': (preset_config('dense', K=4), torch.tensor([0.5, 0.4, 0.3, 0.0]))}
    task = load_task('partial')
    return arms, task, arm_fidelity(policy, task, arms,
                                    FidelityConfig(prompts=6, batch_prompts=4, group=2, M=2, n_boot=50))

def test_arm_fidelity_json_settings_and_pooling(small):
    arms, task, res = small
    assert json.loads(json.dumps(res)) == res
    s = res['settings']
    assert set(s['categories']) == {task.category(p) for p in task.train_prompts} and len(s['prompts']) == 6
    assert s['prompts'] == balanced_prompts(task.train_prompts, 6, 0, task.category)
    assert s['arms']['stepwise']['rollout']['sampler'] == 'ddim' and s['arms']['stepwise']['rollout']['shared_noise']
    assert s['arms']['dense']['psi'] == pytest.approx([0.5, 0.4, 0.3, 0.0])
    assert s['arms']['stepwise']['steps'] == [1, 2, 3]
    table = {r['arm']: r for r in fidelity_table(res)}
    assert table['flow_grpo']['n'] == 6 * 2 * 3 and table['stepwise']['n'] == 6 * 2 * 3  # two batches pooled
    assert sorted(set(res['data']['flow_grpo']['cluster'])) == list(range(6))
    assert len(res['data']['dense']['truth']) == 12
    assert len(res['differences']) == 3 * 2 * 3
    assert {(r['arm'], r['step']) for r in res['stats'] if r['quantity'] == 'reward'} == \
        {(a, k) for a, ks in [('flow_grpo', [0, 1, 2]), ('stepwise', [1, 2, 3]), ('dense', [0, 1, 2])]
         for k in [*ks, 'all']}

def test_arm_fidelity_cost(small, policy):
    arms, task, res = small
    c = res['cost']
    assert c['samplers'] == 3 and c['threads'] == torch.get_num_threads()
    assert c['rollout']['nfe'] == 12 * 4 + 12 * 6 + 12 * 4
    assert {k: c[k]['nfe'] for k in ('rollout', 'credit', 'mc')} == fidelity_nfe(check_arms(arms, 2), 6, 2)
    assert c['total']['nfe'] == sum(c[k]['nfe'] for k in ('rollout', 'credit', 'mc', 'stats'))
    assert c['total']['seconds'] == pytest.approx(sum(c[k]['seconds'] for k in ('rollout', 'credit', 'mc', 'stats')))
    assert all(c[k]['seconds'] > 0 and c[k]['cpu_seconds'] > 0 for k in ('rollout', 'mc'))

def test_arm_fidelity_shares_rollouts_and_steps_cut_cost(policy):
    task = _task()
    one = arm_fidelity(policy, task, {'a': preset_config('flow_grpo', K=4), 'b': preset_config('turning_point', K=4)},
                       FidelityConfig(prompts=2, group=2, M=2, n_boot=10, keep_data=False))
    assert one['cost']['samplers'] == 1 and one['cost']['rollout']['nfe'] == 4 * 4 and 'data' not in one
    few = arm_fidelity(policy, task, {'a': preset_config('flow_grpo', K=4)},
                       FidelityConfig(prompts=2, group=2, M=2, n_boot=10, steps=[2]))
    assert few['cost']['mc']['nfe'] == 4 * 2 * (4 - 1 - 2) < one['cost']['mc']['nfe']
    assert {r['step'] for r in few['stats']} == {2, 'all'}
    assert few['settings']['arms']['a']['steps'] == [2]

def test_arm_fidelity_prompts_list_and_heldout(policy):
    task = _task()
    res = arm_fidelity(policy, task, {'a': preset_config('flow_grpo', K=3)},
                       FidelityConfig(prompts=['a blue cross'] * 2, group=2, M=2, n_boot=10))
    assert res['settings']['prompts'] == ['a blue cross'] * 2 and res['settings']['categories'] == {}
    held = arm_fidelity(policy, task, {'a': preset_config('flow_grpo', K=3)},
                        FidelityConfig(prompts=1, split='heldout', group=2, M=2, n_boot=10))
    assert held['settings']['prompts'] == ['a green square']

@pytest.mark.parametrize('kw,msg', [(dict(M=1), 'M=1'), (dict(batch_prompts=0), 'batch_prompts=0'),
                                    (dict(n_boot=0), 'n_boot=0'), (dict(steps='0'), "steps='0'"),
                                    (dict(prompts=0), 'prompts=0'), (dict(split='x'), "split='x'"),
                                    (dict(level=1.5), 'level=1.5'),
                                    (dict(steps=[3]), 'none of steps=\\[3\\] is trained'), (dict(group=1), 'group=1')])
def test_arm_fidelity_errors(policy, kw, msg):
    with pytest.raises(ValueError, match=msg):
        arm_fidelity(policy, _task(), {'a': preset_config('flow_grpo', K=4)}, FidelityConfig(**kw))

def test_fidelity_table_reads_the_older_format():
    old = json.loads((ROOT/'results'/'fidelity'/'fidelity.json').read_text())
    for d in old.values():
        rows = fidelity_table(d)
        if 'cost' not in d:  # written before per-arm samplers: one row per method, no Kendall
            assert [r['arm'] for r in rows] == list(METHODS) and all(r['kendall'] is None for r in rows)
        assert all(r['spearman'] is not None for r in rows)

# -- runs and the command

@pytest.fixture(scope='module')
def run_dir(tmp_path_factory, policy):
    "A hand-made trainer run folder with a non-trivial adapter."
    run = tmp_path_factory.mktemp('run')
    cfg = preset_config('flow_grpo+smoke', log_with='none')
    RunFolder(run).write('config', cfg.to_dict())
    p = load_policy('tiny').add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    g = torch.Generator().manual_seed(0)
    sd = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in p.lora_state_dict().items()}
    RunFolder(run).write_checkpoint(2, {'lora.safetensors': sd, 'state.json': dict(step=2, psi=None)})
    return run, sd

def test_load_run_policy(run_dir, policy, tmp_path):
    run, sd = run_dir
    p, cfg, ckpt = load_run_policy(run)
    assert ckpt.name == 'ckpt-000002' and cfg.lora_rank == 4
    for k, v in p.lora_state_dict().items(): torch.testing.assert_close(v, sd[k])
    x, t, c = torch.randn(2, 3, 32, 32), torch.full((2,), 0.5), p.encode(['a circle'] * 2)
    with torch.no_grad():
        assert not torch.allclose(p.velocity(x, t, c), policy.velocity(x, t, policy.encode(['a circle'] * 2)))
    with pytest.raises(ValueError, match='not a trainer run folder'): load_run_policy(tmp_path)
    RunFolder(tmp_path).write('config', RunFolder(run).config())
    with pytest.raises(ValueError, match='no checkpoint'): load_run_policy(tmp_path)

def test_run_arm(run_dir, tmp_path):
    cfg, psi = run_arm(run_dir[0])
    assert cfg.method == 'flow_grpo' and psi is None
    dense, rf = preset_config('dense+smoke', log_with='none'), RunFolder(tmp_path)
    rf.write('config', dense.to_dict())
    with pytest.warns(UserWarning, match='has no psi yet'): assert run_arm(tmp_path)[1] is None
    rf.write('calibration', dict(psi=[0.1, 0.2, 0.3, 0.4]))
    torch.testing.assert_close(run_arm(tmp_path)[1], torch.tensor([0.1, 0.2, 0.3, 0.4]))
    rf.write_checkpoint(1, {'state.json': dict(step=1, psi=[0.5, 0.5, 0.5, 0.0])})  # the checkpoint's psi wins
    torch.testing.assert_close(run_arm(tmp_path)[1], torch.tensor([0.5, 0.5, 0.5, 0.0]))
    rf.write_checkpoint(2, {'state.json': dict(step=2, psi=[0.5, 0.5])})
    with pytest.raises(ValueError, match=r'psi must be a finite, non-negative Tensor\[K=4\]'): run_arm(tmp_path)

def test_report_arms(tmp_path):
    arms = report_arms()
    assert list(arms) == list(METHODS) and all(c.K == 10 and p is None for c, p in arms.values())
    run = (preset_config('dense', K=6, guidance=2.0), torch.ones(6))
    arms = report_arms(run=run)
    assert arms['dense'] is run and arms['flow_grpo'][0].K == 6 and arms['flow_grpo'][0].guidance == 2.0
    assert report_arms('flow_grpo, run', run=run)['run'] is run
    assert report_arms('dense', K=4, run=run)['dense'][0].K == 4  # a named preset stays a preset
    with pytest.raises(ValueError, match="'run' is the run's own arm"): report_arms('run')
    with pytest.raises(ValueError, match="preset 'nope' is unknown"): report_arms('nope')

def test_fidelity_report_files(run_dir, tmp_path):
    run, _ = run_dir
    res = fidelity_report(tmp_path, FidelityConfig(prompts=2, batch_prompts=1, group=2, M=2, n_boot=20), run=run,
                          arms='flow_grpo,stepwise', png=False)
    assert list(res) == ['base', 'finetuned']
    assert res['finetuned']['settings']['checkpoint'] == 'checkpoints/ckpt-000002'  # from the run's folder
    assert res['base']['settings']['prompts'] == res['finetuned']['settings']['prompts']
    assert res['base']['settings']['arms']['flow_grpo']['rollout']['K'] == 4  # the run's schedule (smoke: K = 4)
    d = json.loads((tmp_path/'fidelity.json').read_text())
    assert set(d) == {'base', 'finetuned'} and d['finetuned']['settings']['reward'] == 'partial'
    assert d['base']['stats'] != d['finetuned']['stats']
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {'fidelity.json', 'overall.html', 'plotly.min.js'} | \
        {f'{f}_{m}.html' for f in ('steps', 'differences', 'scatter') for m in ('base', 'finetuned')}

def test_fidelity_report_run_arm_by_default(tmp_path, policy):
    "Without arms, the run's own method is the run's arm (its config and psi); the others are presets on its schedule."
    cfg, rf = preset_config('dense+smoke', log_with='none'), RunFolder(tmp_path)
    rf.write('config', cfg.to_dict())
    p = load_policy('tiny').add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    rf.write_checkpoint(1,
                        {'lora.safetensors': p.lora_state_dict(), 'state.json': dict(step=1, psi=[0.4, 0.3, 0.2, 0.0])})
    res = fidelity_report(None, FidelityConfig(prompts=1, group=2, M=2, n_boot=10), run=tmp_path, base=False)
    arms = res['finetuned']['settings']['arms']
    assert list(arms) == list(METHODS) and arms['dense']['psi'] == pytest.approx([0.4, 0.3, 0.2, 0.0])
    assert arms['stepwise']['psi'] is None and arms['stepwise']['rollout']['K'] == 4

def test_fidelity_report_task_and_policy(policy):
    "A given policy and task are used as they are: the task's prompts (no categories: cycled) and its reward."
    res = fidelity_report(None, FidelityConfig(prompts=4, group=2, K=3, M=2, n_boot=20), policy=policy, task=_task(),
                          arms='flow_grpo')
    s = res['base']['settings']
    assert list(res) == ['base'] and s['prompts'] == ['a red circle', 'two squares', 'a blue cross', 'a red circle']
    assert (s['task'], s['reward']) == ('brightness', 'brightness') and s['categories'] == {}

def test_fidelity_report_sampler_of(policy):
    res = fidelity_report(None, FidelityConfig(sampler_of='flow_grpo', prompts=1, group=2, K=4, M=2, n_boot=10),
                          policy=policy, task=_task(), arms='flow_grpo,stepwise')['base']
    assert res['cost']['samplers'] == 1 and res['settings']['arms']['stepwise']['rollout']['sampler'] == 'flow_sde'
    assert res['settings']['sampler_of']['sampler'] == 'flow_sde'

@pytest.mark.parametrize('kw,msg', [(dict(split='x'), "split='x'"), (dict(M=1), 'M=1'), (dict(group=1), 'group=1'),
                                    (dict(prompts=0), 'prompts=0'), (dict(run='/nonexistent'), 'not a trainer run'),
                                    (dict(reward='clip'), "reward='clip'"),
                                    (dict(arms='flow_grpo,run'), "'run' is the run's own arm"),
                                    (dict(arms='nope'), "preset 'nope' is unknown"),
                                    (dict(sampler_of='nope'), "preset 'nope'"),
                                    (dict(task=Task('t', ['a'], ['a'], brightness), reward='partial'), 'not both')])
def test_fidelity_report_errors(kw, msg):
    cfg = {k: kw.pop(k) for k in list(kw) if k in FidelityConfig.__dataclass_fields__}
    with pytest.raises(ValueError, match=msg): fidelity_report(None, FidelityConfig(**cfg), **kw)

def test_cli_flags():
    fn = getattr(fidelity_cli, '__wrapped__', fidelity_cli)
    a = anno_parser(fn).parse_args(['--run', 'r', '-m', '4', '--no-base', '--n-boot', '10', '--arms', 'flow_grpo,run',
                                    '--steps', '0,2', '--sampler-of', 'flow_grpo', '--no-png'])
    assert (a.run, a.M, a.no_base, a.n_boot, a.K, a.arms, a.steps, a.sampler_of, a.no_png) == \
        ('r', 4, True, 10, None, 'flow_grpo,run', '0,2', 'flow_grpo', True)
    d = anno_parser(fn).parse_args([])
    assert (d.prompts, d.batch_prompts, d.group, d.M, d.arms, d.sampler_of) == (16, 4, 8, 8, None, None)
    with pytest.raises(ValueError, match="steps='a,b'"): fn(out=None, steps='a,b')

def _comparison(root:Path, run:Path, keys:list) -> Path:
    """A comparison folder holding copies of `run` at (task, seed, arm) keys; the ones with True are finished (a
    summary)."""
    for t, s, a, done in keys:
        d = root/t/f'seed{s}'/a
        shutil.copytree(run, d)
        if done: RunFolder(d).write('summary', dict(steps=2))
    return root

def test_compare_fidelity(run_dir, tmp_path):
    "Every finished run of the seeds asked for, on its own model; one file per run, reused; rows for the report."
    cmp = _comparison(tmp_path/'cmp', run_dir[0], [('geneval', 0, 'flow_grpo', True), ('geneval', 1, 'flow_grpo', True),
                                                   ('geneval', 5, 'flow_grpo', True), ('geneval', 0, 'dense', False)])
    cfg = FidelityConfig(prompts=2, batch_prompts=1, group=2, M=2, n_boot=20)
    rows = compare_fidelity(cmp, None, cfg, progress=False)
    assert [(r['task'], r['seed'], r['arm']) for r in rows] == [('geneval', 0, 'flow_grpo'),
                                                                ('geneval', 1, 'flow_grpo')]
    assert all(r['kendall_window'] == r['kendall'] for r in rows)  # Flow-GRPO's loss covers every compared step
    assert {'kendall_nonzero', 'kendall_nonzero_lo', 'share_truth_zero', 'cpu_seconds'} <= set(rows[0])
    f = cmp/'fidelity'/'geneval'/'seed0'/'flow_grpo.json'
    assert json.loads(f.read_text())['settings']['checkpoint'] == 'checkpoints/ckpt-000002'
    assert json.loads((cmp/'fidelity'/'fidelity.json').read_text())['compare'] == '..'  # no folder of this machine
    stamp = f.stat().st_mtime_ns
    # reused, not measured again
    assert compare_fidelity(cmp, None, cfg, progress=False) == rows and f.stat().st_mtime_ns == stamp
    assert read_fidelity(str(cmp/'fidelity'/'fidelity.json')) == rows
    with pytest.raises(ValueError, match='measured with other settings'):
        compare_fidelity(cmp, None, FidelityConfig(prompts=3, group=2, M=2), progress=False)
    with pytest.raises(ValueError, match='no finished run of seeds'):
        compare_fidelity(cmp, None, cfg, seeds=(7,), progress=False)
    fn = getattr(fidelity_cli, '__wrapped__', fidelity_cli)
    with pytest.raises(ValueError, match='not both'): fn(compare=str(cmp), run='r')
    with pytest.raises(ValueError, match="seeds='0,x'"): fn(compare=str(cmp), seeds='0,x')


# -- TempFlow-GRPO: the branches it credits

def test_branch_gains_hand_example():
    "02_fidelity's hand example: gains V(y) - V(x_k), SEs in quadrature, tau = (13 - 2) / 15 with the seed group."
    from flowgrpo_nb.study.fidelity import branch_gains
    from flowgrpo_nb.tempflow import tempflow_advantages
    Vx, Vy = torch.tensor([[[0.5], [0.4]]]), torch.tensor([[[[0.2], [0.5], [0.8]], [[0.3], [0.6], [0.45]]]])
    g, se = branch_gains(Vx, Vy, torch.full((1, 2, 1), 0.03), torch.full((1, 2, 3, 1), 0.04))
    torch.testing.assert_close(g.flatten(), torch.tensor([-0.3, 0.0, 0.3, -0.1, 0.2, 0.05]), atol=1e-6, rtol=0)
    torch.testing.assert_close(se, torch.full_like(se, 0.05), atol=1e-6, rtol=0)
    A = tempflow_advantages(torch.tensor([[[[0.2], [0.5], [0.8]], [[0.3], [0.7], [0.4]]]]), 'seed')
    tau = boot_stats(A.flatten(), g.flatten(), np.zeros(6, int), cluster_draws(1, 5))['kendall'][0]
    assert tau == pytest.approx(11 / 15) == stats.kendalltau(A.flatten(), g.flatten()).statistic

def test_branch_values_last_step_nfe_and_order(policy):
    "The last branch state's value is its branch reward (one Euler step left); the NFE is the formula; rows in place."
    from flowgrpo_nb.study.fidelity import branch_values
    from flowgrpo_nb.tempflow import TempFlowConfig, tempflow_rollout
    ro = tempflow_rollout(policy, ['a red circle', 'two squares'], RolloutConfig(K=5, group_size=2),
                          TempFlowConfig(branches=3, branch_steps=(1, 3)), brightness, torch.Generator().manual_seed(0))
    bv = branch_values(policy, ro, 3, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(bv.Vy[..., 1], ro.reward[..., 1], atol=1e-5, rtol=0)  # step 3: y is at K - 1
    assert bv.se_y[..., 1].max() < 1e-6 and (bv.se_y[..., 0] > 0).all() and (bv.se_x > 0).all()
    assert bv.nfe == 2 * 2 * sum(3 * (5 - 1 - k) + 1 + 3 * (3 * (5 - 2 - k) + 1) for k in (1, 3))
    g, _ = bv.gains()
    torch.testing.assert_close(g, bv.Vy - bv.Vx[:, :, None])
    # without noise the continuations are the branches' own Euler paths: V(y) is the branch reward at every step
    ro0 = tempflow_rollout(policy, ['a red circle'], RolloutConfig(K=5, group_size=2, level=0.0),
                           TempFlowConfig(branches=2), brightness, torch.Generator().manual_seed(0))
    bv0 = branch_values(policy, ro0, 2, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(bv0.Vy, ro0.reward, atol=1e-5, rtol=0)

def test_arm_fidelity_tempflow_beside_flow_grpo(policy):
    "A TempFlow arm: its own key, a row per branch, its branch steps compared, the cost `fidelity_nfe` predicts."
    from flowgrpo_nb.study.fidelity import fidelity_nfe, fidelity_table
    arms = {'flow_grpo': preset_config('flow_grpo', K=4),
            'tempflow': preset_config('tempflow', K=4, tempflow_branches=2)}
    checked = check_arms(arms, group=2)
    assert checked['tempflow'].key != checked['flow_grpo'].key
    res = arm_fidelity(policy, _task(), arms, FidelityConfig(prompts=2, batch_prompts=1, group=2, M=2, n_boot=20))
    assert [(r['arm'], r['n']) for r in fidelity_table(res)] == [('flow_grpo', 2 * 2 * 3), ('tempflow', 2 * 2 * 2 * 3)]
    assert fidelity_nfe(checked, 2, 2) == {k: res['cost'][k]['nfe'] for k in ('rollout', 'credit', 'mc')}
    assert fidelity_nfe(checked, 2, 2, steps=[2])['mc'] < fidelity_nfe(checked, 2, 2)['mc']
    one = arm_fidelity(policy, _task(), {'tempflow': arms['tempflow']},
                       FidelityConfig(prompts=1, group=2, M=2, n_boot=10, steps=[2]))
    assert one['settings']['arms']['tempflow']['steps'] == [2] and fidelity_table(one)[0]['n'] == 2 * 2

def test_check_arms_flash_and_tempflow_sampler_of():
    with pytest.raises(ValueError, match=re.escape("arms['flash']: flash's credit is not measured")):
        check_arms({'flash': preset_config('flash', K=6)})
    with pytest.raises(ValueError, match='without sampler_of'):
        check_arms({'t': preset_config('tempflow', K=6)}, sampler_of=preset_config('flow_grpo', K=6))

def test_fidelity_json_is_written_whole(tmp_path, policy):
    "fidelity.json goes through checkpoint.write_text: a write that fails is one sentence naming it, no half file."
    (tmp_path/'fidelity.json').mkdir()  # a directory where the file goes: the rename fails
    with pytest.raises(CheckpointError, match='fidelity'):
        fidelity_report(tmp_path, FidelityConfig(prompts=1, group=2, M=2, n_boot=10, K=3), policy=policy, task=_task(),
                        arms='flow_grpo', png=False)
    assert not [p for p in tmp_path.iterdir() if p.name != 'fidelity.json']
