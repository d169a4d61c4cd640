#!/usr/bin/env python
"""A memory and time MODEL (not a measurement) of GRPO on SD3.5 Medium on one GPU, from counts taken on the meta device.

Counted here, without memory or a GPU (the model is built on torch's meta device, so every shape is SD3.5 Medium's):
- FLOPs of one guided (CFG) transformer evaluation at `--resolution` (torch's FlopCounterMode), of the forward and
  backward of one guided (sample, step) pair with the LoRA adapter, with and without gradient checkpointing, and of one
  VAE decode;
- bytes the autograd graph saves for the backward of one pair (saved-tensor hooks), with and without gradient
  checkpointing, and of the largest block (recomputed one at a time under checkpointing); attention is counted as a
  fused kernel does it (q, k, v, output and one log-sum-exp per row saved; no attention matrix), as on a GPU;
- parameters of the transformer, the adapter, the VAE and SD3.5's three text encoders (CLIP-L, OpenCLIP bigG, T5-XXL
  encoder, from their published configs).

The model turns them into seconds with a model FLOP utilisation (MFU) taken from published anchors (the range
`--mfu`, default 0.22-0.33: verl-omni's reported MFU for Qwen-Image RL training on H200s) and a dense bf16 peak
(`--peak`, default 989 TFLOP/s: H200 SXM); the UniRL anchor (about 1.7 images/s per H20 for SD3.5-M rollouts) is
turned into the MFU it implies at this model's settings, as a cross-check. Phases: rollout (B x K guided NFE and B
decodes), step values (the package's `lookahead_nfe` and one decode per valued state), update (every (sample, trained
step) pair forward and backward), per method with the package's presets at `--K`, P x G = 1 x `--group`.

    python benchmarks/sd35_model.py --out results/sd35_real/gpu_model.json   # about two minutes on a CPU
"""
from __future__ import annotations
import argparse, contextlib, importlib.util, json, sys, time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))

from torch.utils.flop_counter import FlopCounterMode
from flowgrpo_nb.sd3 import SD3Policy

METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point')
ANCHORS = dict(
    verl_omni=dict(what="verl-omni: MFU 0.22-0.33 for Qwen-Image RL training on H200 (as the issue cites it)",
                   mfu=(0.22, 0.33)),
    unirl=dict(what="UniRL: about 1.7 images/s per H20 for SD3.5-M rollouts (as the issue cites it)", images_per_s=1.7,
               h20_peak_tflops=148.0))
H200 = dict(name='H200 SXM', peak_tflops=989.0, memory_gb=141.0)
GIB = 2**30


def _bench():
    spec = importlib.util.spec_from_file_location('gpu_bench', ROOT/'benchmarks'/'gpu_bench.py')
    m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
    return m


class _FusedAttention(torch.autograd.Function):
    """Attention as a fused (flash) kernel keeps it for the backward: q, k, v, the output and a log-sum-exp per query
    row."""
    @staticmethod
    def forward(ctx, q, k, v):
        with torch.no_grad(): out = _SDPA(q, k, v)
        lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        return out
    @staticmethod
    def backward(ctx, g):
        q, k, v, _, _ = ctx.saved_tensors
        with torch.enable_grad():
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            return torch.autograd.grad(_SDPA(q, k, v), (q, k, v), g)

_SDPA = F.scaled_dot_product_attention

@contextlib.contextmanager
def fused_attention():
    """Inside the block diffusers' attention (F.scaled_dot_product_attention, no mask, no dropout) runs as
    `_FusedAttention`."""
    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, **kw):
        assert attn_mask is None and not dropout_p and not is_causal and not kw
        return _FusedAttention.apply(q, k, v)
    F.scaled_dot_product_attention = sdpa
    try: yield
    finally: F.scaled_dot_product_attention = _SDPA


class Saved:
    "Bytes the autograd graph saves inside the block (frozen weights excluded), per transformer block too."
    def __init__(self, model:nn.Module):
        self.shapes = {(tuple(p.shape), p.dtype) for p in model.parameters() if not p.requires_grad}
        self.blocks = list(model.transformer_blocks)
        self.total, self.per_block, self._cur = 0, [0] * len(self.blocks), None
    def _pack(self, t):
        # not a frozen weight
        if not (t.grad_fn is None and not t.requires_grad and (tuple(t.shape), t.dtype) in self.shapes):
            n = t.numel() * t.element_size()
            self.total += n
            if self._cur is not None: self.per_block[self._cur] += n
        return t
    def __enter__(self):
        self._hooks = [b.register_forward_pre_hook(lambda m, a, i=i: setattr(self, '_cur', i))
                       for i, b in enumerate(self.blocks)]
        self._hooks += [b.register_forward_hook(lambda m, a, o: setattr(self, '_cur', None)) for b in self.blocks]
        self._saved = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t); self._saved.__enter__()
        return self
    def __exit__(self, *a):
        self._saved.__exit__(*a)
        for h in self._hooks: h.remove()


