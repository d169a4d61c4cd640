"""What SD3Policy and FluxPolicy share through DiffusersPolicy and Policy, checked on both tiny random pipelines
(conftest's make_sd3, make_flux)."""
import json
from operator import attrgetter

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from flowgrpo_nb.flow import sample_trajectory
from flowgrpo_nb.flux import FluxPolicy
from flowgrpo_nb.policy import LORA_FILE, OLD_LORA_FILE

torch.set_num_threads(1)
PROMPTS = ['a red apple', 'two cats on a sofa']

# backend: (guidance, LoRA'd projections, a frozen weight of the transformer)
BACKENDS = {'sd3': (4.5, 19, 'pos_embed.proj.weight'),
            'flux': (3.5, 8 + 3, 'x_embedder.weight')}  # 8 projections in the double block, to_q/k/v in the single one


@pytest.fixture(params=list(BACKENDS))
def backend(request):
    "(policy builder, guidance, LoRA'd projections, a frozen weight) of each backend."
    return request.getfixturevalue(f'make_{request.param}'), *BACKENDS[request.param]


def xt(policy, n=2, seed=0):
    return policy.noise(n, torch.Generator().manual_seed(seed)), torch.linspace(1.0, 0.2, n)


def moved_adapter(make, **kw):
    "A policy whose adapter (rank 4, alpha 8: scale 2) has moved off its zero init, B matrices included."
    pol = make(**kw).add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for p in pol.trainable_parameters(): p.add_(0.1 * torch.randn_like(p))
    assert all(p.abs().min() > 0 for n, p in pol.transformer.named_parameters() if 'lora_B' in n)
    return pol


def policy_images(pol, x, g, K=3):
    "The package's ODE rollout on the policy's schedule, decoded."
    cond = pol.encode(PROMPTS)
    with torch.no_grad():
        z = sample_trajectory(lambda x, t: pol.velocity(x, t, cond, g), x, pol.sigmas(K, getattr(pol, 'shift', 1.0)),
                              'ode').x
    return pol.decode(z)


def pipeline_images(pipe, pol, x, g, K=3):
    "The pipeline's own sampling loop from the same initial states (FLUX takes them packed)."
    latents = pipe._pack_latents(x, len(x), *pol.latent_shape) if isinstance(pol, FluxPolicy) else x
    with torch.no_grad():
        return pipe(PROMPTS, latents=latents, num_inference_steps=K, guidance_scale=g, height=32, width=32,
                    max_sequence_length=pol.max_sequence_length, output_type='pt').images


def test_lora_bf16_adapter_is_fp32(backend):
    make, g, _, frozen = backend
    pol = make(torch.bfloat16).add_lora(rank=4, alpha=8)
    assert {p.dtype for p in pol.trainable_parameters()} == {torch.float32}
    assert attrgetter(frozen)(pol.transformer).dtype == torch.bfloat16
    x, t = xt(pol)
    with torch.no_grad(): v = pol.velocity(x, t, pol.encode(PROMPTS), g)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()


def test_saved_lora_is_diffusers_format(backend, tmp_path):
    make, g, n_proj, _ = backend
    pol = moved_adapter(make)
    pol.save_lora(tmp_path)
    assert [f.name for f in tmp_path.iterdir()] == [LORA_FILE]
    with safe_open(str(tmp_path / LORA_FILE), 'pt') as fh:
        keys, meta = set(fh.keys()), json.loads(fh.metadata()['lora_adapter_metadata'])
    assert len(keys) == 2 * n_proj and keys == {f'transformer.{k}' for k in pol.lora_state_dict()}  # A and B of each
    assert (meta['transformer.r'], meta['transformer.lora_alpha']) == (4, 8)


def test_saved_lora_loads_into_a_fresh_diffusers_pipeline(backend, tmp_path):
    """pipe.load_lora_weights(folder) on a fresh pipeline samples the policy's images, at the adapter's scale alpha / r
    = 2."""
    make, g, _, _ = backend
    pol = moved_adapter(make)
    pol.save_lora(tmp_path)
    x, _ = xt(pol)
    ours = policy_images(pol, x, g)
    pipe = make().pipe  # same seed: the same base weights, no adapter
    base = pipeline_images(pipe, pol, x, g)
    pipe.load_lora_weights(tmp_path)
    theirs = pipeline_images(pipe, pol, x, g)
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)
    assert (theirs - base).abs().max() > 1e-2  # the adapter changes the images
    # scale 1 (alpha = r, what a file without metadata gives)
    pipe.set_adapters(pipe.get_list_adapters()['transformer'], 0.5)
    assert (pipeline_images(pipe, pol, x, g) - ours).abs().max() > 1e-3


def test_lora_roundtrip_is_bitwise(backend, tmp_path):
    make, g, _, _ = backend
    pol = moved_adapter(make)
    x, t = xt(pol)
    with torch.no_grad(): v = pol.velocity(x, t, pol.encode(PROMPTS), g)
    pol.save_lora(tmp_path)
    fresh = make().load_lora(tmp_path)
    assert fresh.lora_config == dict(pol.lora_config, targets=sorted(pol.lora_config['targets']))
    mine = pol.lora_state_dict()
    assert fresh.lora_state_dict().keys() == mine.keys()
    assert all(torch.equal(v, mine[k]) for k, v in fresh.lora_state_dict().items())
    assert {p.dtype for p in fresh.trainable_parameters()} == {torch.float32}
    with torch.no_grad(): torch.testing.assert_close(fresh.velocity(x, t, fresh.encode(PROMPTS), g), v, atol=0, rtol=0)


def test_old_lora_file_still_loads(backend, tmp_path):
    "The package's earlier lora.safetensors: peft keys without prefix, the adapter's shape as `lora_config` metadata."
    make, _, _, _ = backend
    pol = moved_adapter(make)
    sd = pol.lora_state_dict()
    save_file(sd, str(tmp_path / OLD_LORA_FILE), metadata={'lora_config': json.dumps(pol.lora_config)})
    fresh = make().load_lora(tmp_path)
    assert fresh.lora_config == pol.lora_config
    assert all(torch.equal(v, sd[k]) for k, v in fresh.lora_state_dict().items())


def test_encoding_does_not_depend_on_the_batch(backend):
    make, _, _, _ = backend
    a, b = make(), make()
    sizes, encode = [], a._encode
    a._encode = lambda ps: sizes.append(len(ps)) or encode(ps)
    a.encode(['a blue car', *PROMPTS])
    c = b.encode(PROMPTS[1:])
    assert sizes == [1, 1, 1, 1]  # '' and each prompt alone
    assert torch.equal(a._cache[PROMPTS[1]][0], c.embeds[0]) and torch.equal(a._cache[PROMPTS[1]][1], c.pooled[0])


def test_gradient_checkpointing_same_grads(backend):
    make, g, _, _ = backend
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(1)
        pol = moved_adapter(make, gradient_checkpointing=ckpt)
        x, t = xt(pol)
        pol.velocity(x, t, pol.encode(PROMPTS), g).square().mean().backward()
        grads.append([p.grad for p in pol.trainable_parameters()])
    for a, b in zip(*grads): torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
