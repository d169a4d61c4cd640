"""SD3.5 Medium's attention layout at a few layers: dual attention (attn2) in the first blocks, RMS q/k norm, head dim
64, the context-pre-only last block, bf16 weights with an fp32 adapter and gradient checkpointing; one GRPO step of
every method on the CPU."""
import math

import pytest
import torch
from torch import nn

from flowgrpo_nb.sd3 import SD3Policy, char_tokenizer

torch.set_num_threads(1)
METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point')
PROMPTS = ['a red apple', 'two cats on a sofa']
# SD3.5 Medium: 24 blocks, attn2 in blocks 0-12; here 3 blocks, attn2 in 0-1, the last context-pre-only
LAYERS, DUAL = 3, (0, 1)


def sd35_layout_pipeline(dtype=torch.bfloat16, seed=0):
    """SD3.5 Medium's transformer layout (dual attention, rms_norm q/k, head dim 64, 16 latent channels) at 3 blocks of
    2 heads; an 8x VAE."""
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel,
                           StableDiffusion3Pipeline)
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection
    tok = char_tokenizer(16)
    n = len(tok.get_vocab())
    text = CLIPTextConfig(vocab_size=n, bos_token_id=n - 2, eos_token_id=n - 1, pad_token_id=n - 1,
                          max_position_embeddings=16, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                          num_hidden_layers=1, projection_dim=32)
    torch.manual_seed(seed)
    transformer = SD3Transformer2DModel(sample_size=8, patch_size=2, in_channels=16, out_channels=16, num_layers=LAYERS,
                                        attention_head_dim=64, num_attention_heads=2, joint_attention_dim=64,
                                        caption_projection_dim=128, pooled_projection_dim=64, pos_embed_max_size=16,
                                        dual_attention_layers=DUAL, qk_norm='rms_norm')
    vae = AutoencoderKL(in_channels=3, out_channels=3, down_block_types=('DownEncoderBlock2D',) * 4,
                        up_block_types=('UpDecoderBlock2D',) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
                        latent_channels=16, norm_num_groups=4, use_quant_conv=False, use_post_quant_conv=False,
                        scaling_factor=1.5305, shift_factor=0.0609, sample_size=64)
    pipe = StableDiffusion3Pipeline(transformer=transformer.to(dtype),
                                    scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                    vae=vae, text_encoder=CLIPTextModelWithProjection(text).to(dtype), tokenizer=tok,
                                    text_encoder_2=CLIPTextModelWithProjection(text).to(dtype), tokenizer_2=tok,
                                    text_encoder_3=None, tokenizer_3=None)
    return pipe  # the VAE stays fp32, as SD3Policy.from_pretrained keeps it


def pixel_reward(images, prompts): return images.mean((1, 2, 3))


@pytest.fixture
def policy():
    return SD3Policy(sd35_layout_pipeline(), resolution=32, max_sequence_length=8, gradient_checkpointing=True)


def test_the_layout_is_sd35_mediums(policy):
    blocks = policy.transformer.transformer_blocks
    assert [b.use_dual_attention for b in blocks] == [i in DUAL for i in range(LAYERS)]
    assert [b.context_pre_only for b in blocks] == [False] * (LAYERS - 1) + [True]
    for b in blocks:
        for a in [b.attn] + ([b.attn2] if b.use_dual_attention else []):
            assert (a.heads * 64 == a.inner_dim and type(a.norm_q).__name__ == 'RMSNorm'
                    and type(a.norm_k).__name__ == 'RMSNorm')
    assert (policy.latent_shape == (16, 4, 4) and policy.dtype == torch.bfloat16
            and policy.pipe.vae.dtype == torch.float32)


def test_lora_covers_both_attentions_of_every_block(policy):
    """Every projection of attn and attn2 gets an adapter (the last block has no to_add_out); q/k norms are not Linear:
    untouched."""
    policy.add_lora(rank=4, alpha=8)
    wrapped = {n for n, m in policy.transformer.named_modules() if hasattr(m, 'lora_A')}
    for i, b in enumerate(policy.transformer.transformer_blocks):
        want = {f'attn.{p}' for p in ('to_q', 'to_k', 'to_v', 'to_out.0', 'add_q_proj', 'add_k_proj', 'add_v_proj')}
        if not b.context_pre_only: want.add('attn.to_add_out')
        if b.use_dual_attention: want |= {f'attn2.{p}' for p in ('to_q', 'to_k', 'to_v', 'to_out.0')}
        have = {n.removeprefix(f'transformer_blocks.{i}.') for n in wrapped if n.startswith(f'transformer_blocks.{i}.')}
        assert have == want, (i, have ^ want)
    lora = [p for n, p in policy.transformer.named_parameters() if 'lora_' in n]
    assert lora and all(p.dtype == torch.float32 and p.requires_grad for p in lora)  # fp32 adapter over bf16 weights
    assert not any(p.requires_grad for n, p in policy.transformer.named_parameters() if 'norm' in n)


@pytest.mark.parametrize('method', METHODS)
def test_one_step_of_every_method(policy, method, tmp_path):
    """The default recipe (2 optimizer steps per batch, EMA, the KL diagnostic) with gradient checkpointing: finite loss
    and gradient, attn2 trained."""
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.train import GRPOTrainer
    from flowgrpo_nb.task import Task
    cfg = preset_config(method, K=3, shift=policy.shift, guidance=4.5, prompts_per_step=1, group_size=2, minibatch=1,
                        lora_rank=4, lora_alpha=8, steps=1, eval_every=0, save_every=0, log_with='none',
                        calibrate=False, diag_every=1, kl_every=1, fast=False,
                        # half of them one pair per backward graph
                        backward_pairs=1 if method in ('stepwise', 'dense') else 0)
    assert cfg.ema and cfg.updates_per_rollout == 2
    trainer = GRPOTrainer(cfg, tmp_path/method, policy=policy, task=Task('pixel', PROMPTS, PROMPTS, pixel_reward),
                          progress=False)
    attn2 = {n: p for n, p in policy.transformer.named_parameters() if '.attn2.' in n and 'lora_B' in n}
    before = {n: p.detach().clone() for n, p in attn2.items()}
    m = trainer.train_step()
    for k in ('loss', 'grad_norm', 'kl', 'update_norm', 'adapter_norm'):
        assert math.isfinite(m[k]), (k, m[k])
    assert (m['grad_norm'] > 0 and m['nfe_rollout'] == 3
            and (m['nfe_lookahead'] > 0) == (method in ('dense', 'turning_point')))
    assert any(k.startswith('grad_share_') for k in m)
    grads = [p.grad for p in attn2.values() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads), \
        'attn2 gets a gradient'
    assert any(not torch.equal(before[n], p) for n, p in attn2.items()), 'the update moves the attn2 adapter'
    assert trainer.ema is not None
