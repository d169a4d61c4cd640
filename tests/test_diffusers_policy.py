"What SD3Policy and FluxPolicy share through DiffusersPolicy (flowgrpo_nb.sd3), checked on both tiny random pipelines."
from operator import attrgetter

import pytest
import torch
from safetensors import safe_open

from flowgrpo_nb.flux import FluxPolicy, tiny_flux_pipeline
from flowgrpo_nb.sd3 import SD3Policy, tiny_sd3_pipeline

torch.set_num_threads(1)
PROMPTS = ['a red apple', 'two cats on a sofa']

# backend: (policy from a pipeline of a dtype, guidance, LoRA'd projections, a frozen weight of the transformer)
BACKENDS = {
    'sd3': (lambda dtype=torch.float32, **kw: SD3Policy(tiny_sd3_pipeline(dtype=dtype), resolution=32, max_sequence_length=8, **kw),
            4.5, 19, 'pos_embed.proj.weight'),
    'flux': (lambda dtype=torch.float32, **kw: FluxPolicy(tiny_flux_pipeline(dtype=dtype), resolution=32, max_sequence_length=16, **kw),
             3.5, 8 + 3, 'x_embedder.weight'),  # 8 projections in the double block, to_q/k/v in the single one
}


def xt(policy, n=2, seed=0):
    return policy.noise(n, torch.Generator().manual_seed(seed)), torch.linspace(1.0, 0.2, n)


def moved_adapter(make, **kw):
    pol = make(**kw).add_lora(rank=4, alpha=8)
    with torch.no_grad():
        for p in pol.trainable_parameters(): p.add_(0.1 * torch.randn_like(p))
    return pol


@pytest.mark.parametrize('backend', BACKENDS)
def test_lora_bf16_adapter_is_fp32(backend):
    make, g, _, frozen = BACKENDS[backend]
    pol = make(torch.bfloat16).add_lora(rank=4, alpha=8)
    assert {p.dtype for p in pol.trainable_parameters()} == {torch.float32}
    assert attrgetter(frozen)(pol.transformer).dtype == torch.bfloat16
    x, t = xt(pol)
    with torch.no_grad(): v = pol.velocity(x, t, pol.encode(PROMPTS), g)
    assert v.dtype == torch.float32 and torch.isfinite(v).all()


@pytest.mark.parametrize('backend', BACKENDS)
def test_lora_save_load_safetensors(backend, tmp_path):
    make, g, n_proj, _ = BACKENDS[backend]
    pol = moved_adapter(make)
    x, t = xt(pol)
    with torch.no_grad(): v = pol.velocity(x, t, pol.encode(PROMPTS), g)
    pol.save_lora(tmp_path)
    files = list(tmp_path.iterdir())
    assert [f.suffix for f in files] == ['.safetensors']
    with safe_open(str(files[0]), 'pt') as fh: assert len(list(fh.keys())) == 2 * n_proj  # A and B of each projection
    fresh = make().load_lora(tmp_path)
    with torch.no_grad(): torch.testing.assert_close(fresh.velocity(x, t, fresh.encode(PROMPTS), g), v, atol=0, rtol=0)


@pytest.mark.parametrize('backend', BACKENDS)
def test_gradient_checkpointing_same_grads(backend):
    make, g, _, _ = BACKENDS[backend]
    grads = []
    for ckpt in (False, True):
        torch.manual_seed(1)
        pol = moved_adapter(make, gradient_checkpointing=ckpt)
        x, t = xt(pol)
        pol.velocity(x, t, pol.encode(PROMPTS), g).square().mean().backward()
        grads.append([p.grad for p in pol.trainable_parameters()])
    for a, b in zip(*grads): torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
