"""Dense checks of the SD3 backend (flowgrpo_nb.sd3) and the local-weight rewards (flowgrpo_nb.rewards), on a tiny
random SD3 pipeline."""
import importlib.util, math
from pathlib import Path

import pytest
import torch

from flowgrpo_nb.sd3 import SD3Policy
from flowgrpo_nb.rewards import CLIPScore, WeightedSum

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ['a red apple', 'two cats on a sofa']


@pytest.fixture(scope='module')
def policy(make_sd3): return make_sd3()


@pytest.fixture(scope='module')
def clip(clip_folder): return CLIPScore.from_pretrained(clip_folder, batch_size=3)


def xt(policy, n=2, seed=0):
    return policy.noise(n, torch.Generator().manual_seed(seed)), torch.linspace(1.0, 0.2, n)


# ---- the policy interface

def test_encode_cached(policy, monkeypatch):
    calls = []
    orig = policy.pipe.encode_prompt
    monkeypatch.setattr(policy.pipe, 'encode_prompt',
                        lambda prompt, **kw: calls.append(list(prompt)) or orig(prompt, **kw))
    policy.clear_cache()
    a = policy.encode(PROMPTS + PROMPTS[:1])
    b = policy.encode(PROMPTS[::-1])
    # each distinct string encoded once and alone, the empty prompt included
    assert calls == [[''], PROMPTS[:1], PROMPTS[1:]]
    assert a.embeds.shape == (3, 32 + 8, 32) and a.pooled.shape == (3, 32)
    assert torch.equal(a.embeds[0], b.embeds[1]) and torch.equal(a.neg_embeds[0], b.neg_embeds[0])
    assert not a.embeds.requires_grad


