"""Dense checks of the FLUX backend (flowgrpo_nb.flux) on a tiny random FluxPipeline: pipeline match, guidance,
schedule, LoRA, training."""
import math

import pytest
import torch

from flowgrpo_nb.flow import flow_sde_scale, flow_sigmas
from flowgrpo_nb.flux import FluxPolicy

torch.set_num_threads(1)
PROMPTS = ['a red apple', 'two cats on a sofa']
RES, L = 32, 16  # image side, T5 tokens: conftest's make_flux


@pytest.fixture(scope='module')
def policy(make_flux): return make_flux()


@pytest.fixture(scope='module')
def schnell(make_flux): return make_flux(guidance_embeds=False)


def brightness(images, prompts): return images.mean((1, 2, 3))


def xt(policy, n=2, seed=0):
    return policy.noise(n, torch.Generator().manual_seed(seed)), torch.linspace(1.0, 0.2, n)


def pipe_latents(policy, x, K, **kw):
    "The pipeline's own sampling loop from unpacked latents x, unpacked back."
    pipe = policy.pipe
    with torch.no_grad():
        out = pipe(PROMPTS, latents=pipe._pack_latents(x, len(x), *policy.latent_shape), num_inference_steps=K,
                   height=RES, width=RES, max_sequence_length=L, output_type='latent', **kw).images
    return pipe._unpack_latents(out, RES, RES, pipe.vae_scale_factor)


def network_rows(policy, f):
    "Rows of every transformer call made by f()."
    rows = []
    h = policy.transformer.register_forward_pre_hook(lambda m, a, kw: rows.append(len(kw['hidden_states'])),
                                                     with_kwargs=True)
    try: f()
    finally: h.remove()
    return rows


# ---- the deterministic rollout is FluxPipeline's sampling loop

@pytest.mark.parametrize('K', [1, 3])
def test_ode_rollout_matches_flux_pipeline(policy, K):
    from flowgrpo_nb.rollout import RolloutConfig, rollout
    ro = rollout(policy, PROMPTS, RolloutConfig(K=K, sampler='ode', guidance=3.5, group_size=1), brightness,
                 torch.Generator().manual_seed(0))
    theirs = pipe_latents(policy, ro.x[:, 0], K, guidance_scale=3.5)
    torch.testing.assert_close(ro.t, policy.pipe.scheduler.sigmas, atol=0, rtol=0)  # the pipeline's schedule
    assert (ro.x[:, -1] - theirs).abs().max() < 1e-5


def test_schnell_like_true_cfg_matches_pipeline(schnell):
    "Without a guidance embedding, guidance is true CFG against the empty prompt (the pipeline's true_cfg_scale)."
    assert not schnell.distilled
    x, _ = xt(schnell)
    from flowgrpo_nb.flow import sample_trajectory
    cond = schnell.encode(PROMPTS)
    with torch.no_grad():
        ours = sample_trajectory(lambda x, t: schnell.velocity(x, t, cond, 2.5), x, schnell.sigmas(3), 'ode').x
    theirs = pipe_latents(schnell, x, 3, negative_prompt=[''] * 2, true_cfg_scale=2.5)
    assert (ours - theirs).abs().max() < 1e-5


def test_network_rows_distilled_vs_cfg(policy, schnell):
    for pol, rows in ((policy, {3.5: [3], 1.0: [3]}), (schnell, {3.5: [6], 1.0: [3]})):
        x, t = xt(pol, 3)
        cond = pol.encode(PROMPTS + ['a blue car'])
        for w, expected in rows.items():
            with torch.no_grad(), pol.count_nfe('test') as c:
                assert network_rows(pol, lambda: pol.velocity(x, t, cond, w)) == expected, (pol.distilled, w)
            assert c['nfe'] == 3 and c['calls'] == 1