def working_set(module:nn.Module, run) -> int:
    """Largest input + output bytes of any leaf module during `run()` (no gradient): a floor on an inference pass's
    transient memory."""
    best = [0]
    def hook(m, args, out):
        ts = [a for a in args if isinstance(a, torch.Tensor)] + ([out] if isinstance(out, torch.Tensor) else [])
        best[0] = max(best[0], sum(t.numel() * t.element_size() for t in ts))
    hooks = [m.register_forward_hook(hook) for m in module.modules() if not list(m.children())]
    try:
        with torch.no_grad(): run()
    finally:
        for h in hooks: h.remove()
    return best[0]


def text_encoder_params() -> dict:
    "Parameters of SD3.5's text encoders, from their published configs, counted on the meta device."
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection, T5Config, T5EncoderModel
    with torch.device('meta'):
        clip_l = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=768, intermediate_size=3072,
                                                            num_attention_heads=12, num_hidden_layers=12,
                                                            projection_dim=768, vocab_size=49408))
        clip_g = CLIPTextModelWithProjection(CLIPTextConfig(hidden_size=1280, intermediate_size=5120,
                                                            num_attention_heads=20, num_hidden_layers=32,
                                                            projection_dim=1280, vocab_size=49408, hidden_act='gelu'))
        t5 = T5EncoderModel(T5Config(d_model=4096, d_ff=10240, d_kv=64, num_heads=64, num_layers=24, vocab_size=32128,
                                     feed_forward_proj='gated-gelu'))
    n = lambda m: sum(p.numel() for p in m.parameters())
    return dict(clip_l=n(clip_l), clip_g=n(clip_g), t5_xxl_encoder=n(t5))


