"""The published recipe's safeguards act: a trust region that clips, a KL to the reference, an EMA that evaluation uses,
an lr schedule, the collapse rule."""
import copy, math
import pytest, torch
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.task import collapse
from flowgrpo_nb.train import GRPOTrainer, load_run_policy
from flowgrpo_nb.config import lr_at
from flowgrpo_nb.policy import ema_weights

def trainer(base, tmp_path, name, **kw):
    pol, task = base
    cfg = preset_config('flow_grpo+smoke', **dict(log_with='none', eval_images=12, prompts_per_step=4, group_size=4,
                                                  minibatch=4, fast=False, lr=5e-3) | kw)
    return GRPOTrainer(cfg, tmp_path/name, policy=copy.deepcopy(pol), task=task, progress=False)

def test_collapse_rule_on_a_hand_made_curve():
    "A drop of more than 0.10 below the best earlier evaluation is a collapse, dated at its first evaluation."
    steps, evals = [0, 25, 50, 75, 100], [0.40, 0.62, 0.58, 0.45, 0.70]
    c = collapse(list(zip(steps, evals)))
    assert c is not None and c['step'] == 75 and c['best_step'] == 25 and c['drop'] == pytest.approx(0.17)
    assert collapse(list(zip(steps, [0.40, 0.62, 0.58, 0.53, 0.70]))) is None  # 0.09 below: noise, not a collapse
    assert collapse([(0, 0.5)]) is None

def test_second_update_of_a_batch_leaves_ratio_one_and_clips(base, tmp_path):
    """With one optimizer step per rollout batch the ratio is exactly 1 (eager path): the clip never acts. With two,
    the second step's samples are scored by weights the first step moved: the ratio leaves 1 and the clip acts."""
    one, two = (trainer(base, tmp_path, 'one', updates_per_rollout=1),
                trainer(base, tmp_path, 'two', updates_per_rollout=2))
    c = one.collect(0)
    s1 = one.update(c['rollout'], c['advantages'])
    assert s1['ratio_std'] == 0.0 and s1['clipfrac'] == 0.0 and s1['approx_kl'] == 0.0
    per = []
    orig = two._backward
    def spy(ro, A, ks, mb, n_mb, stats, old_lp, weight=None):
        n = len(stats['clipfrac']); orig(ro, A, ks, mb, n_mb, stats, old_lp, weight)
        per.append((int(mb[0]), stats['clipfrac'][n:], stats['ratio_std'][n:]))
    two._backward = spy
    s2 = two.update(c['rollout'], c['advantages'])
    first = [p for p in per if p[0] < c['rollout'].B // 2]; second = [p for p in per if p[0] >= c['rollout'].B // 2]
    # [] : every pair skipped (zero advantage)
    assert first and all(cf in ([], [0.0]) and rs in ([], [0.0]) for _, cf, rs in first)
    assert any(cf and cf[0] > 0 for _, cf, rs in second) and any(rs and rs[0] > 0 for _, cf, rs in second)
    assert (s2['clipfrac'] > 0 and s2['approx_kl'] > 0 and len(two.opt.state[two.params[0]])
            and two.opt.state[two.params[0]]['step'] == 2)

def test_kl_to_reference_is_zero_at_step_zero_and_positive_after_an_update(base, tmp_path):
    """The adapter starts at zero (peft's init): the first step's KL to the adapter-free reference is 0; after an update
    it is > 0."""
    # one update: the first step's KL is the base model's
    t = trainer(base, tmp_path, 'kl', beta=0.04, updates_per_rollout=1)
    c = t.collect(0)
    s0 = t.update(c['rollout'], c['advantages'])
    assert s0['kl'] == 0.0
    t.step = 1
    c1 = t.collect(1)
    s1 = t.update(c1['rollout'], c1['advantages'])
    assert s1['kl'] > 0 and math.isfinite(s1['kl'])

def test_ema_differs_from_the_live_adapter_and_is_what_evaluation_uses(base, tmp_path):
    t = trainer(base, tmp_path, 'ema', ema=True, ema_decay=0.9)
    for _ in range(3): t.train_step()
    live = [p.detach().clone() for p in t.params]
    assert any(not torch.equal(a, b) for a, b in zip(live, t.ema.shadow_params))
    got = t.evaluate(12).metrics('')
    with ema_weights(t.ema, t.params):  # the EMA's weights swapped in by hand, evaluation with EMA switched off
        assert all(torch.equal(p, s) for p, s in zip(t.params, t.ema.shadow_params))
        ema, t.ema = t.ema, None
        try: by_hand = t.evaluate(12).metrics('')
        finally: t.ema = ema
    assert all(torch.equal(p, q) for p, q in zip(t.params, live))  # evaluation leaves the live adapter in place
    assert got == by_hand

def test_the_saved_lora_is_the_evaluated_ema_and_resuming_restores_both(base, tmp_path):
    """With an EMA the checkpoint's diffusers LoRA file (what a user and `load_run_policy` load) holds the EMA's
    weights; the live adapter is kept beside it."""
    t = trainer(base, tmp_path, 'ema', ema=True, ema_decay=0.9)
    for _ in range(2): t.train_step()
    t.save()
    pol, _, _ = load_run_policy(tmp_path/'ema', policy=copy.deepcopy(base[0]))
    assert all(torch.equal(p, s) for p, s in zip(pol.trainable_parameters(), t.ema.shadow_params))
    assert any(not torch.equal(p, s) for p, s in zip(t.params, t.ema.shadow_params))
    if t.lock is not None: t.lock.release()
    r = GRPOTrainer(t.cfg, tmp_path/'ema', policy=copy.deepcopy(base[0]), task=base[1], progress=False, resume=True)
    assert (all(torch.equal(a, b) for a, b in zip(r.params, t.params))
            and r.ema.optimization_step == t.ema.optimization_step)
    assert all(torch.equal(a, b) for a, b in zip(r.ema.shadow_params, t.ema.shadow_params))

def test_lr_schedule_is_set_on_every_optimizer_step(base, tmp_path):
    t = trainer(base, tmp_path, 'lr', updates_per_rollout=2, lr_warmup=2, lr_schedule='cosine', steps=4)
    c = t.collect(0)
    s = t.update(c['rollout'], c['advantages'])
    assert (s['lr'] == pytest.approx((lr_at(t.cfg, 0) + lr_at(t.cfg, 1)) / 2)
            and t.opt.param_groups[0]['lr'] == lr_at(t.cfg, 1) == t.cfg.lr)

@pytest.mark.parametrize('fast', [False, True])
def test_kl_diagnostic_at_beta_zero_is_logged_and_changes_nothing(base, tmp_path, fast):
    """With beta = 0 the KL to the base model is logged every kl_every steps (0 before the first update, > 0 after);
    it is only a measurement: the adapter after three steps is bitwise the one of a run that does not log it."""
    on, off = (trainer(base, tmp_path, f'kl{n}{fast}', kl_every=n, fast=fast) for n in (1, 0))
    logged = [on.train_step() for _ in range(3)]
    plain = [off.train_step() for _ in range(3)]
    assert logged[0]['kl'] == 0.0 and logged[2]['kl'] > 0 and math.isfinite(logged[2]['kl'])
    assert all('kl' not in m for m in plain)
    assert all(torch.equal(a, b) for a, b in zip(on.params, off.params))
    assert [m['reward'] for m in logged] == [m['reward'] for m in plain]