def test_velocity_rows_chunks_dtype(policy):
    x, t = xt(policy, 3)
    cond = policy.encode(PROMPTS + ['a blue car'])
    with torch.no_grad():
        v = policy.velocity(x, t, cond, 3.5)
        v_chunks = policy.velocity(x, t, cond, 3.5, max_batch=2)
        v_row = policy.velocity(x[1:2], t[1:2], cond.index(slice(1, 2)), 3.5)  # each row at its own t
    assert v.shape == x.shape == (3, 4, 16, 16) and v.dtype == torch.float32
    torch.testing.assert_close(v_chunks, v, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(v_row, v[1:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r'x has shape \(3, 4, 8, 8\)'):
        policy.velocity(torch.zeros(3, 4, 8, 8), t, cond, 3.5)


# ---- schedule, prompts, images

def test_sigmas_are_fluxs_shifted_linspace(policy):
    "linspace(1, 1/K, K) through the exponential time shift exp(mu) / (exp(mu) + 1/s - 1), then 0."
    for K in (1, 4, 10):
        ts, s = policy.sigmas(K), torch.linspace(1, 1 / K, K, dtype=torch.float64)
        expected = torch.cat([math.exp(policy.mu) / (math.exp(policy.mu) + 1 / s - 1),
                              torch.zeros(1, dtype=torch.float64)])
        torch.testing.assert_close(ts, expected.float(), atol=1e-6, rtol=0)
        assert ts.dtype == torch.float32 and ts.device.type == 'cpu' and ts.shape == (K + 1,)
        assert ts[0] == 1 and ts[-1] == 0 and (ts[1:] < ts[:-1]).all()
    # 64 x 64 patches = 4096 tokens: mu = max_shift
    big = FluxPolicy(policy.pipe, resolution=256, max_sequence_length=L)
    assert policy.mu < 0.5 and abs(big.mu - 1.15) < 1e-9 and (big.sigmas(4)[1:-1] > policy.sigmas(4)[1:-1]).all()
    with pytest.raises(ValueError, match='shift=3.0: must be 1 for FLUX'): policy.sigmas(4, 3.0)
    with pytest.raises(ValueError, match='K=0'): policy.sigmas(0)


def test_encode_is_encode_prompt(policy):
    policy.clear_cache()
    cond = policy.encode(PROMPTS)
    with torch.no_grad():
        alone = [policy.pipe.encode_prompt([p], device='cpu', max_sequence_length=L) for p in PROMPTS]
        ref, pooled, _ = policy.pipe.encode_prompt(PROMPTS, device='cpu', max_sequence_length=L)
    assert (torch.equal(cond.embeds, torch.cat([a[0] for a in alone]))
            and torch.equal(cond.pooled, torch.cat([a[1] for a in alone])))
    torch.testing.assert_close(cond.embeds, ref, atol=1e-5, rtol=1e-5)  # batched: the same up to rounding
    torch.testing.assert_close(cond.pooled, pooled, atol=1e-5, rtol=1e-5)
    assert cond.embeds.shape == (2, L, 32) and cond.pooled.shape == (2, 16) and not cond.embeds.requires_grad


def test_decode_matches_pipeline_images(policy):
    x, _ = xt(policy)
    cond = policy.encode(PROMPTS)
    from flowgrpo_nb.flow import sample_trajectory
    with torch.no_grad():
        z = sample_trajectory(lambda x, t: policy.velocity(x, t, cond, 3.5), x, policy.sigmas(2), 'ode').x
        ref = policy.pipe(PROMPTS, latents=policy.pipe._pack_latents(x, 2, *policy.latent_shape), num_inference_steps=2,
                          guidance_scale=3.5, height=RES, width=RES, max_sequence_length=L, output_type='pt').images
    images = policy.decode(z)
    torch.testing.assert_close(images, ref, atol=1e-4, rtol=0)
    assert images.dtype == torch.float32 and 0 <= images.min() and images.max() <= 1 and not images.requires_grad
    one_by_one = FluxPolicy(policy.pipe, resolution=RES, max_sequence_length=L, decode_batch=1).decode(z)
    torch.testing.assert_close(one_by_one, images, atol=1e-5, rtol=1e-5)


def test_bad_arguments(policy):
    with pytest.raises(ValueError,
                       match=r'resolution=30: must be a positive multiple of 4 \(VAE factor 2 x 2x2 latent packing\)'):
        FluxPolicy(policy.pipe, resolution=30)
    with pytest.raises(ValueError, match='decode_batch=0'): FluxPolicy(policy.pipe, resolution=RES, decode_batch=0)
    with pytest.raises(ValueError, match='no model_index.json'):
        FluxPolicy.from_pretrained('/nonexistent', device='cpu')


def test_from_pretrained_local_folder(policy, tmp_path):
    policy.pipe.save_pretrained(tmp_path)
    loaded = FluxPolicy.from_pretrained(tmp_path, dtype=torch.bfloat16, device='cpu', resolution=RES,
                                        max_sequence_length=L)
    assert loaded.dtype == torch.bfloat16 and loaded.pipe.vae.dtype == torch.float32 and loaded.distilled
    same = FluxPolicy.from_pretrained(tmp_path, dtype=torch.float32, device='cpu', resolution=RES,
                                      max_sequence_length=L)
    x, t = xt(policy)
    with torch.no_grad():
        assert torch.equal(same.velocity(x, t, same.encode(PROMPTS), 3.5),
                           policy.velocity(x, t, policy.encode(PROMPTS), 3.5))
        v16 = loaded.velocity(x, t, loaded.encode(PROMPTS), 3.5)
    assert v16.dtype == torch.float32 and torch.isfinite(v16).all()
    from flowgrpo_nb.task import load_policy   # a run names the backend and its folder
    assert isinstance(load_policy('flux', str(tmp_path), 'cpu', resolution=RES), FluxPolicy)
    with pytest.raises(ValueError, match="model='flux' needs model_path"): load_policy('flux')


# ---- LoRA

def test_lora_targets_zero_init_disable(make_flux):
    pol = make_flux()
    x, t = xt(pol)
    cond = pol.encode(PROMPTS)
    with torch.no_grad(): base = pol.velocity(x, t, cond, 3.5)
    pol.add_lora(rank=4, alpha=8)
    names = {n for n, p in pol.transformer.named_parameters() if p.requires_grad}
    assert names and all('lora_' in n for n in names)
    # e.g. 'single_transformer_blocks.to_q'
    hit = {n.split('.')[0] + '.' + n.split('.attn.')[1].split('.lora_')[0] for n in names}
    assert hit == {f'transformer_blocks.{m}' for m in ('to_q', 'to_k', 'to_v', 'to_out.0', 'add_q_proj', 'add_k_proj',
                                                         'add_v_proj', 'to_add_out')} | \
                  {f'single_transformer_blocks.{m}' for m in ('to_q', 'to_k', 'to_v')}
    with torch.no_grad():
        assert torch.equal(pol.velocity(x, t, cond, 3.5), base)
        for p in pol.trainable_parameters(): p.add_(0.1 * torch.randn_like(p))
        moved = pol.velocity(x, t, cond, 3.5)
        with pol.disable_adapter(): assert torch.equal(pol.velocity(x, t, cond, 3.5), base)
    assert (moved - base).abs().max() > 1e-3


# adapter dtype, save/load and gradient checkpointing: tests/test_diffusers_policy.py (shared with the other backend)


# ---- one full GRPO step per method, and the calibration's schedule


@pytest.mark.parametrize('method', ['flow_grpo', 'stepwise', 'dense', 'turning_point', 'tempflow', 'flash'])
def test_grpo_step_on_flux(method, tmp_path, make_flux):
    from flowgrpo_nb.train import GRPOConfig, GRPOTrainer
    from flowgrpo_nb.task import Task
    pol = make_flux()
    cfg = GRPOConfig(method=method, K=3, guidance=3.5, prompts_per_step=2, group_size=2, minibatch=2,
                     lora_rank=4, lora_alpha=8, steps=1, eval_every=0, save_every=0, log_with='none')
    trainer = GRPOTrainer(cfg, tmp_path / method, policy=pol, task=Task('brightness', PROMPTS, PROMPTS, brightness),
                          progress=False)
    before = [p.detach().clone() for p in pol.trainable_parameters()]
    m = trainer.train_step()
    # NFE per sample: K; TempFlow's per seed, its trunk and 6 branches at steps 0, 1: (2 + 6 x (2 + 1)) = 20
    assert math.isfinite(m['loss']) and m['nfe_rollout'] == (20 if method == 'tempflow' else 3)
    assert (m['nfe_lookahead'] > 0) == (method in ('dense', 'turning_point'))  # stepwise: Tweedie, 0 NFE
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.trainable_parameters()))


def test_calibration_starts_on_the_policy_schedule(policy, tmp_path, make_flux):
    from flowgrpo_nb.train import GRPOConfig, GRPOTrainer
    from flowgrpo_nb.task import Task
    cfg = GRPOConfig(method='dense', K=4, guidance=3.5, prompts_per_step=2, group_size=2, minibatch=2, lora_rank=4,
                     lora_alpha=8, steps=1, eval_every=0, save_every=0, log_with='none', calib_iters=0)
    trainer = GRPOTrainer(cfg, tmp_path, policy=make_flux(), task=Task('brightness', PROMPTS, PROMPTS, brightness),
                          progress=False)
    cal = trainer.calibrate()
    ts = policy.sigmas(4)
    torch.testing.assert_close(cal.psi, flow_sde_scale(ts[:-1], ts[1:], cfg.level))
    assert not torch.allclose(cal.psi, flow_sde_scale(flow_sigmas(4)[:-1], flow_sigmas(4)[1:], cfg.level))
    from flowgrpo_nb.viz import load_calibration            # the run folder keeps its schedule for the plots
    torch.testing.assert_close(load_calibration(tmp_path)[1], ts)
