"Dense checks of flowgrpo_nb.fidelity (the notebook nbs/06c_fidelity.ipynb shows the API)."
import json, math
from pathlib import Path

import numpy as np, pytest, torch
from scipy import stats
from fastcore.script import anno_parser

from flowgrpo_nb.credit import CreditConfig, compute_credit, synthetic_values, METHODS
from flowgrpo_nb.fidelity import (MCValues, mc_values, true_gains, credits_of, correlation, compare_credit,
                                  credit_fidelity, fidelity_report, fidelity_cli)
from flowgrpo_nb.rollout import RolloutConfig, rollout
from flowgrpo_nb.task import Task, load_policy, load_task
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.checkpoint import write_checkpoint
from flowgrpo_nb.train import load_run_policy

torch.set_num_threads(1)

def brightness(images, prompts): return images.mean((1, 2, 3))  # a continuous reward: no ties hide errors

@pytest.fixture(scope='module')
def policy(): return load_policy('tiny')

def _ro(policy, **kw):
    cfg = RolloutConfig(**{**dict(K=4, group_size=3), **kw})
    return rollout(policy, ['a red circle', 'two squares'], cfg, brightness, torch.Generator().manual_seed(0))

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
    torch.testing.assert_close(mc.se, mc.samples.std(-1) / math.sqrt(M))
    again = mc_values(policy, ro, M, brightness, torch.Generator().manual_seed(1))
    torch.testing.assert_close(again.V, mc.V)

def test_mc_values_shared_noise_values_x0_once(policy):
    ro = _ro(policy, shared_noise=True)
    mc = mc_values(policy, ro, 2, brightness, torch.Generator().manual_seed(1))
    for g in range(2): assert torch.unique(mc.V[ro.group == g, 0]).numel() == 1
    assert mc.nfe == 2 * (2 * 3 + ro.B * 2 + ro.B * 1)  # x_0 once per group: 3 steps; x_1, x_2 per sample

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

def test_correlation_matches_scipy():
    rng = np.random.default_rng(0)
    x = rng.normal(size=30); y = x + rng.normal(size=30)
    c = correlation(x, y, n_boot=500)
    assert c['n'] == 30
    assert math.isclose(c['pearson'], stats.pearsonr(x, y).statistic, abs_tol=1e-12)
    assert math.isclose(c['spearman'], stats.spearmanr(x, y).statistic, abs_tol=1e-12)
    ci = stats.pearsonr(x, y).confidence_interval(0.95)
    assert (c['pearson_lo'], c['pearson_hi']) == (ci.low, ci.high)
    assert c['spearman_lo'] < c['spearman'] < c['spearman_hi']
    assert correlation(x, y, n_boot=500) == c  # seeded
    assert correlation(x, y, n_boot=500, level=0.5)['spearman_hi'] < c['spearman_hi']

def test_correlation_pooled_and_degenerate():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 4)); y = x + 0.5 * rng.normal(size=(20, 4))
    c = correlation(x, y, n_boot=300)
    assert c['n'] == 80 and c['pearson_lo'] < c['pearson'] < c['pearson_hi']  # bootstrap over rows
    for bad in (correlation(x[:, 0], np.ones(20)), correlation([1., 2.], [2., 1.])):
        assert all(math.isnan(bad[k]) for k in ('pearson', 'pearson_lo', 'spearman', 'spearman_hi'))

def test_compare_credit_exact_truth():
    V, group = synthetic_values(P=3, G=6, K=6, seed=2)
    trained = torch.arange(6) < 5
    credits = {m: compute_credit(V, group, trained, CreditConfig(method=m)) for m in METHODS}
    truth = credits['dense'].rewards  # pretend the lookahead is exact
    se = torch.full_like(truth, 1e-3)
    rows = compare_credit(truth, se, credits, trained, n_boot=100)
    assert len(rows) == 4 * 2 * 6
    for r in rows:
        if r['method'] in ('dense', 'stepwise') and r['quantity'] == 'reward':
            assert math.isclose(r['pearson'], 1, abs_tol=1e-9) and r['sign_agree'] == 1.0 and r['zero_credit'] == 0
        if r['step'] == 'all': assert r['n'] == 18 * 5
        else: assert r['n'] == 18
    sig = next(r for r in rows if r['step'] == 'all')['n_sig']
    assert sig == int((truth[:, trained].abs() > 2e-3).sum())

def test_method_credits_share_values(policy):
    ro = _ro(policy)
    n0 = policy.nfe.nfe['lookahead']
    cr = credits_of(policy, ro, brightness)
    assert list(cr) == list(METHODS)
    assert policy.nfe.nfe['lookahead'] - n0 == ro.B * sum(ro.K - 1 - k for k in range(ro.K - 1))  # one ode:rest for dense and TP
    torch.testing.assert_close(cr['flow_grpo'].rewards[:, 0], ro.reward)
    with pytest.raises(ValueError, match='methods='): credits_of(policy, ro, brightness, ("dense", "x"))

def test_credit_fidelity_json(policy):
    f = credit_fidelity(policy, ['a circle'], brightness, RolloutConfig(K=3, group_size=4), M=2, n_boot=50,
                        methods=('flow_grpo', 'dense'))
    d = json.loads(json.dumps(f.to_dict()))
    assert d['settings']['lookaheads'] == {'flow_grpo': None, 'dense': 'ode:rest'}
    assert len(d['truth']) == 4 and len(d['stats']) == 2 * 2 * 3
    assert [r['method'] for r in f.table()] == ['flow_grpo', 'dense']

