"""SPEC 5b's hand examples for TempFlow-GRPO (flowgrpo_nb.tempflow) and Flash-GRPO (flowgrpo_nb.flash),
their NFE counts on the tiny model and their bad settings; then both in the trainer: their presets end to end, the
NFE of the trainer's own run, the pairs and weights its update takes."""
import math
import pytest
import torch

from flowgrpo_nb.credit import CreditConfig, normalize_rewards
from flowgrpo_nb.flash import (FlashConfig, draw_k_star, flash_advantages, flash_rollout, sde_scale, tgr_lambda,
                               tgr_weights)
from flowgrpo_nb.flow import flow_sigmas, step_coefficients
from flowgrpo_nb.rollout import RolloutConfig, logprob_pairs, rollout
from flowgrpo_nb.update import ppo_loss, ppo_surrogate
from flowgrpo_nb.credit import group_advantages
from flowgrpo_nb.tempflow import (TempFlowConfig, branch_logprob, tempflow_advantages, tempflow_nfe, tempflow_rollout,
                                  tempflow_weight)
import warm  # python commands in a warm interpreter (tests/warm.py)

torch.set_num_threads(1)
close = lambda a, b, eps=1e-4: torch.testing.assert_close(torch.as_tensor(a).float(), torch.as_tensor(b).float(),
                                                          atol=eps, rtol=0)
T4 = flow_sigmas(4, 3.0)  # SPEC's K = 4 SD3 schedule (shift 3)


def brightness(images, prompts): return images.mean((1, 2, 3))


# ---------------------------------------------------------------- TempFlow-GRPO (SPEC unit test 5.6)

R56 = torch.tensor([[[[0.20, 0.60, 0.70], [0.50, 0.60, 0.72], [0.80, 0.90, 0.71]],
                     [[0.10, 0.30, 0.55], [0.40, 0.50, 0.55], [0.40, 0.70, 0.55]]]])  # [P=1, N=2, B=3, S=3]


def test_schedule_of_the_hand_examples():
    close(T4, [1, .8577, .6022, .0089, 0])
    close(T4[:3] - T4[1:4], [.1423, .2555, .5932])


def test_tempflow_seed_group():
    close(tempflow_advantages(R56, 'seed')[0],
          [[[-1.2242, -0.7066, -1.2099], [0.0000, -0.7066, 1.2099], [1.2242, 1.4132, 0.0000]],
           [[-1.4132, -1.2240, 0.0000], [0.7066, 0.0000, 0.0000], [0.7066, 1.2240, 0.0000]]])
    assert (tempflow_advantages(R56, 'seed')[0, 1, :, 2] == 0).all()  # std 0: exactly 0


def test_tempflow_prompt_group():
    close(tempflow_advantages(R56, 'prompt')[0],
          [[[-0.8940, 0.0000, 0.8716], [0.4470, 0.0000, 1.1207], [1.7881, 1.6423, 0.9962]],
           [[-1.3410, -1.6423, -0.9962], [0.0000, -0.5474, -0.9962], [0.0000, 0.5474, -0.9962]]])


def test_tempflow_weights_and_loss():
    omega = step_coefficients(T4[:3], T4[1:4], 'flow_sde', 0.7)[2]
    close(omega / (T4[:3] - T4[1:4]).sqrt(), [1.8556, 1.7185, 0.8612])
    close(omega, [.7000, .8687, .6633])
    close(tempflow_weight(omega), [0.9409, 1.1676, 0.8915])
    close(tempflow_weight(omega, 'const'), [1.575, 1.955, 1.492], 1e-3)
    close(tempflow_weight(omega, 'const').mean(), 1.674, 1e-3)
    zero = torch.zeros_like(R56)
    L = ppo_surrogate(zero, zero, tempflow_advantages(R56, 'seed'), 1e-4, tempflow_weight(omega))
    close(L[0, 0, 2], [-1.1518, -1.6501, 0.])


