"Dense checks of flowgrpo_nb.rollout: exact NFE counts, brute-force lookahead equality, PPO-ratio reproduction."
import dataclasses, math
import pytest, torch
from flowgrpo_nb.flow import flow_sigmas, x0_hat
from flowgrpo_nb.tiny import TinyConfig, TinyFlowModel
from flowgrpo_nb.tiny import TinyPolicy
from flowgrpo_nb.rollout import (RolloutConfig, Rollout, StepValues, rollout, step_values, logprob_of, value_plan,
                                 lookahead_nfe, parse_lookahead, reward_states)

torch.set_num_threads(1)
SMALL = dict(text_dim=32, text_heads=2, text_layers=1, pooled_dim=32, num_layers=2, num_heads=2, head_dim=16)
PROMPTS = ['a red circle', 'two squares']


def brightness(images, prompts): return images.mean((1, 2, 3))


@pytest.fixture(scope='module')
def policy():
    torch.manual_seed(0)
    return TinyPolicy(TinyFlowModel(TinyConfig(**SMALL)))


def run(policy, seed=0, prompts=PROMPTS, **kw):
    return rollout(policy, prompts, RolloutConfig(**kw), brightness, torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- config

@pytest.mark.parametrize('kw,msg', [
    (dict(K=10, window_start=10), 'window_start=10: allowed 0..9'),
    (dict(K=10, window_start=-1), 'window_start=-1'),
    (dict(K=10, window_start=3, window_size=7),
     'window_size=7: allowed 0..6: the SDE window [3, 3+7) must end by step 9'),
    (dict(K=5, window_size=-1), 'allowed 0..4'),
    (dict(K=0), 'K=0'), (dict(K=2.0), 'K=2.0'), (dict(group_size=0), 'group_size=0'),
    (dict(max_batch=0), 'max_batch=0'), (dict(sampler='euler'), "sampler='euler'"),
    (dict(level=float('nan')), 'level=nan'), (dict(guidance=-1), 'guidance=-1'), (dict(shift=0.0), 'shift=0.0'),
])
def test_config_errors(kw, msg):
    with pytest.raises(ValueError, match=None) as e: RolloutConfig(**kw)
    assert msg in str(e.value) and 'RolloutConfig.' in str(e.value)


def test_config_window():
    assert RolloutConfig(K=10).window == (0, 9)
    assert RolloutConfig(K=10, window_start=3).window == (3, 9)
    assert RolloutConfig(K=10, window_start=1, window_size=9 - 1).trained.tolist() == [False] + [True] * 8 + [False]
    c = dataclasses.replace(RolloutConfig(K=10), K=4)  # window_size=None follows K
    assert c.window == (0, 3)


# ---------------------------------------------------------------- rollout

def test_rollout_shapes_and_fields(policy):
    ro = run(policy, K=4, group_size=3)
    B, K = 6, 4
    assert (ro.B, ro.K, ro.P, ro.G) == (B, K, 2, 3)
    assert ro.prompts == ['a red circle'] * 3 + ['two squares'] * 3 and ro.group.tolist() == [0, 0, 0, 1, 1, 1]
    assert ro.x.shape == (B, K + 1, 3, 32, 32) and ro.v.shape == ro.mean.shape == (B, K, 3, 32, 32)
    assert ro.std.shape == ro.log_prob.shape == (B, K) and ro.images.shape == (B, 3, 32, 32)
    torch.testing.assert_close(ro.t, flow_sigmas(4))
    torch.testing.assert_close(ro.reward, brightness(ro.images, None))
    torch.testing.assert_close(ro.images, policy.decode(ro.x[:, -1]))
    assert (ro.std[:, :3] > 0).all() and (ro.std[:, 3] == 0).all() and (ro.log_prob[:, 3] == 0).all()
    assert torch.isfinite(ro.log_prob).all()
    with pytest.raises(dataclasses.FrozenInstanceError): ro.reward = None
    assert 'B=6 = 2 prompts × 3' in repr(ro)


def test_rollout_deterministic_and_noise_modes(policy):
    a, b = run(policy, seed=5, K=3, group_size=2), run(policy, seed=5, K=3, group_size=2)
    torch.testing.assert_close(a.x, b.x)
    assert not torch.equal(a.x[0, 0], a.x[1, 0])
    s = run(policy, K=3, group_size=2, shared_noise=True)
    assert torch.equal(s.x[0, :1], s.x[1, :1]) and not torch.equal(s.x[0, 0], s.x[2, 0])
    assert not torch.equal(s.x[0, 1], s.x[1, 1])


def test_rollout_window_ode_outside(policy):
    ro = run(policy, K=5, group_size=2, window_start=1, window_size=2, sampler='cps', level=0.5)
    assert ro.trained.tolist() == [False, True, True, False, False]
    off = ~ro.trained
    assert (ro.std[:, off] == 0).all() and (ro.log_prob[:, off] == 0).all() and (ro.std[:, ro.trained] > 0).all()
    # ODE steps: x_{k+1} = x_k + dt v
    for k in (0, 3, 4):
        torch.testing.assert_close(ro.x[:, k + 1], ro.x[:, k] + (ro.t[k + 1] - ro.t[k]) * ro.v[:, k])


def test_rollout_nfe_and_chunking(policy):
    policy.nfe.reset()
    a = run(policy, K=3, group_size=2)
    assert policy.nfe.nfe['rollout'] == 3 * 4 and policy.nfe.calls['rollout'] == 3
    b = run(policy, K=3, group_size=2, max_batch=3)
    torch.testing.assert_close(a.x, b.x, atol=1e-4, rtol=1e-4)


def test_rollout_psi(policy):
    psi = torch.tensor([0.3, 0.2, 0.0])
    ro = rollout(policy, PROMPTS, RolloutConfig(K=3, group_size=2), brightness, torch.Generator().manual_seed(0),
                 psi=psi)
    dt = -(ro.t[1:] - ro.t[:-1])
    torch.testing.assert_close(ro.std[:, :2], (psi[:2] * dt[:2].sqrt()).expand(4, 2))
    with pytest.raises(ValueError, match='psi'): rollout(policy, PROMPTS, RolloutConfig(K=3), brightness, psi=-psi)


def test_reward_errors(policy):
    def nan_at_3(images, prompts): r = brightness(images, prompts); r[3] = float('inf'); return r
    with pytest.raises(ValueError, match=r"inf for sample 3 \(prompt 'two squares'\)"):
        rollout(policy, PROMPTS, RolloutConfig(K=2, group_size=2), nan_at_3)
    with pytest.raises(ValueError, match=r'shape \(4, 1\)'):
        rollout(policy, PROMPTS, RolloutConfig(K=2, group_size=2), lambda im, p: brightness(im, p)[:, None])
    ro = run(policy, K=3, group_size=2)
    calls = []
    def nan_late(images, prompts):
        calls.append(len(images)); r = brightness(images, prompts); r[-1] = float('nan'); return r
    with pytest.raises(ValueError, match=r"nan for sample 3, state x_2 \(prompt 'two squares'\)"):
        step_values(policy, ro, 'tweedie', nan_late)
    with pytest.raises(ValueError, match='non-empty list of str'): rollout(policy, [], RolloutConfig(), brightness)


# ---------------------------------------------------------------- step values

def brute_force(policy, ro, op):
    "One state at a time, no reuse: the reference the batched lookahead must equal."
    kind, n = parse_lookahead(op)
    V = torch.empty(ro.B, ro.K + 1)
    V[:, -1] = ro.reward
    with torch.no_grad():
        for i in range(ro.B):
            c = policy.encode([ro.prompts[i]])
            for k in range(ro.K):
                y = ro.x[i:i + 1, k]
                grid = ro.t[k:] if kind == 'rest' else ro.t[k] * (1 - torch.arange((n or 1) + 1) / (n or 1))
                for j in range(len(grid) - 1):
                    y = y + (grid[j + 1] - grid[j]) * policy.velocity(y, grid[j], c, ro.cfg.guidance)
                V[i, k] = brightness(policy.decode(y), None)[0]
    return V


@pytest.mark.parametrize('op', ['tweedie', 'ode:1', 'ode:3', 'ode:rest'])
@pytest.mark.parametrize('kw', [dict(), dict(window_start=1, window_size=2, shared_noise=True)])
def test_step_values_equal_brute_force(policy, op, kw):
    ro = run(policy, K=5, group_size=2, **kw)
    sv = step_values(policy, ro, op, brightness)
    torch.testing.assert_close(sv.V, brute_force(policy, ro, op), atol=2e-5, rtol=1e-4)
    assert (sv.V[:, -1] == ro.reward).all()


def test_tweedie_is_x0_hat(policy):
    ro = run(policy, K=4, group_size=2)
    sv = step_values(policy, ro, 'tweedie', brightness, keep_images=True)
    imgs = policy.decode(x0_hat(ro.x[:, 2], ro.t[2], ro.v[:, 2]))
    torch.testing.assert_close(sv.images[:, 2], imgs)
    torch.testing.assert_close(sv.images[:, -1], ro.images)
    assert (sv.nfe, sv.calls, sv.states) == (0, 0, 16)


def nfe_case(K, G, P, op, **kw):
    "Expected (NFE for the batch, batched calls) of step_values, counted from first principles."
    cfg = RolloutConfig(K=K, group_size=G, **kw)
    s, e = cfg.window
    kind, n = parse_lookahead(op)
    B = P * G
    def copies(k):  # how many distinct states sit at step k across the batch
        shared = cfg.shared_noise and k <= (s if s < e else K)
        return P if shared else B
    if kind == 'tweedie': return 0, 0
    if kind == 'ode':
        return (n - 1) * sum(copies(k) for k in range(K)), n - 1
    starts = list(range(s, e))  # ode:rest completes only states on the window
    nfe = sum((K - 1 - k) * copies(k) for k in starts)
    return nfe, (K - 1 - s) if starts else 0


@pytest.mark.parametrize('K,G,kw', [
    (4, 2, dict()), (6, 3, dict()), (6, 2, dict(shared_noise=True)), (6, 1, dict()),
    (7, 2, dict(window_start=2, window_size=3)), (7, 3, dict(window_start=2, window_size=3, shared_noise=True)),
    (5, 2, dict(window_size=0)), (5, 2, dict(window_size=0, shared_noise=True)), (1, 2, dict()),
])
@pytest.mark.parametrize('op', ['tweedie', 'ode:1', 'ode:2', 'ode:5', 'ode:rest'])
def test_nfe_exact(policy, K, G, kw, op):
    ro = run(policy, K=K, group_size=G, **kw)
    policy.nfe.reset()
    sv = step_values(policy, ro, op, brightness)
    nfe, calls = nfe_case(K, G, 2, op, **kw)
    assert (sv.nfe, sv.calls) == (nfe, calls)
    assert policy.nfe.nfe['lookahead'] == nfe and policy.nfe.nfe['rollout'] == 0
    assert sv.nfe_per_sample == pytest.approx(lookahead_nfe(op, K, ro.cfg.window, G, ro.cfg.shared_noise))


@pytest.mark.parametrize('K', [2, 5, 10])
def test_acceptance_bounds(policy, K):
    "Default window, independent noise: tweedie 0; ode:rest K(K-1)/2 in K-1 <= K calls; ode:n <= n(K-1) for n <= K."
    ro = run(policy, K=K, group_size=2, prompts=PROMPTS[:1])
    assert step_values(policy, ro, 'tweedie', brightness).nfe == 0
    rest = step_values(policy, ro, 'ode:rest', brightness)
    assert rest.nfe_per_sample == K * (K - 1) / 2 and rest.calls == K - 1 <= K
    for n in (1, 2, K):
        s = step_values(policy, ro, f'ode:{n}', brightness)
        assert s.nfe_per_sample == K * (n - 1) <= n * (K - 1) and s.calls == n - 1


def test_lookahead_chunked_same(policy):
    ro = run(policy, K=4, group_size=2)
    a = step_values(policy, ro, 'ode:rest', brightness)
    b = step_values(policy, ro, 'ode:rest', brightness, dataclasses.replace(ro.cfg, max_batch=3))
    torch.testing.assert_close(a.V, b.V, atol=1e-5, rtol=1e-4)
    assert (a.nfe, a.calls) == (b.nfe, b.calls)


def test_value_plan_sharing(policy):
    ro = run(policy, K=5, group_size=3, window_start=1, window_size=2, shared_noise=True)
    rows, ks, src = value_plan(ro, 'ode:rest')
    # x_0 -> x_1 is ODE: V_0 reads x_1's entry; x_1 is shared in the group; steps 3, 4 read the reward
    assert (src[:, 0] == src[:, 1]).all() and (src[:3, 1] == src[0, 1]).all() and (src[:, 3:] == -1).all()
    assert len(rows) == 2 + 6 and sorted(set(ks.tolist())) == [1, 2]
    with pytest.raises(ValueError, match="op='ode:0'"): value_plan(ro, 'ode:0')
    with pytest.raises(ValueError, match="op='euler'"): step_values(policy, ro, 'euler', brightness)


# ---------------------------------------------------------------- log-probs

@pytest.mark.parametrize('sampler,level', [('flow_sde', 0.7), ('cps', 0.6), ('ddim', 0.5)])
def test_logprob_of_reproduces_rollout(policy, sampler, level):
    ro = run(policy, K=4, group_size=2, sampler=sampler, level=level)
    out = logprob_of(policy, ro, [0, 1, 2])
    assert out.log_prob.shape == (4, 3) and out.mean.shape == (4, 3, 3, 32, 32)
    # fp32 rounding of a mean over 3072 dims
    torch.testing.assert_close(out.log_prob, ro.log_prob[:, :3], atol=5e-5, rtol=0)
    torch.testing.assert_close(out.std, ro.std[:, :3])
    torch.testing.assert_close(out.mean, ro.mean[:, :3], atol=1e-5, rtol=1e-5)
    one = logprob_of(policy, ro, 2, rows=[3, 0])
    assert one.log_prob.shape == (2,)
    torch.testing.assert_close(one.log_prob, ro.log_prob[[3, 0], 2], atol=5e-5, rtol=0)


def test_logprob_of_with_lora_and_psi(policy):
    torch.manual_seed(1)
    p = TinyPolicy(TinyFlowModel(TinyConfig(**SMALL)))
    ro = rollout(p, PROMPTS, RolloutConfig(K=4, group_size=2, window_start=1), brightness,
                 torch.Generator().manual_seed(0), psi=torch.tensor([0.0, 0.4, 0.3, 0.0]))
    p.add_lora(rank=2)
    out = logprob_of(p, ro, [1, 2])
    ratio = torch.exp(out.log_prob - ro.log_prob[:, 1:3])
    torch.testing.assert_close(ratio, torch.ones_like(ratio), atol=1e-5, rtol=0)
    out.log_prob.sum().backward()
    assert all(q.grad is not None for q in p.trainable_parameters())
    with torch.no_grad():
        for q in p.trainable_parameters(): q.add_(0.05 * torch.randn_like(q))
        moved = logprob_of(p, ro, 1)
        with p.disable_adapter(): ref = logprob_of(p, ro, 1)
    assert (moved.log_prob - ro.log_prob[:, 1]).abs().max() > 1e-6
    torch.testing.assert_close(ref.log_prob, ro.log_prob[:, 1], atol=1e-5, rtol=0)
    assert p.nfe.nfe['train'] == 4 * 2 + 4 + 4
    with pytest.raises(ValueError, match='step 0 is not an SDE step'): logprob_of(p, ro, 0)
    with pytest.raises(ValueError, match='step 3 is not an SDE step'): logprob_of(p, ro, [1, 3])
    with pytest.raises(ValueError, match=r'rows=\[-1\]'): logprob_of(p, ro, 1, rows=[-1])


def test_rollout_rows_data_parallel(policy):
    "Each process's slice of the batch equals the same rows of the whole batch (noise drawn for all, rows kept)."
    for shared in (False, True):
        kw = dict(K=3, group_size=3, shared_noise=shared, window_start=1)
        full = run(policy, seed=7, **kw)
        parts = [rollout(policy, PROMPTS, RolloutConfig(**kw), brightness, torch.Generator().manual_seed(7), rows=r)
                 for r in (slice(0, 4), [4, 5])]
        torch.testing.assert_close(torch.cat([p.x for p in parts]), full.x, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(torch.cat([p.log_prob for p in parts]), full.log_prob, atol=1e-4, rtol=1e-4)
        assert torch.cat([p.group for p in parts]).tolist() == full.group.tolist() == [0, 0, 0, 1, 1, 1]
        assert parts[0].prompts == full.prompts[:4] and parts[0].P == 2
    with pytest.raises(ValueError, match=r'rows=\[7\]'):
        rollout(policy, PROMPTS, RolloutConfig(K=2, group_size=2), brightness, rows=[7])