def test_velocity_cfg_shape_dtype(policy):
    x, t = xt(policy, 3)
    cond = policy.encode(PROMPTS + ['a blue car'])
    with torch.no_grad(), policy.count_nfe('test') as c:
        v1, v0, v5 = (policy.velocity(x, t, cond, w) for w in (1.0, 0.0, 5.0))
        v5_chunks = policy.velocity(x, t, cond, 5.0, max_batch=2)
    assert v5.shape == x.shape == (3, 4, 16, 16) and v5.dtype == torch.float32
    torch.testing.assert_close(v5, v0 + 5 * (v1 - v0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(v5_chunks, v5, atol=1e-5, rtol=1e-5)
    assert c['nfe'] == 12
    # rows at different times: each row is the velocity at its own t
    with torch.no_grad(): v_row = policy.velocity(x[1:2], t[1:2], cond.index(slice(1, 2)), 5.0)
    torch.testing.assert_close(v_row, v5[1:2], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match=r'x has shape \(3, 4, 8, 8\)'):
        policy.velocity(torch.zeros(3, 4, 8, 8), t, cond, 5.0)


def test_bf16_weights_fp32_velocity(make_sd3):
    pol = make_sd3(torch.bfloat16)
    x, t = xt(pol)
    with torch.no_grad(): v = pol.velocity(x, t, pol.encode(PROMPTS), 4.5)
    assert pol.dtype == torch.bfloat16 and v.dtype == torch.float32 and torch.isfinite(v).all()
    assert pol.decode(x).dtype == torch.float32


def test_decode_range_and_batching(policy):
    x, _ = xt(policy, 3)
    images = policy.decode(x * 3)  # out-of-range latents still give images in [0, 1]
    assert images.shape == (3, 3, 32, 32) and images.dtype == torch.float32 and not images.requires_grad
    assert 0 <= images.min() and images.max() <= 1
    one_by_one = SD3Policy(policy.pipe, resolution=32, max_sequence_length=8, decode_batch=1).decode(x * 3)
    torch.testing.assert_close(one_by_one, images, atol=1e-5, rtol=1e-5)


def test_bad_arguments(policy):
    with pytest.raises(ValueError, match='resolution=30: must be a positive multiple of 4'):
        SD3Policy(policy.pipe, resolution=30)
    with pytest.raises(ValueError, match='decode_batch=0'): SD3Policy(policy.pipe, resolution=32, decode_batch=0)
    with pytest.raises(ValueError, match='no model_index.json'): SD3Policy.from_pretrained('/nonexistent', device='cpu')


def test_a_damaged_model_index_is_said(policy, tmp_path):
    policy.pipe.save_pretrained(tmp_path)
    index = (tmp_path/'model_index.json').read_text()
    # cut short, as by a full disk or an interrupted copy
    (tmp_path/'model_index.json').write_text(index[:len(index) // 2])
    for t5 in (True, False):
        with pytest.raises(ValueError, match=r'model_index.json: not readable as JSON \(.*\); the folder is '
                                             r'damaged or incomplete') as e:
            SD3Policy.from_pretrained(tmp_path, device='cpu', t5=t5)
        assert '\n' not in str(e.value) and 'T5' not in str(e.value)
    (tmp_path/'model_index.json').write_text('[1, 2]')
    with pytest.raises(ValueError, match=r'not a diffusers model index \(a JSON object with _class_name\)'):
        SD3Policy.from_pretrained(tmp_path, device='cpu')


def test_from_pretrained_local_folder(policy, tmp_path):
    policy.pipe.save_pretrained(tmp_path)  # the tiny pipeline has no T5
    with pytest.raises(ValueError, match='has no text_encoder_3 \\(T5\\): pass t5=False'):
        SD3Policy.from_pretrained(tmp_path, device='cpu')
    loaded = SD3Policy.from_pretrained(tmp_path, dtype=torch.bfloat16, device='cpu', t5=False, resolution=32,
                                       max_sequence_length=8)
    assert loaded.dtype == torch.bfloat16 and loaded.pipe.vae.dtype == torch.float32
    assert loaded.pipe.text_encoder.dtype == torch.bfloat16
    same = SD3Policy.from_pretrained(tmp_path, dtype=torch.float32, device='cpu', t5=False, resolution=32,
                                     max_sequence_length=8)
    x, t = xt(policy)
    with torch.no_grad():
        assert torch.equal(same.velocity(x, t, same.encode(PROMPTS), 4.5),
                           policy.velocity(x, t, policy.encode(PROMPTS), 4.5))


# ---- LoRA

def test_lora_zero_init_and_disable(make_sd3):
    pol = make_sd3()
    x, t = xt(pol)
    cond = pol.encode(PROMPTS)
    with torch.no_grad(): base = pol.velocity(x, t, cond, 4.5)
    pol.add_lora(rank=4, alpha=8)
    names = {n for n, p in pol.transformer.named_parameters() if p.requires_grad}
    assert names and all('lora_' in n for n in names)
    hit = {n.split('.lora_')[0].split('.', 2)[-1] for n in names}  # e.g. 'attn.to_q', 'attn2.to_out.0'
    assert hit == {'attn.to_q', 'attn.to_k', 'attn.to_v', 'attn.to_out.0', 'attn.add_q_proj', 'attn.add_k_proj',
                   'attn.add_v_proj', 'attn.to_add_out', 'attn2.to_q', 'attn2.to_k', 'attn2.to_v', 'attn2.to_out.0'}
    assert all(not p.requires_grad for n, p in pol.module.named_parameters() if 'lora_' not in n)
    with torch.no_grad():
        assert torch.equal(pol.velocity(x, t, cond, 4.5), base)  # zero-init B: the base output exactly
        for p in pol.trainable_parameters(): p.add_(0.1 * torch.randn_like(p))
        moved = pol.velocity(x, t, cond, 4.5)
        with pol.disable_adapter(): assert torch.equal(pol.velocity(x, t, cond, 4.5), base)
    assert (moved - base).abs().max() > 1e-3


def test_user_round_trip_from_the_folder(tmp_path):
    """As a user writes it: the pipeline from its folder, the run's LoRA with load_lora_weights; it changes the image,
    disable_lora restores it exactly."""
    from diffusers import StableDiffusion3Pipeline
    from flowgrpo_nb.sd3 import tiny_sd3_pipeline
    trained = SD3Policy(tiny_sd3_pipeline(), resolution=32, max_sequence_length=8).add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for p in trained.trainable_parameters(): p.add_(0.1 * torch.randn_like(p))
    trained.save_lora(tmp_path/'ckpt')
    tiny_sd3_pipeline().save_pretrained(tmp_path/'sd3')
    with pytest.raises(ValueError, match='text_encoder_3'):  # the tiny folder has no T5: diffusers must be told
        StableDiffusion3Pipeline.from_pretrained(tmp_path/'sd3')
    pipe = StableDiffusion3Pipeline.from_pretrained(tmp_path/'sd3', text_encoder_3=None, tokenizer_3=None)
    draw = lambda: pipe(PROMPTS[0], num_inference_steps=3, height=32, width=32, max_sequence_length=8,
                        generator=torch.Generator().manual_seed(0), output_type='pt').images
    base = draw()
    pipe.load_lora_weights(tmp_path/'ckpt')
    assert (draw() - base).abs().max() > 1e-3, 'the LoRA changes the image'
    pipe.disable_lora()
    assert torch.equal(draw(), base), 'disable_lora gives back the base image exactly'


# adapter dtype, save/load and gradient checkpointing: tests/test_diffusers_policy.py (shared with the other backend)


# ---- a CLIP reward on the policy's images

def test_tiny_clip_reward(policy, clip):
    x, _ = xt(policy, 4)
    images, prompts = policy.decode(x), PROMPTS * 2
    r = clip(images, prompts)
    assert r.shape == (4,) and r.dtype == torch.float32 and torch.isfinite(r).all()
    inputs = clip.processor(text=prompts, images=[im for im in (images * 255).round().to(torch.uint8)], padding=True,
                            return_tensors='pt')
    with torch.no_grad():
        torch.testing.assert_close(r, clip.model(**inputs).logits_per_image.diag(), atol=1e-4, rtol=1e-4)
    mix = WeightedSum({'clip': clip, 'bright': lambda im, p: im.mean((1, 2, 3))}, {'clip': 0.5, 'bright': 2.0})
    torch.testing.assert_close(mix(images, prompts), 0.5 * r + 2 * images.mean((1, 2, 3)))
    bad = images.clone(); bad[2] = float('nan')
    with pytest.raises(ValueError, match=r"images has NaN or infinite values for sample 2 \(prompt 'a red apple'\)"):
        clip(bad, prompts)


# ---- the round trip through rollout and credit

def test_rollout_values_and_credit_on_sd3(policy, clip):
    from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
    from flowgrpo_nb.credit import credit_flow_grpo, credit_stepwise, credit_dense, credit_turning_point
    cfg = RolloutConfig(K=4, shift=policy.shift, guidance=4.5, group_size=3)
    ro = rollout(policy, PROMPTS, cfg, clip, torch.Generator().manual_seed(0))
    assert ro.x.shape == (6, 5, 4, 16, 16) and ro.images.shape == (6, 3, 32, 32) and ro.reward.shape == (6,)
    assert torch.isfinite(ro.log_prob).all() and (ro.std[:, :-1] > 0).all()
    values = {op: step_values(policy, ro, op, clip) for op in ('tweedie', 'ode:2', 'ode:rest')}
    for op, sv in values.items():
        assert sv.V.shape == (6, 5) and torch.isfinite(sv.V).all(), op
        torch.testing.assert_close(sv.V[:, -1], ro.reward)
    credits = dict(flow_grpo=credit_flow_grpo(values['ode:rest'].V, ro.group, ro.trained).advantages,
                   stepwise=credit_stepwise(values['tweedie'].V, ro.group, ro.trained).advantages,
                   dense=credit_dense(values['ode:rest'].V, ro.group, ro.trained).advantages,
                   turning_point=credit_turning_point(values['ode:rest'].V, ro.group, ro.trained).advantages)
    for name, A in credits.items():
        assert A.shape == (6, 4) and torch.isfinite(A).all(), name
        assert (A[:, ~ro.trained.cpu()] == 0).all(), name


# ---- one full GRPO step per method

@pytest.mark.parametrize('method', ['flow_grpo', 'stepwise', 'dense', 'turning_point', 'tempflow', 'flash'])
def test_grpo_step_on_sd3(method, clip, tmp_path, make_sd3):
    from flowgrpo_nb.train import GRPOConfig, GRPOTrainer
    from flowgrpo_nb.task import Task
    pol = make_sd3()
    cfg = GRPOConfig(method=method, K=3, shift=pol.shift, guidance=4.5, prompts_per_step=2, group_size=2, minibatch=2,
                     lora_rank=4, lora_alpha=8, steps=1, eval_every=0, save_every=0, log_with='none')
    trainer = GRPOTrainer(cfg, tmp_path / method, policy=pol, task=Task('clip', PROMPTS, PROMPTS, clip), progress=False)
    before = [p.detach().clone() for p in pol.trainable_parameters()]
    m = trainer.train_step()
    # NFE per sample: K; TempFlow's per seed, its trunk and 6 branches at steps 0, 1: (2 + 6 x (2 + 1)) = 20
    assert math.isfinite(m['loss']) and m['nfe_rollout'] == (20 if method == 'tempflow' else 3)
    assert (m['nfe_lookahead'] > 0) == (method in ('dense', 'turning_point'))  # stepwise: Tweedie, 0 NFE
    assert any(not torch.equal(a, b) for a, b in zip(before, pol.trainable_parameters()))


# ---- the GPU benchmark cannot rot: its --tiny mode runs here on the CPU

def test_gpu_bench_tiny(tmp_path):
    spec = importlib.util.spec_from_file_location('gpu_bench', ROOT / 'benchmarks' / 'gpu_bench.py')
    bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
    res = bench.main(['--tiny', '--out', str(tmp_path / 'bench.json')])
    assert (tmp_path / 'bench.json').is_file()
    f = res['forward']
    assert f['tflop_per_forward'] > 0 and f['tflops'] > 0 and 0 < f['fraction_of_peak']
    assert res['rollout'].get('images_per_s', 0) > 0 and set(res['lookahead']) == {'tweedie', 'ode:5', 'ode:rest'}
    for m, d in res['train'].items(): assert 'seconds' in d, (m, d)
    assert 'TFLOP/s' in bench.summary(res)


def test_gpu_bench_sd35_sized_pipeline_on_meta():
    "The benchmark's full-size pipeline, built on the meta device: SD3.5 Medium's shapes, no memory, no GPU."
    spec = importlib.util.spec_from_file_location('gpu_bench', ROOT / 'benchmarks' / 'gpu_bench.py')
    bench = importlib.util.module_from_spec(spec); spec.loader.exec_module(bench)
    pol = SD3Policy(bench.sd35_sized_pipeline('meta', torch.bfloat16), resolution=512, max_sequence_length=256)
    assert sum(p.numel() for p in pol.transformer.parameters()) == 2_243_171_520 and pol.latent_shape == (16, 64, 64)
    cond = pol.encode(PROMPTS)
    assert cond.embeds.shape == (2, 77 + 256, 4096) and cond.pooled.shape == (2, 2048)
    from torch.utils.flop_counter import FlopCounterMode
    with torch.no_grad(), FlopCounterMode(display=False) as fc:
        v = pol.velocity(torch.empty(2, 16, 64, 64, device='meta'), torch.tensor([1.0, 0.5]), cond, 4.5)
    assert v.shape == (2, 16, 64, 64) and v.dtype == torch.float32
    assert 4.8e12 < fc.get_total_flops() / 2 < 5.0e12  # FLOPs of one guided NFE at 512 px


@pytest.mark.parametrize('model, reward, name, beta', [('sd3', 'clip:/c', 'sd35m_geneval', 0.04),
                                                       ('sd3', 'pickscore:/p', 'sd35m_pickscore', 0.01),
                                                       ('flux', 'clip:/c', 'flux_pickscore', 0.0)])
def test_diffusers_backends_default_to_the_published_recipe(model, reward, name, beta):
    """A config for SD3/FLUX starts from Flow-GRPO's released recipe; presets then --set replace it; the tiny model's is
    as it was."""
    from flowgrpo_nb.config import GRPOConfig, PRESETS, preset_config
    task = dict(model=model, model_path='/m', reward=reward, prompts='/p.txt')
    cfg = preset_config('flow_grpo', **task)
    K, rank, alpha, guidance, level = (10, 32, 64.0, 4.5, 0.7) if model == 'sd3' else (6, 64, 128.0, 3.5, 0.9)
    assert (cfg.recipe, cfg.lr, cfg.beta, cfg.group_size, cfg.prompts_per_step, cfg.K, cfg.lora_rank,
            cfg.lora_alpha) == (name, 3e-4, beta, 24, 48, K, rank, alpha)
    assert (cfg.guidance, cfg.level, cfg.resolution, cfg.ema, cfg.updates_per_rollout, cfg.clip_range) == (
        guidance, level, 512, True, 2, 1e-4)
    assert (preset_config('flow_grpo+smoke', **task, lr=5e-5).lr == 5e-5
            and preset_config('flow_grpo+smoke', **task).K == 4)
    assert preset_config('flow_grpo', **task, recipe='tiny') == GRPOConfig(**PRESETS['flow_grpo'], **task)
    tiny = preset_config('flow_grpo')
    assert (tiny.recipe, tiny.lr, tiny.beta, tiny.prompts_per_step, tiny.group_size, tiny.lora_rank, tiny.level) == (
        'tiny', 1e-3, 0.0, 4, 8, 16, 0.7)