def test_tempflow_weight_on_the_released_schedule():
    t = flow_sigmas(10, 3.0)
    omega = step_coefficients(t[:-1], t[1:], 'flow_sde', 0.7)[2][:-1]
    close(omega, [.700, .743, .536, .446, .392, .353, .319, .282, .225], 1e-3)
    close(1 / omega.mean(), 2.252, 1e-3)
    close(tempflow_weight(omega, 'const').mean(), 0.999, 1e-3)


def test_tempflow_nfe_formula():
    assert tempflow_nfe(10, 4, 6) == 36 + 1080 == 1116
    assert tempflow_nfe(4, 2, 3) == 6 + 36 == 42
    assert tempflow_nfe(10, 4, 6, steps=[0, 3, 6]) == 4 * 7 + 24 * (9 + 6 + 3)


def test_a_weighted_pair_is_the_one_surrogate_at_advantage_w_a():
    "The methods' weights go through the package's one clipped surrogate (update.ppo_surrogate / ppo_loss)."
    g = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(5, 4, generator=g) * s for s in (0.3, 0.3, 1.0))
    w = torch.rand(4, generator=g) * 2
    close(ppo_surrogate(lp, old, adv, 0.2, w), ppo_surrogate(lp, old, w * adv, 0.2), 1e-6)
    close(ppo_surrogate(lp, old, adv, 0.2, w).mean(), ppo_loss(lp.flatten(), old.flatten(), adv.flatten(), 0.2,
                                                              w.expand(5, 4).flatten())[0], 1e-6)


@pytest.mark.parametrize('value,G', [(0.7776615023612976, 7), (0.55, 3), (0.1, 6)])
def test_no_spread_is_exactly_zero(value, G):
    r, group = torch.full((G, 1), value), torch.zeros(G, dtype=torch.long)
    assert (group_advantages(r, group) == 0).all()
    assert (group_advantages(r, group, global_std=True) == 0).all()


def test_no_spread_residue_of_normalize_rewards():
    "Why group_advantages zeroes no-spread groups: normalize_rewards leaves a float residue there."
    r = torch.full((7, 1), 0.7776615023612976)
    A = normalize_rewards(r, torch.zeros(7, dtype=torch.long), torch.ones(1, dtype=torch.bool), CreditConfig())
    assert A.abs().max() > 1e-4


def test_tempflow_rollout_nfe_and_ratio(tiny_policy):
    cfg = RolloutConfig(K=4, shift=3.0, guidance=4.5, group_size=2)
    with tiny_policy.count_nfe('rollout') as c:
        ro = tempflow_rollout(tiny_policy, ['a red circle', 'two squares'], cfg, TempFlowConfig(branches=3), brightness,
                              torch.Generator().manual_seed(0))
    assert c['nfe'] == 2 * 42 and c['calls'] == 6
    assert ro.reward.shape == ro.log_prob.shape == (2, 2, 3, 3) and ro.reward.numel() // ro.P == 18
    close(ro.std, [.7000, .8687, .6633])
    with tiny_policy.count_nfe('train') as ct:
        lp = branch_logprob(tiny_policy, ro, torch.tensor([0, 3, 2]), torch.tensor([0, 2, 1]))
    assert ct['nfe'] == 3  # one velocity per trunk state serves its B branches
    close(lp.log_prob, ro.log_prob.flatten(0, 1)[torch.tensor([0, 3, 2]), :, torch.tensor([0, 2, 1])], 1e-4)
    # one branch finished by the plain Euler loop gives the reward the lock-step completion gave
    p, n, b, j = 1, 0, 1, 0
    z, k = ro.y[p, n, b, j][None], int(ro.steps[j])
    with torch.no_grad():
        for i in range(k + 1, ro.K):
            z = z + (ro.t[i + 1] - ro.t[i]) * tiny_policy.velocity(z, ro.t[i], tiny_policy.encode([ro.prompts[p]]), 4.5)
    close(brightness(tiny_policy.decode(z), None)[0], ro.reward[p, n, b, j], 1e-5)