def count(resolution:int=512, t5_tokens:int=256, clip_tokens:int=77, lora_rank:int=32) -> dict:
    "Every count the model needs, on SD3.5 Medium's shapes (meta device, bf16 transformer, fp32 VAE and adapter)."
    bench = _bench()
    pipe = bench.sd35_sized_pipeline('meta', torch.bfloat16, 24, clip_tokens)
    pol = SD3Policy(pipe, resolution=resolution, max_sequence_length=t5_tokens)
    cond, x, t = pol.encode(['a cat']), torch.empty(1, *pol.latent_shape, device='meta'), torch.tensor([0.5])
    out = dict(resolution=resolution, text_tokens=clip_tokens + t5_tokens, image_tokens=(resolution // 16) ** 2,
               transformer_params=sum(p.numel() for p in pol.transformer.parameters()),
               vae_params=sum(p.numel() for p in pipe.vae.parameters()), text_encoder_params=text_encoder_params())
    with fused_attention():
        with torch.no_grad(), FlopCounterMode(display=False) as fc: pol.velocity(x, t, cond, 4.5)
        out['flop_per_guided_nfe'] = fc.get_total_flops()
        with FlopCounterMode(display=False) as fc: pol.decode(x)
        out['flop_per_decode'] = fc.get_total_flops()
        out['transformer_row_working_set_bytes'] = working_set(
            pol.transformer, lambda: pol._velocity(x.to(pol.dtype), t.to(x.device), cond.embeds, cond.pooled))
        out['vae_image_working_set_bytes'] = working_set(pipe.vae, lambda: pol.decode(x))
        pol.add_lora(lora_rank, 2.0 * lora_rank)
        out['lora_params'] = sum(p.numel() for p in pol.trainable_parameters())
        for gc in (False, True):
            if gc: pipe.transformer.enable_gradient_checkpointing()
            with FlopCounterMode(display=False) as fc:
                # what the forward keeps
                with Saved(pol.transformer) as s: loss = pol.velocity(x, t, cond, 4.5).pow(2).mean()
                loss.backward()
            key = 'gc' if gc else 'no_gc'
            out[f'flop_per_guided_pair_fwd_bwd_{key}'] = fc.get_total_flops()
            out[f'saved_bytes_per_pair_{key}'] = s.total
            if not gc: out['largest_block_saved_bytes_per_pair'] = max(s.per_block)
    return out


def method_model(c:dict, method:str, K:int, G:int, P:int, minibatch:int, gc:bool, mfu:float, peak:float,
                 memory_gb:float, decode_batch:int=8, t5:bool=True) -> dict:
    "Seconds per phase, images/s and peak bytes of one training step of `method` on one GPU: a model."
    from flowgrpo_nb.config import preset_config
    from flowgrpo_nb.rollout import lookahead_nfe
    cfg = preset_config(method, K=K, group_size=G, prompts_per_step=P, minibatch=minibatch, calibrate=False)
    B, rate = P * G, mfu * peak * 1e12
    loss_steps, (s, e) = int(cfg.loss_steps().sum()), cfg.window
    la = 0.0 if cfg.lookahead is None else lookahead_nfe(cfg.lookahead, K, (s, e), G, cfg.shared_noise)
    # one decode per valued state (shared noise makes a few coincide)
    valued = 0 if cfg.lookahead is None else B * (e - s)
    fb = c[f"flop_per_guided_pair_fwd_bwd_{'gc' if gc else 'no_gc'}"]
    sec = dict(rollout=(B * K * c['flop_per_guided_nfe'] + B * c['flop_per_decode']) / rate,
               values=(B * la * c['flop_per_guided_nfe'] + valued * c['flop_per_decode']) / rate,
               update=B * loss_steps * fb / rate)
    te = c['text_encoder_params']
    weights = 2 * (c['transformer_params'] + te['clip_l'] + te['clip_g']
                   + (te['t5_xxl_encoder'] if t5 else 0)) + 4 * c['vae_params']
    # fp32 weights, gradient, two Adam moments, EMA shadow, the update's copy for update_norm
    adapter = 6 * 4 * c['lora_params']
    pairs = minibatch * loss_steps      # one backward pass holds a minibatch's pairs (all its trained steps)
    train_act = (pairs * (c['saved_bytes_per_pair_gc'] + c['largest_block_saved_bytes_per_pair']) if gc
                 else pairs * c['saved_bytes_per_pair_no_gc'])
    # ode completions: every valued state in one batched call
    value_rows = 2 * (B * (e - s) if cfg.lookahead and cfg.lookahead != 'tweedie' else B)
    infer = value_rows * c['transformer_row_working_set_bytes']
    decode = decode_batch * c['vae_image_working_set_bytes']
    peak_bytes = weights + adapter + max(train_act, infer, decode)
    return dict(method=method, lookahead=cfg.lookahead, B=B, K=K, loss_steps=loss_steps, window=[s, e],
                nfe_rollout=B * K, nfe_values=B * la, decodes=B + valued, pairs=B * loss_steps,
                pairs_per_backward=pairs, seconds=sec, seconds_step=sum(sec.values()),
                rollout_images_per_s=B / sec['rollout'],
                memory=dict(weights=weights, adapter=adapter, train_activations=train_act, inference_transient=infer,
                            decode_transient=decode, peak=peak_bytes, fits=peak_bytes <= memory_gb * 1e9))


def largest_minibatch(c, method, K, G, P, gc, memory_gb) -> int:
    "The largest minibatch that divides each update's share and fits (0: not even 1)."
    share = P * G // 2
    ok = [m for m in range(1, share + 1) if share % m == 0 and
          method_model(c, method, K, G, P, m, gc, 0.3, 1.0, memory_gb)['memory']['fits']]
    return max(ok, default=0)


def model(c:dict, K:int=10, G:int=24, P:int=1, mfu=(0.22, 0.33), peak:float=H200['peak_tflops'],
          memory_gb:float=H200['memory_gb']) -> dict:
    """The model's table: per method and MFU, seconds per phase and step, rollout images/s; peak memory with and without
    checkpointing."""
    rows = {}
    for m in METHODS:
        rows[m] = dict(time={f'{u:.2f}': method_model(c, m, K, G, P, 1, True, u, peak, memory_gb) for u in mfu},
                       memory={('gc' if gc else 'no_gc'):
                               method_model(c, m, K, G, P, 1, gc, mfu[0], peak, memory_gb)['memory']
                               for gc in (True, False)},
                       largest_minibatch={('gc' if gc else 'no_gc'): largest_minibatch(c, m, K, G, P, gc, memory_gb)
                                          for gc in (True, False)})
    u = ANCHORS['unirl']
    flop_image = K * c['flop_per_guided_nfe'] + c['flop_per_decode']
    implied = u['images_per_s'] * flop_image / (u['h20_peak_tflops'] * 1e12)
    return dict(gpu=H200 | dict(peak_tflops=peak, memory_gb=memory_gb), K=K, G=G, P=P, minibatch=1, mfu=list(mfu),
                anchors=ANCHORS, unirl_implied_mfu=implied, flop_per_image=flop_image,
                h200_images_per_s_at_unirl_mfu=implied * peak * 1e12 / flop_image, methods=rows)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--resolution', type=int, default=512)
    p.add_argument('--K', type=int, default=10)
    p.add_argument('--group', type=int, default=24, help='G (one prompt per step)')
    p.add_argument('--lora-rank', type=int, default=32)
    p.add_argument('--mfu', type=float, nargs=2, default=[0.22, 0.33])
    p.add_argument('--peak', type=float, default=H200['peak_tflops'], help='dense bf16 TFLOP/s of the GPU')
    p.add_argument('--memory-gb', type=float, default=H200['memory_gb'])
    p.add_argument('--out', default=None)
    a = p.parse_args(argv)
    if a.group < 2 or a.group % 2: p.error(f'--group={a.group}: an even number >= 2 (two updates per batch)')
    return a


def main(argv=None) -> dict:
    a, t0 = parse(argv), time.perf_counter()
    c = count(a.resolution, lora_rank=a.lora_rank)
    res = dict(note='A MODEL, not a measurement: counts on the meta device times assumed MFU.', counts=c,
               model=model(c, a.K, a.group, 1, tuple(a.mfu), a.peak, a.memory_gb),
               seconds_to_count=time.perf_counter() - t0)
    text = json.dumps(res, indent=1) + '\n'
    if a.out: Path(a.out).write_text(text)
    else: print(text)
    return res


if __name__ == '__main__': main()
