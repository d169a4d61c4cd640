"The tiny model's fast path against its eager path: agreement within stated tolerances, and the trainer's use of it."
import copy
import pytest, torch
from flowgrpo_nb.config import preset_config
from flowgrpo_nb.precision import path_pair
from flowgrpo_nb.rollout import rollout, step_values, logprob_pairs
from flowgrpo_nb.task import load_policy, load_task
from flowgrpo_nb.train import GRPOTrainer, step_generator

@pytest.fixture(scope='module')
def pair():
    "An eager and a fast policy with the same adapter, moved off zero as after some training."
    torch.manual_seed(0)
    eager = load_policy('tiny').add_lora(8, 8.0)
    with torch.no_grad():
        for p in eager.trainable_parameters(): p.add_(0.02 * torch.randn_like(p))
    return path_pair(eager)

@pytest.fixture(scope='module')
def task(): return load_task('partial')

def test_logprobs_agree(pair, task):
    """The update's log-probs of the same transitions on either path: within 2e-3 up to step 4, within 0.05 at the last
    trained step.

    They average over 3072 dims; the bf16 error of the mean grows as the step's std shrinks (x0-prediction divides by
    t)."""
    eager, fast = pair
    cfg = preset_config('flow_grpo', prompts_per_step=2, group_size=4, minibatch=4)
    ro = rollout(eager, task.train_prompts[:2], cfg.rollout_config(), task.reward, step_generator(cfg, 0))
    ii, kk = torch.arange(ro.B).repeat_interleave(3), torch.tensor([0, 4, 8]).repeat(ro.B)
    le, lf = logprob_pairs(eager, ro, ii, kk).log_prob, logprob_pairs(fast, ro, ii, kk).log_prob
    d = (le - lf).abs().view(ro.B, 3).max(0).values  # per step 0, 4, 8
    assert lf.requires_grad and d[0] < 2e-3 and d[1] < 2e-3 and d[2] < 0.05, d
    assert not torch.equal(le, lf)  # two paths indeed

def test_step_values_of_a_few_level_reward_agree(pair, task):
    "ODE-completion values of the same states under mini-GenEval partial credit: equal on at least 99% of states."
    eager, fast = pair
    cfg = preset_config('dense', prompts_per_step=4, group_size=4, minibatch=8)
    same = total = 0
    for b in range(3):
        ro = rollout(eager, task.train_prompts[4 * b:4 * b + 4], cfg.rollout_config(), task.reward,
                     step_generator(cfg, b))
        ve, vf = (step_values(p, ro, 'ode:rest', task.reward).V[:, :-1] for p in pair)
        same, total = same + int((ve == vf).sum()), total + ve.numel()
    assert same / total >= 0.99, (same, total)

@pytest.mark.parametrize('updates', [1, 2])
def test_update_ratio_on_the_fast_path(tmp_path, task, updates):
    """The first update's ratio is exactly 1 (its old log-probs are its own); a second update of the same batch reads
    them from before the first step."""
    cfg = preset_config('flow_grpo+smoke', steps=1, eval_images=0, log_with='none', updates_per_rollout=updates,
                        minibatch=4, diag_every=0,
                        fast=True)  # the fast path, whatever fast='auto' would take on this machine
    tr = GRPOTrainer(cfg, tmp_path, task=task, progress=False)
    assert tr.policy.fast and tr.cfg.fast is True
    c = tr.collect(0)
    # every pair in the update: a chunk whose groups' rewards all tie (0 advantage) would be skipped, as on an Intel AMX
    c['advantages'] = torch.randn(c['advantages'].shape, generator=torch.Generator().manual_seed(0))
    stats = dict(loss=[], clipfrac=[], approx_kl=[], kl=[], grad_norm=[], skipped=[])
    chunks = torch.arange(c['rollout'].B).chunk(updates)
    ks = c['rollout'].trained.nonzero().flatten().tolist()
    old = tr._current_logprobs(c['rollout'], c['advantages'], ks, torch.cat(chunks[1:])) if updates > 1 else None
    for u, rows in enumerate(chunks):
        tr.opt.zero_grad(set_to_none=True)
        tr._backward(c['rollout'], c['advantages'], ks, rows, 1, stats, None if u == 0 else old)
        tr.opt.step()
    assert stats['approx_kl'][0] == 0.0 and stats['clipfrac'][0] == 0.0
    if updates == 2: assert 0 < stats['approx_kl'][1] < 1e-2  # the policy moved between the two updates, a little

def test_the_ratio_sees_the_policy_not_rounding(pair, task):
    """PPO's ratio compares one transition's log-probs under weights an optimizer step apart: on the fast path that
    change is the eager path's to well inside the clip range (1e-4). Under bf16 autocast in the update it was off by up
    to ~1e-3."""
    eager, fast = (copy.deepcopy(p) for p in pair)
    cfg = preset_config('flow_grpo', prompts_per_step=2, group_size=4, minibatch=4)
    ro = rollout(eager, task.train_prompts[:2], cfg.rollout_config(), task.reward, step_generator(cfg, 0))
    ii, kk = torch.arange(ro.B).repeat_interleave(3), torch.tensor([0, 4, 8]).repeat(ro.B)
    before = [logprob_pairs(p, ro, ii, kk).log_prob.detach() for p in (eager, fast)]
    torch.manual_seed(1)
    step = [1e-3 * torch.randn_like(q) for q in eager.trainable_parameters()]  # about one AdamW step at lr 1e-3
    for p in (eager, fast):
        with torch.no_grad():
            for q, d in zip(p.trainable_parameters(), step): q.add_(d)
    change = [logprob_pairs(p, ro, ii, kk).log_prob.detach() - b for p, b in zip((eager, fast), before)]
    assert change[0].abs().max() > 1e-6                            # the step moved the policy
    assert (change[1] - change[0]).abs().max() < preset_config('flow_grpo').clip_range / 10, \
        (change[1] - change[0]).abs().max()