def test_tempflow_bad_settings():
    with pytest.raises(ValueError, match=r"TempFlowConfig.branches=1: allowed an integer >= 2"):
        TempFlowConfig(branches=1)
    with pytest.raises(ValueError, match=r"TempFlowConfig.branch_steps=\(0, 9\): allowed distinct steps in 0..8"):
        TempFlowConfig(branch_steps=(0, 9)).steps(RolloutConfig(K=10))
    with pytest.raises(ValueError, match=r"TempFlowConfig.group='batch': allowed seed, prompt"):
        TempFlowConfig(group='batch')
    with pytest.raises(ValueError, match=r"TempFlowConfig.weight='mean'"): TempFlowConfig(weight='mean')
    with pytest.raises(ValueError, match=r"TempFlowConfig.group='x'"): tempflow_advantages(R56, 'x')


# ---------------------------------------------------------------- Flash-GRPO (SPEC unit test 5.7)

POOL = torch.tensor([0, 1])


def test_flash_tgr_flash_sampler():
    s = sde_scale(T4)
    close(s[:3], [.8577, .7356, .5165])
    lam = tgr_lambda(T4, s)
    close(lam[:3], [0.4398, 0.7180, 1.6227])
    close((1 / lam)[:3], [2.2736, 1.3927, 0.6162])
    close(tgr_weights(POOL, 1 / lam, POOL, 'pool'), [1.2403, 0.7597])


def test_flash_tgr_flow_sde_sampler():
    c = 1 / tgr_lambda(T4, sde_scale(T4, 'flow_sde', level=0.7))
    close(c[:3], [4.9189, 2.7305, 0.8981])
    close(tgr_weights(POOL, c, POOL, 'pool'), [1.2861, 0.7139])


def test_flash_batch_versus_pool_normaliser():
    c = 1 / tgr_lambda(T4, sde_scale(T4))
    even, same = torch.tensor([0, 0, 0, 1, 1, 1]), torch.zeros(6, dtype=torch.long)
    close(tgr_weights(even, c, POOL, 'batch'), tgr_weights(even, c, POOL, 'pool'), 1e-6)
    close(tgr_weights(same, c, POOL, 'batch'), torch.ones(6), 1e-6)
    close(tgr_weights(same, c, POOL, 'pool'), torch.full((6,), 1.2403))


def test_flash_advantages_and_loss():
    R, g = torch.tensor([.2, .5, .8, .3, .3, .9]), torch.tensor([0, 0, 0, 1, 1, 1])
    close(R.std(unbiased=False), 0.26458, 1e-5)
    A = flash_advantages(R, g)
    close(A, [-1.1335, 0, 1.1335, -0.7556, -0.7556, 1.5113])
    close(flash_advantages(R, g, global_std=False), [-1.2242, 0, 1.2242, -0.7069, -0.7069, 1.4137])
    rho = tgr_weights(torch.tensor([0, 1])[g], 1 / tgr_lambda(T4, sde_scale(T4)), POOL, 'pool')
    zero = torch.zeros(6)
    close(ppo_surrogate(zero, zero, A, 1e-3, rho), [1.4058, 0, -1.4058, 0.5741, 0.5741, -1.1482])


def test_flash_wan_c_table():
    K, shift = 20, 3.0  # Wan2.1's schedule: sigma linear from 0.999 to 0 over K+1 points, last dropped, shifted
    s = torch.linspace(0.999, 0, K + 1, dtype=torch.float64)[:-1]
    t = torch.cat([shift * s / (1 + (shift - 1) * s), torch.zeros(1, dtype=torch.float64)])
    assert (1000 * t[:10]).floor().int().tolist() == [999, 982, 963, 944, 922, 899, 874, 847, 817, 785]
    c = 1 / tgr_lambda(t, sde_scale(t).double())
    close(c[:10], [7.4770, 7.0414, 6.6112, 6.1867, 5.7682, 5.3559, 4.9502, 4.5513, 4.1596, 3.7754])


def test_flash_draw_is_reproducible_and_in_the_pool():
    pool = FlashConfig().pool_steps(20)
    a = draw_k_star(50, pool, torch.Generator().manual_seed(0))
    assert torch.equal(a, draw_k_star(50, pool, torch.Generator().manual_seed(0)))
    assert torch.isin(a, pool).all()
    assert len(draw_k_star(20000, pool, torch.Generator().manual_seed(1)).unique()) == 10