@pytest.fixture(scope='module')
def run_dir(tmp_path_factory, policy):
    "A hand-made trainer run folder with a non-trivial adapter."
    run = tmp_path_factory.mktemp('run')
    cfg = preset_config('flow_grpo+smoke', log_with='none')
    (run/'config.json').write_text(json.dumps(cfg.to_dict()))
    p = load_policy('tiny').add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    g = torch.Generator().manual_seed(0)
    sd = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in p.lora_state_dict().items()}
    write_checkpoint(run, 2, {'lora.safetensors': sd, 'state.json': dict(step=2)})
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
    (tmp_path/'config.json').write_text((run/'config.json').read_text())
    with pytest.raises(ValueError, match='no checkpoint'): load_run_policy(tmp_path)
    (run/'base.json').write_text(json.dumps(dict(fingerprint=load_policy('tiny').base_fingerprint())))
    load_run_policy(run)                                   # the recorded base is the shipped one: loads
    (run/'base.json').write_text(json.dumps(dict(fingerprint='0123456789abcdef')))
    with pytest.raises(ValueError, match='trained on other base weights'): load_run_policy(run)
    (run/'base.json').unlink()

def test_fidelity_report_files(run_dir, tmp_path):
    run, _ = run_dir
    fids = fidelity_report(tmp_path, run=run, prompts=1, group=2, K=3, M=2, n_boot=20, png=False)
    assert list(fids) == ['base', 'finetuned']
    assert fids['finetuned'].settings['checkpoint'].endswith('ckpt-000002')
    assert fids['base'].rollout.prompts == fids['finetuned'].rollout.prompts
    d = json.loads((tmp_path/'fidelity.json').read_text())
    assert set(d) == {'base', 'finetuned'} and d['finetuned']['settings']['reward'] == 'partial'
    names = {p.name for p in tmp_path.iterdir()}
    assert {'overall_advantage.html', 'correlation_reward_finetuned.html', 'signs_base.html', 'scatter_advantage_finetuned.html'} <= names

def test_fidelity_report_task_and_policy(policy):
    "A given policy and task are used as they are: the task's prompts (no categories: cycled) and its reward."
    task = Task('brightness', ['a red circle', 'two squares'], ['a blue cross'], brightness)
    fids = fidelity_report(None, policy=policy, task=task, prompts=3, group=2, K=3, M=2, n_boot=20)
    f = fids['base']
    assert list(fids) == ['base'] and f.rollout.prompts == ['a red circle'] * 2 + ['two squares'] * 2 + ['a red circle'] * 2
    torch.testing.assert_close(f.rollout.reward, brightness(f.rollout.images, None))
    assert (f.settings['task'], f.settings['reward']) == ('brightness', 'brightness')
    held = fidelity_report(None, policy=policy, task=task, prompts=1, split='heldout', group=2, K=3, M=2, n_boot=20)
    assert held['base'].rollout.prompts == ['a blue cross'] * 2

def test_fidelity_report_default_prompts_and_reward(policy):
    "Without a run: the embedded task's train prompts, balanced over its categories, and its training reward."
    from flowgrpo_nb.task import balanced_prompts
    task = load_task('partial')
    f = fidelity_report(None, prompts=6, group=2, K=3, M=2, n_boot=20)['base']
    names = balanced_prompts(task.train_prompts, 6, 0, task.category)
    assert f.settings['prompts'] == names and len({task.category(p) for p in names}) == 6
    torch.testing.assert_close(f.rollout.reward, task.reward(f.rollout.images, f.rollout.prompts))
    assert (f.settings['task'], f.settings['reward']) == ('geneval-partial', 'partial')
    s = fidelity_report(None, prompts=1, group=2, K=3, M=2, n_boot=20, reward='score')['base']
    assert s.settings['reward'] == 'score' and not torch.equal(s.rollout.reward, f.rollout.reward[:2])

@pytest.mark.parametrize('kw,msg', [(dict(split='x'), "split='x'"), (dict(M=1), 'M=1'), (dict(group=1), 'group=1'),
                                    (dict(prompts=0), 'prompts=0'), (dict(run='/nonexistent'), 'not a trainer run'),
                                    (dict(reward='clip'), "reward='clip'"),
                                    (dict(task=Task('t', ['a'], ['a'], brightness), reward='partial'), 'not both')])
def test_fidelity_report_errors(kw, msg):
    with pytest.raises(ValueError, match=msg): fidelity_report(None, **kw)

def test_cli_flags():
    fn = getattr(fidelity_cli, '__wrapped__', fidelity_cli)
    a = anno_parser(fn).parse_args(['--run', 'r', '-m', '4', '--no-base', '--n-boot', '10'])  # one-letter names: -k, -m
    assert (a.run, a.M, a.no_base, a.n_boot, a.K) == ('r', 4, True, 10, 10)

def test_compare_credit_zero_credit_is_not_a_sign():
    truth = torch.tensor([[0.5, 0.0], [-0.5, 0.0], [0.5, 0.0], [0.2, 0.0]])
    se = torch.full_like(truth, 0.1)  # the last row is not significant
    q = torch.tensor([[0.3, 0.0], [0.0, 0.0], [-0.1, 0.0], [0.0, 0.0]])
    cr = {'dense': compute_credit(torch.zeros(4, 3), torch.tensor([0, 0, 1, 1]), torch.tensor([True, False]))}
    cr['dense'].rewards, cr['dense'].advantages = q, q
    r = compare_credit(truth, se, cr, torch.tensor([True, False]), n_boot=10)[0]
    assert (r['step'], r['n_sig']) == (0, 3)
    assert math.isclose(r['zero_credit'], 1 / 3) and r['sign_agree'] == 0.5  # one right, one wrong, one not pushed