def test_flash_rollout_nfe_pairs_and_ratio(tiny_policy):
    cfg = RolloutConfig(K=4, shift=3.0, guidance=4.5, group_size=3)
    k_star = torch.tensor([0, 1])
    with tiny_policy.count_nfe('rollout') as c:
        ro = flash_rollout(tiny_policy, ['a red circle', 'two squares'], cfg, FlashConfig(), brightness, k_star,
                           torch.Generator().manual_seed(0))
    assert c['nfe'] / ro.P == 3 * 4 == 12
    k = k_star[ro.group]
    assert ((ro.std > 0).sum(1) == 1).all() and torch.equal(ro.std.argmax(1), k)  # one trained pair per sample
    assert (ro.std > 0).sum() // ro.P == 3
    lp = logprob_pairs(tiny_policy, ro, torch.arange(ro.B), k)
    close(lp.log_prob, ro.log_prob[torch.arange(ro.B), k], 1e-4)


def test_flash_rollout_is_rollout_when_all_prompts_share_the_step(tiny_policy):
    cfg = RolloutConfig(K=4, shift=3.0, guidance=4.5, group_size=2)
    a = flash_rollout(tiny_policy, ['a circle', 'two squares'], cfg, FlashConfig(), brightness, torch.tensor([1, 1]),
                      torch.Generator().manual_seed(0))
    b = rollout(tiny_policy, ['a circle', 'two squares'], RolloutConfig(K=4, shift=3.0, guidance=4.5, group_size=2,
                window_start=1, window_size=1), brightness, torch.Generator().manual_seed(0), psi=sde_scale(T4))
    close(a.x, b.x, 1e-6); close(a.log_prob, b.log_prob, 1e-6)


def test_flash_bad_settings(tiny_policy):
    with pytest.raises(ValueError, match=r"FlashConfig.pool=\(0, 9\): allowed distinct steps in 0..8"):
        FlashConfig(pool=(0, 9)).pool_steps(10)
    with pytest.raises(ValueError, match=r"FlashConfig.pool=\(\): allowed .* at least one"):
        FlashConfig(pool=()).pool_steps(10)
    with pytest.raises(ValueError, match=r"FlashConfig.tgr_norm='group': allowed batch, pool"):
        FlashConfig(tgr_norm='group')
    with pytest.raises(ValueError, match=r"FlashConfig.sampler='cps'"): FlashConfig(sampler='cps')
    with pytest.raises(ValueError, match=r"k_star=\[2\]: allowed one step of the pool \[0, 1\]"):
        flash_rollout(tiny_policy, ['a circle'], RolloutConfig(K=4, group_size=2), FlashConfig(), brightness,
                      torch.tensor([2]))


# ---------------------------------------------------------------- in the trainer (06_collect, 06_train)

import copy, json, os, subprocess, sys, types
from pathlib import Path
from flowgrpo_nb.config import GRPOConfig, preset_config
from flowgrpo_nb.tempflow import BranchPairs, branch_pairs_logprob
from flowgrpo_nb.update import pair_loss

ROOT = Path(__file__).resolve().parent.parent
ENV = {**os.environ, 'OMP_NUM_THREADS': '1', 'PYTHONUNBUFFERED': '1'}
QUIET = dict(log_with='none', eval_images=0, diag_every=0, kl_every=0, save_every=0)


def trainer(base, tmp_path, preset, **kw):
    from flowgrpo_nb.train import GRPOTrainer
    policy, task = base
    return GRPOTrainer(preset_config(preset, **QUIET | kw), tmp_path, policy=copy.deepcopy(policy), task=task,
                       progress=False)


@pytest.mark.parametrize('method', ['tempflow', 'flash'])
def test_flowgrpo_train_preset_runs_on_the_embedded_default(tmp_path, method):
    "`flowgrpo train --preset tempflow|flash+smoke` as a user runs it: evaluation, checkpoints, its NFE per prompt."
    r = warm.run([sys.executable, '-m', 'flowgrpo_nb.cli', 'train', '--preset', f'{method}+smoke', '--out',
                  str(tmp_path), '--quiet', '--set', 'steps=2', 'log_with=none', 'eval_images=8'],
                 cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    first, rest = r.stdout.split('\n', 1)
    assert first.startswith('recipe tiny') and rest.startswith(f'{method}: 2 steps; geneval-partial: '), r.stdout
    s = json.loads((tmp_path/'summary.json').read_text())
    per_prompt = s['nfe_per_sample']['rollout'] * 4  # group_size 4 of the smoke preset
    assert per_prompt == (tempflow_nfe(4, 4, 6) if method == 'tempflow' else 4 * 4)
    assert (tmp_path/'checkpoints'/'ckpt-000002'/'pytorch_lora_weights.safetensors').exists()


def test_tempflow_nfe_per_prompt_of_the_trainers_own_run_is_the_formula(base, tmp_path):
    "SPEC 5b's released setting (K = 10, N = 4, B = 6) on one prompt: the trainer's rollout costs 1116 NFE."
    tr = trainer(base, tmp_path, 'tempflow', prompts_per_step=1, updates_per_rollout=1)
    m = tr.train_step()
    assert m['nfe_rollout'] * tr.cfg.group_size == tempflow_nfe(10, 4, 6) == 1116
    assert m['nfe_train'] <= 9  # at most one NFE per trunk state (seed, step) a seed, whatever its 6 branches
    assert math.isfinite(m['loss']) and m['grad_norm'] > 0


def test_flash_trains_only_its_one_sde_step_per_sample(base, tmp_path, monkeypatch):
    """With beta > 0 and no skipping (every pair kept), the update still scores only each sample's k*, never an Euler
    step."""
    import flowgrpo_nb.method as method_mod  # `Method.pair_logprob`, Flash's (it keeps the default)
    seen = []
    def spy(policy, ro, ii, kk):
        seen.append((ro, ii.clone(), kk.clone()))
        return logprob_pairs(policy, ro, ii, kk)
    monkeypatch.setattr(method_mod, 'logprob_pairs', spy)
    tr = trainer(base, tmp_path, 'flash+smoke', beta=0.01, skip_zero_adv=False, kl_every=1, diag_every=1)
    m = tr.train_step()
    assert seen and math.isfinite(m['loss']) and m['kl'] >= 0
    for ro, ii, kk in seen: assert (ro.std[ii, kk] > 0).all() and ro.pairs[ii, kk].all()  # only stochastic pairs
    assert set(torch.cat([ii for _, ii, _ in seen]).tolist()) == set(range(ro.B))       # every sample's one pair


def test_flash_weight_is_the_tgr_rho_of_each_samples_step(base, tmp_path):
    tr = trainer(base, tmp_path, 'flash', prompts_per_step=4, group_size=4, minibatch=4)
    c = tr.collect(0)
    ro, w, A = c['rollout'], c['weight'], c['advantages']
    k = ro.pairs.int().argmax(1).cpu()
    assert torch.equal(ro.pairs.cpu(), w > 0) and torch.equal(A != 0, (A != 0) & ro.pairs.cpu())
    c_k = 1 / tgr_lambda(ro.t.cpu(), ro.psi.cpu())
    close(w[torch.arange(ro.B), k], c_k[k] / c_k[k].mean(), 1e-6)  # the batch normaliser (released)
    assert set(k.tolist()) <= set(range(5))                          # the pool: the first half of K = 10


def test_tempflow_weight_leaves_the_kl_alone(base):
    "At ratio 1 with zero advantages the loss is beta x KL whatever the weights: the weight is the surrogate's only."
    policy, task = base
    pol = copy.deepcopy(policy).add_lora(4, 8.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in pol.trainable_parameters(): p.add_(0.02 * torch.randn_like(p))
    ro = tempflow_rollout(pol, ['a red circle'], RolloutConfig(K=4, group_size=2), TempFlowConfig(branches=3),
                          task.reward, torch.Generator().manual_seed(0))
    bp = BranchPairs(ro)
    ii, kk = bp.pairs.nonzero(as_tuple=True)
    z = torch.zeros(len(ii))
    a, b = (pair_loss(pol, bp, ii, kk, z, beta=0.1, weight=w, logprob=branch_pairs_logprob) for w in (None, 5 + z))
    assert a.kl > 0 and a.loss == pytest.approx(0.1 * a.kl, rel=1e-5) and b.loss == pytest.approx(a.loss, rel=1e-6)


def test_the_methods_bad_settings_are_one_sentence(base, tmp_path):
    with pytest.raises(ValueError, match=r"^GRPOConfig.tempflow_branches=1: allowed an integer >= 2$"):
        preset_config('tempflow', tempflow_branches=1)
    with pytest.raises(ValueError, match=r"^GRPOConfig.flash_pool=\(4, 5\): allowed distinct steps in 0..2, at least"):
        preset_config('flash+smoke', flash_pool=(4, 5))
    with pytest.raises(ValueError, match=r"GRPOConfig.train_start=0: allowed None for method='flash'"):
        preset_config('flash', train_start=0)
    from flowgrpo_nb.train import GRPOTrainer
    two = types.SimpleNamespace(num_processes=2)
    with pytest.raises(ValueError, match=r"method='tempflow' trains in one process"):
        GRPOTrainer(preset_config('tempflow+smoke', log_with='none'), tmp_path, accelerator=two)


def test_a_config_written_before_the_methods_still_loads():
    old = {k: v for k, v in GRPOConfig().to_dict().items() if not k.startswith(('tempflow_', 'flash_'))}
    assert GRPOConfig.from_dict(old) == GRPOConfig()

def test_fidelity_of_a_comparison_measures_tempflow_and_names_flash(tmp_path):
    """`flowgrpo fidelity --compare` measures TempFlow-GRPO's runs on the branches they credit; Flash-GRPO's runs are
    named and left out; a folder of Flash-GRPO runs alone is one sentence."""
    import json, warnings
    from flowgrpo_nb.checkpoint import RunFolder
    from flowgrpo_nb.task import load_policy
    from flowgrpo_nb.study.fidelity import FidelityConfig
    from flowgrpo_nb.study.fidelity_report import compare_fidelity
    tf = preset_config('tempflow+smoke', log_with='none')
    p = load_policy('tiny').add_lora(tf.lora_rank, tf.lora_alpha, tf.lora_targets)
    g = torch.Generator().manual_seed(0)
    sd = {k: 0.1 * torch.randn(v.shape, generator=g) for k, v in p.lora_state_dict().items()}
    for root, arms in ((tmp_path/'both', ('tempflow', 'flash')), (tmp_path/'flash', ('flash',))):
        for arm in arms:
            rf = RunFolder(root/'geneval'/'seed0'/arm)
            rf.write('config', preset_config(f'{arm}+smoke', log_with='none').to_dict())
            rf.write_checkpoint(2, {'lora.safetensors': sd, 'state.json': dict(step=2, psi=None)})
            rf.write('summary', dict(steps=2))
    cfg = FidelityConfig(prompts=2, batch_prompts=1, group=2, M=2, n_boot=20)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter('always')
        rows = compare_fidelity(tmp_path/'both', None, cfg, seeds=(0,), progress=False)
    said = ' '.join(str(x.message) for x in w)
    assert '1 run left out' in said and 'geneval/seed0/flash' in said and 'seed0/tempflow' not in said, said
    assert [(r['seed'], r['arm'], r['n']) for r in rows] == [(0, 'tempflow', 2 * 2 * 6 * 3)]  # prompts x N x B x steps
    assert -1 <= rows[0]['kendall'] <= 1 and rows[0]['kendall_window'] == rows[0]['kendall']  # it trains every branch
    res = json.loads((tmp_path/'both'/'fidelity'/'geneval'/'seed0'/'tempflow.json').read_text())
    assert res['settings']['arms']['tempflow']['steps'] == [0, 1, 2]
    with warnings.catch_warnings(record=True), pytest.raises(ValueError, match='^compare=.*: no run there of a method '
                                                                                'fidelity measures'):
        warnings.simplefilter('always')
        compare_fidelity(tmp_path/'flash', seeds=(0,), progress=False)
