#!/usr/bin/env python
"""GPU benchmark of the SD3 backend: an SD3.5-Medium-sized pipeline with random weights, no downloads.

The transformer is diffusers' `SD3Transformer2DModel` with SD3.5 Medium's released config (24 MMDiT-X blocks, 2.5 B
parameters), the VAE has SD3.5's config, the two CLIP text encoders have SD3.5's output widths (one layer each: they
run once per prompt and are cached) and T5 is absent (`text_encoder_3=None`: the pipeline feeds 256 zero tokens, so
the transformer sees SD3.5's 77 + 256 text tokens). Weights are random: the numbers are costs, not image quality.

Measured, at 512 px in bf16 (`--dtype`), K = 10 (`--K`):
- forward: FLOPs of one guided transformer evaluation (torch's FlopCounterMode), achieved TFLOP/s and the fraction
  of `--peak` (989 TFLOP/s bf16 dense by default: H200 SXM, as sd35_model.py), peak memory;
- rollout: P x G trajectories with the flow SDE and CFG, decoded and scored (a pixel reward: reward models are not
  part of the cost), images/s, peak memory;
- lookahead: step values with 'tweedie', 'ode:5', 'ode:rest': NFE, batched calls, seconds;
- train: one full GRPO step (rollout, step values, credit, PPO update with LoRA r=32 and gradient checkpointing) of
  each method, with the trainer's own phase timings; DenseGRPO's one-off calibration is not included.

    python benchmarks/gpu_bench.py --out bench.json   # one H200: a few minutes (budget --budget-s, default 450 s)
    python benchmarks/gpu_bench.py --tiny             # the tiny random pipeline on the CPU in seconds (tests run it)

`--cpu-real` runs the same SD3.5-Medium transformer and VAE on the CPU at small sizes (default 128 px, K = 3, P x G =
1 x 2, 16 CLIP + 8 T5 tokens, 2 threads; bf16 where a matmul probe finds it faster than fp32): the guided forward, a
rollout, every step-value operator and one full training step of every method (the package's default recipe: 2
optimizer steps per batch, EMA, the KL diagnostic; LoRA r=32, gradient checkpointing), with seconds, NFE, peak resident
memory and the loss and gradient norms, written after every stage; `--layers` fewer than 24 to debug quickly:

    python benchmarks/gpu_bench.py --cpu-real --out results/sd35_real/cpu.json   # 2 vCPUs AVX-512: about half an hour
"""
from __future__ import annotations
import argparse, json, math, os, resource, subprocess, sys, tempfile, threading, time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path: sys.path.insert(0, str(ROOT))

from torch.utils.flop_counter import FlopCounterMode
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
from transformers import CLIPTextConfig, CLIPTextModelWithProjection
from flowgrpo_nb.sd3 import SD3Policy, char_tokenizer, tiny_sd3_pipeline

# stabilityai/stable-diffusion-3.5-medium: transformer/config.json and vae/config.json
SD35_MEDIUM_TRANSFORMER = dict(sample_size=128, patch_size=2, in_channels=16, out_channels=16, num_layers=24,
                               attention_head_dim=64, num_attention_heads=24, joint_attention_dim=4096,
                               caption_projection_dim=1536, pooled_projection_dim=2048, pos_embed_max_size=384,
                               dual_attention_layers=tuple(range(13)), qk_norm='rms_norm')
SD35_VAE = dict(in_channels=3, out_channels=3, down_block_types=('DownEncoderBlock2D',) * 4,
                up_block_types=('UpDecoderBlock2D',) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
                latent_channels=16, norm_num_groups=32, act_fn='silu', scaling_factor=1.5305, shift_factor=0.0609,
                use_quant_conv=False, use_post_quant_conv=False, sample_size=1024)
METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point')
PROMPTS = ['a photo of a red apple and a green cup', 'three dogs on a beach', 'a sign that says "open"',
           'a cat left of a teddy bear', 'a blue car', 'two birds above a tree', 'a yellow umbrella', 'a bench']


def sd35_layers(num_layers:int=24) -> dict:
    """SD3.5 Medium's transformer config with `num_layers` blocks; dual attention in the same share of the first blocks
    (13 of 24)."""
    dual = 13 if num_layers == 24 else max(1, round(num_layers * 13 / 24))
    return {**SD35_MEDIUM_TRANSFORMER, 'num_layers': num_layers,
            'dual_attention_layers': tuple(range(min(dual, num_layers)))}


def sd35_sized_pipeline(device, dtype, num_layers:int=24, clip_tokens:int=77) -> StableDiffusion3Pipeline:
    """SD3.5-Medium-sized pipeline with random weights (one-layer CLIPs of SD3.5's widths with `clip_tokens` positions,
    no T5)."""
    tok = char_tokenizer(clip_tokens)
    n = len(tok.get_vocab())
    def clip(width):
        return CLIPTextModelWithProjection(CLIPTextConfig(
            vocab_size=n, bos_token_id=n - 2, eos_token_id=n - 1, pad_token_id=n - 1,
            max_position_embeddings=clip_tokens, hidden_size=width, intermediate_size=4 * width,
            num_attention_heads=width // 64, num_hidden_layers=1, projection_dim=width))
    torch.manual_seed(0)
    with torch.device(device):
        transformer, vae = SD3Transformer2DModel(**sd35_layers(num_layers)), AutoencoderKL(**SD35_VAE)
        te, te2 = clip(768), clip(1280)
    pipe = StableDiffusion3Pipeline(transformer=transformer.to(dtype),
                                    scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
                                    vae=vae, text_encoder=te.to(dtype), tokenizer=tok, text_encoder_2=te2.to(dtype),
                                    tokenizer_2=tok, text_encoder_3=None, tokenizer_3=None)
    return pipe  # VAE in fp32, as SD3Policy.from_pretrained keeps it


def pixel_reward(images, prompts):
    "A cost-free reward (mean brightness): the benchmark measures the policy, not a reward model."
    return images.mean((1, 2, 3))


def sync(device):
    if torch.device(device).type == 'cuda': torch.cuda.synchronize()


def timed(fn, device, reps=1):
    sync(device); t0 = time.perf_counter()
    for _ in range(reps): out = fn()
    sync(device)
    return out, (time.perf_counter() - t0) / reps


class Memory:
    "Peak allocated memory of a stage (CUDA only)."
    def __init__(self, device): self.cuda = torch.device(device).type == 'cuda'
    def __enter__(self):
        if self.cuda: torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
        return self
    def __exit__(self, *a): self.gib = torch.cuda.max_memory_allocated() / 2**30 if self.cuda else None


def bench_forward(policy, args, cond):
    "FLOPs, time and TFLOP/s of one guided (CFG) transformer evaluation of `args.batch` samples."
    B, dev = args.batch, args.device
    x, t = policy.noise(B), torch.full((B,), 0.7)
    with torch.no_grad():
        with FlopCounterMode(display=False) as fc: policy.velocity(x, t, cond, args.guidance)
        flops = fc.get_total_flops()
        timed(lambda: policy.velocity(x, t, cond, args.guidance), dev, 1)  # warm-up
        with Memory(dev) as mem: _, sec = timed(lambda: policy.velocity(x, t, cond, args.guidance), dev, args.reps)
    tflops = flops / sec / 1e12
    return dict(samples=B, rows=2 * B, tflop_per_forward=flops / 1e12, tflop_per_nfe=flops / B / 1e12, seconds=sec,
                tflops=tflops, fraction_of_peak=tflops / args.peak, peak_gib=mem.gib)


def bench_rollout(policy, args, flop_per_nfe):
    from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
    prompts = PROMPTS[:args.prompts]
    cfg = RolloutConfig(K=args.K, shift=policy.shift, guidance=args.guidance, group_size=args.group)
    gen = lambda: torch.Generator(args.device).manual_seed(0)
    with torch.no_grad():
        with Memory(args.device) as mem:
            ro, sec = timed(lambda: rollout(policy, prompts, cfg, pixel_reward, gen()), args.device)
    res = dict(B=ro.B, K=ro.K, seconds=sec, images_per_s=ro.B / sec, nfe=ro.B * ro.K,
               tflops=flop_per_nfe * ro.B * ro.K / sec / 1e12, peak_gib=mem.gib)
    look = {}
    for op in args.ops:
        with Memory(args.device) as mem, policy.count_nfe('lookahead') as c:
            sv, s = timed(lambda: step_values(policy, ro, op, pixel_reward), args.device)
        look[op] = dict(seconds=s, nfe=c['nfe'], nfe_per_trajectory=c['nfe'] / ro.B, calls=c['calls'],
                        seconds_per_trajectory=s / ro.B, relative_to_rollout=s / sec, peak_gib=mem.gib)
    return res, look


def bench_train(pipe, args, method, warmup=False, memory=None, **overrides):
    "One GRPO step of `method` with the trainer of 06_train on a fresh LoRA adapter (after an untimed one if `warmup`)."
    from flowgrpo_nb.train import GRPOConfig, GRPOTrainer, PRESETS
    from flowgrpo_nb.task import Task
    preset = {k: v for k, v in PRESETS[method].items() if k != 'calibrate'}
    cfg = GRPOConfig(**{**preset, 'K': args.K, 'shift': float(pipe.scheduler.config.shift), 'guidance': args.guidance,
                        'prompts_per_step': args.prompts, 'group_size': args.group, 'minibatch': args.minibatch,
                        'lora_rank': args.lora_rank, 'lora_alpha': 2.0 * args.lora_rank, 'steps': 1, 'eval_every': 0,
                        'save_every': 0, 'log_with': 'none', 'calibrate': False, **overrides})
    if getattr(pipe.transformer, 'peft_config', None): pipe.transformer.unload_lora()  # the previous method's adapter
    policy = SD3Policy(pipe, resolution=args.resolution, max_sequence_length=args.max_sequence_length,
                       gradient_checkpointing=not args.tiny)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = GRPOTrainer(cfg, run_dir, policy=policy,
                              task=Task('pixel', PROMPTS[:args.prompts], PROMPTS[:args.prompts], pixel_reward),
                              progress=False)
        if warmup: trainer.train_step()  # the first backward pass and optimizer step set up kernels and the allocator
        nfe0 = dict(policy.nfe.nfe)
        with (memory or Memory)(args.device) as mem: m, sec = timed(trainer.train_step, args.device)
        nfe = {k: v - nfe0.get(k, 0) for k, v in policy.nfe.nfe.items() if v - nfe0.get(k, 0)}
    keep = ('sec_rollout', 'sec_values', 'sec_credit', 'sec_update', 'nfe_rollout', 'nfe_lookahead', 'loss')
    if memory is None:
        return dict(lookahead=cfg.lookahead, sampler=cfg.sampler, seconds=sec, peak_gib=mem.gib,
                    **{k: m[k] for k in keep if k in m})
    scalars = {k: v for k, v in m.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    return dict(lookahead=cfg.lookahead, sampler=cfg.sampler, seconds=sec, peak_rss_gib=mem.gib, nfe_by_phase=nfe,
                recipe=dict(updates_per_rollout=cfg.updates_per_rollout, minibatch=cfg.minibatch, ema=cfg.ema,
                            ema_decay=cfg.ema_decay, beta=cfg.beta, kl_every=cfg.kl_every, diag_every=cfg.diag_every,
                            clip_range=cfg.clip_range, lr=cfg.lr, lora_rank=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                            lora_targets=list(cfg.lora_targets), gradient_checkpointing=True, window=list(cfg.window)),
                metrics=scalars)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--tiny', action='store_true', help='tiny random pipeline on the CPU (seconds)')
    p.add_argument('--device', default=None, help="default: 'cuda' ('cpu' with --tiny)")
    p.add_argument('--dtype', default=None, choices=('bf16', 'fp16', 'fp32'), help="default: bf16 (fp32 with --tiny)")
    p.add_argument('--resolution', type=int, default=None, help='pixels (default 512; 32 with --tiny)')
    p.add_argument('--K', type=int, default=None, help='steps (default 10; 4 with --tiny)')
    p.add_argument('--prompts', type=int, default=2, help='P prompts per step')
    p.add_argument('--group', type=int, default=4, help='G samples per prompt')
    p.add_argument('--batch', type=int, default=8, help='samples per guided forward in the FLOP measurement')
    p.add_argument('--minibatch', type=int, default=2, help='samples per backward pass in the training step')
    p.add_argument('--lora-rank', type=int, default=32)
    p.add_argument('--guidance', type=float, default=4.5)
    p.add_argument('--max-sequence-length', type=int, default=None, help='T5 tokens (default 256; 8 with --tiny)')
    p.add_argument('--ops', nargs='*', default=['tweedie', 'ode:5', 'ode:rest'])
    p.add_argument('--methods', nargs='*', default=list(METHODS), choices=METHODS)
    p.add_argument('--reps', type=int, default=None, help='timed forwards (default 5; 1 with --tiny)')
    p.add_argument('--peak', type=float, default=989.0,
                   help='dense bf16 peak TFLOP/s of the GPU (H200 SXM: 989, as sd35_model.py)')
    p.add_argument('--budget-s', type=float, default=450.0, help='skip the remaining stages once this is spent')
    p.add_argument('--out', default=None, help='write the results as JSON here')
    a = p.parse_args(argv)
    tiny = a.tiny
    for name, big, small in (('device', 'cuda', 'cpu'), ('dtype', 'bf16', 'fp32'), ('resolution', 512, 32),
                             ('K', 10, 4), ('max_sequence_length', 256, 8), ('reps', 5, 1)):
        if getattr(a, name) is None: setattr(a, name, small if tiny else big)
    if tiny: a.prompts, a.group, a.batch = min(a.prompts, 2), min(a.group, 2), min(a.batch, 2)
    if a.group < 2: p.error(f'--group={a.group}: GRPO needs groups of >= 2 samples')
    if a.prompts > len(PROMPTS): p.error(f'--prompts={a.prompts}: at most {len(PROMPTS)}')
    a.torch_dtype = dict(bf16=torch.bfloat16, fp16=torch.float16, fp32=torch.float32)[a.dtype]
    return a


def main(argv=None) -> dict:
    args, t_start = parse(argv), time.perf_counter()
    if torch.device(args.device).type == 'cuda' and not torch.cuda.is_available():
        sys.exit('no CUDA device: run with --tiny on the CPU')
    if args.device == 'cpu' and args.tiny: torch.set_num_threads(1)
    left = lambda: args.budget_s - (time.perf_counter() - t_start)
    skipped = lambda why: dict(skipped=why)
    pipe, build_s = timed(lambda: tiny_sd3_pipeline(dtype=args.torch_dtype) if args.tiny
                          else sd35_sized_pipeline(args.device, args.torch_dtype), args.device)
    pipe.to(args.device)
    n_params = sum(p.numel() for p in pipe.transformer.parameters())
    policy = SD3Policy(pipe, resolution=args.resolution, max_sequence_length=args.max_sequence_length)
    res = dict(config=dict(tiny=args.tiny, device=str(args.device),
                           gpu=(torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != 'cpu'
                                else None),
                           dtype=args.dtype, resolution=args.resolution, K=args.K, P=args.prompts, G=args.group,
                           transformer_params=n_params, latent_shape=list(policy.latent_shape), peak_tflops=args.peak,
                           torch=torch.__version__, build_seconds=build_s))
    cond = policy.encode((PROMPTS * args.batch)[:args.batch])
    res['forward'] = bench_forward(policy, args, cond)
    res['rollout'], res['lookahead'] = (bench_rollout(policy, args, res['forward']['tflop_per_nfe'] * 1e12)
                                        if left() > 0 else (skipped('time budget spent'), {}))
    res['train'] = {m: bench_train(pipe, args, m, warmup=i == 0) if left() > 0 else skipped('time budget spent')
                    for i, m in enumerate(args.methods)}
    res['total_seconds'] = time.perf_counter() - t_start
    text = json.dumps(res, indent=1, default=str)
    if args.out: Path(args.out).write_text(text)
    print(text)
    print(summary(res))
    return res


def summary(res:dict) -> str:
    "A few lines for a human: the numbers the benchmark exists for."
    f, r, gib = (res['forward'], res['rollout'],
                 lambda d: f"{d['peak_gib']:.1f} GiB" if d.get('peak_gib') is not None else 'n/a')
    lines = [f"transformer {res['config']['transformer_params'] / 1e9:.2f} B params, {res['config']['dtype']}, "
             f"{res['config']['resolution']} px: {f['tflop_per_nfe']:.2f} TFLOP per guided NFE, {f['tflops']:.1f} "
             f"TFLOP/s = {100 * f['fraction_of_peak']:.1f}% of {res['config']['peak_tflops']:.0f}, peak {gib(f)}"]
    if 'images_per_s' in r:
        lines.append(f"rollout B={r['B']} K={r['K']}: {r['seconds']:.2f} s, {r['images_per_s']:.2f} images/s, "
                     f"peak {gib(r)}")
    for op, d in res['lookahead'].items():
        lines.append(f"lookahead {op}: {d['nfe_per_trajectory']:.0f} NFE/trajectory in {d['calls']} calls, "
                     f"{d['seconds']:.2f} s ({d['relative_to_rollout']:.2f}x the rollout)")
    for m, d in res['train'].items():
        lines.append(f"train step {m}: " + (d['skipped'] if 'skipped' in d else
                     f"{d['seconds']:.2f} s (rollout {d['sec_rollout']:.2f}, values {d['sec_values']:.2f}, update "
                     f"{d['sec_update']:.2f}), lookahead {d['nfe_lookahead']:.0f} NFE/trajectory, peak {gib(d)}"))
    return '\n'.join(lines)

# ---- --cpu-real: SD3.5 Medium's real transformer and VAE on the CPU (small images, few steps, one step of every
# method)

class RSS:
    """Peak resident memory of the process inside the block, sampled every 10 ms (gib), and the process's peak so far
    (ru_maxrss)."""
    def __init__(self, device=None): self.gib = None
    @staticmethod
    def now() -> int:
        with open('/proc/self/statm') as f: return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
    def _watch(self):
        while not self._stop.wait(0.01): self._peak = max(self._peak, self.now())
    def __enter__(self):
        self._peak, self._stop = self.now(), threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True); self._thread.start()
        return self
    def __exit__(self, *a):
        self._stop.set(); self._thread.join()
        self.gib = max(self._peak, self.now()) / 2**30
        self.process_peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def machine() -> dict:
    "What ran the benchmark: CPU model, torch's CPU capability, library versions, threads, memory."
    import diffusers, peft, transformers, platform
    try: model = next(l.split(':', 1)[1].strip()
                      for l in subprocess.run(['lscpu'], capture_output=True, text=True).stdout.splitlines()
                      if l.startswith('Model name'))
    except Exception: model = platform.processor() or 'unknown'
    mem = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    return dict(cpu=model, cpu_capability=torch.backends.cpu.get_cpu_capability(), logical_cpus=os.cpu_count(),
                ram_gib=round(mem, 1), torch=torch.__version__, diffusers=diffusers.__version__, peft=peft.__version__,
                transformers=transformers.__version__, python=platform.python_version(),
                threads=torch.get_num_threads(), mkldnn_bf16=bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()))


def matmul_probe(rows:int=256, width:int=1536, reps:int=10, give_up:float=3.0) -> dict:
    """GFLOP/s of the transformer's widest matmul ([rows, 1536] @ [1536, 6144], its MLP) in fp32 and bf16 on this
    CPU. bf16 is first tried on rows / 16 rows: where that trial is `give_up` x slower than fp32 (no native bf16
    kernels: an AVX2 CPU takes 15 s a full call), the trial is its measurement (`bf16_trial_only`), the 12 full calls
    are not made."""
    def gflops(a, b, n):
        t0 = time.perf_counter()
        for _ in range(n): a @ b
        return 2 * a.shape[0] * width * 4 * width * n / (time.perf_counter() - t0) / 1e9
    out = {}
    for name, dt in (('fp32', torch.float32), ('bf16', torch.bfloat16)):
        a, b = torch.randn(rows, width, dtype=dt), torch.randn(width, 4 * width, dtype=dt)
        if name == 'bf16':
            a16 = a[:max(1, rows // 16)]
            a16 @ b  # warm-up: oneDNN builds its kernels on the first call
            trial = gflops(a16, b, 1)
            out['bf16_trial_only'] = trial * give_up < out['fp32_gflops']
            if out['bf16_trial_only']: out['bf16_gflops'] = trial; break
        for _ in range(2): a @ b
        out[f'{name}_gflops'] = gflops(a, b, reps)
    out['bf16_speedup'] = out['bf16_gflops'] / out['fp32_gflops']
    out['chosen'] = 'bf16' if out['bf16_speedup'] > 1.2 else 'fp32'
    out['why'] = (f"bf16 matmul {out['bf16_speedup']:.1f}x fp32 on this CPU: bf16 weights" if out['chosen'] == 'bf16'
                  else f"bf16 matmul only {out['bf16_speedup']:.2f}x fp32 (not native here): fp32 weights")
    return out


def parse_cpu(argv):
    p = argparse.ArgumentParser(description='SD3.5 Medium at its real size on the CPU: forward, rollout, step values, '
                                            'one training step of every method')
    p.add_argument('--cpu-real', action='store_true')
    p.add_argument('--layers', type=int, default=24, help="transformer blocks (24: SD3.5 Medium's; fewer to debug)")
    p.add_argument('--dtype', default='auto', choices=('auto', 'bf16', 'fp32'),
                   help='auto: bf16 where the matmul probe finds it faster')
    p.add_argument('--resolution', type=int, default=128)
    p.add_argument('--K', type=int, default=3)
    p.add_argument('--prompts', type=int, default=1)
    p.add_argument('--group', type=int, default=2)
    p.add_argument('--minibatch', type=int, default=1)
    p.add_argument('--lora-rank', type=int, default=32)
    p.add_argument('--guidance', type=float, default=4.5)
    p.add_argument('--clip-tokens', type=int, default=16, help="CLIP positions (SD3.5: 77)")
    p.add_argument('--max-sequence-length', type=int, default=8, help='T5 tokens (zeros: no T5; SD3.5: 256)')
    p.add_argument('--ops', nargs='*', default=['tweedie', 'ode:2', 'ode:rest'])
    p.add_argument('--methods', nargs='*', default=list(METHODS), choices=METHODS)
    p.add_argument('--threads', type=int, default=2)
    p.add_argument('--budget-s', type=float, default=3600.0, help='skip the remaining stages once this is spent')
    p.add_argument('--out', default=None, help='write the results as JSON here (after every stage)')
    a = p.parse_args(argv)
    if a.group < 2: p.error(f'--group={a.group}: GRPO needs groups of >= 2 samples')
    if not 2 <= a.layers <= 24:
        p.error(f'--layers={a.layers}: 2 to 24 (a single block is context-pre-only: no to_add_out for the LoRA)')
    a.tiny, a.device, a.batch, a.reps, a.peak = False, 'cpu', a.prompts * a.group, 1, float('nan')
    return a


def cpu_main(argv) -> dict:
    """The --cpu-real run: every stage's seconds, NFE and peak RSS; training loss and gradient norms; JSON after each
    stage."""
    args, t_start = parse_cpu(argv), time.perf_counter()
    torch.set_num_threads(args.threads)
    res = dict(machine=machine())
    res['matmul_probe'] = probe = matmul_probe()
    args.dtype = probe['chosen'] if args.dtype == 'auto' else args.dtype
    args.torch_dtype = dict(bf16=torch.bfloat16, fp32=torch.float32)[args.dtype]
    left = lambda: args.budget_s - (time.perf_counter() - t_start)
    def save():
        res['total_seconds'] = time.perf_counter() - t_start
        if args.out: Path(args.out).write_text(json.dumps(res, indent=1, default=str) + '\n')
    with RSS() as mem:
        pipe, build_s = timed(lambda: sd35_sized_pipeline('cpu', args.torch_dtype, args.layers, args.clip_tokens),
                              'cpu')
    policy = SD3Policy(pipe, resolution=args.resolution, max_sequence_length=args.max_sequence_length)
    tcfg = pipe.transformer.config
    res['config'] = dict(layers=args.layers, dual_attention_layers=list(tcfg.dual_attention_layers),
                         qk_norm=tcfg.qk_norm, heads=tcfg.num_attention_heads, head_dim=tcfg.attention_head_dim,
                         transformer_params=sum(p.numel() for p in pipe.transformer.parameters()),
                         vae_params=sum(p.numel() for p in pipe.vae.parameters()),
                         dtype=args.dtype, vae_dtype=str(pipe.vae.dtype).removeprefix('torch.'),
                         resolution=args.resolution, latent_shape=list(policy.latent_shape), K=args.K, P=args.prompts,
                         G=args.group, minibatch=args.minibatch, lora_rank=args.lora_rank, guidance=args.guidance,
                         clip_tokens=args.clip_tokens, t5_tokens=args.max_sequence_length,
                         text_tokens=args.clip_tokens + args.max_sequence_length,
                         image_tokens=(args.resolution // 16) ** 2, ops=args.ops, threads=args.threads,
                         budget_s=args.budget_s, build_seconds=build_s, build_peak_rss_gib=mem.gib)
    save()
    cond = policy.encode((PROMPTS * args.batch)[:args.batch])
    with RSS() as mem: f = bench_forward(policy, args, cond)
    res['forward'] = ({k: v for k, v in f.items() if k not in ('fraction_of_peak', 'peak_gib')}
                      | dict(peak_rss_gib=mem.gib))
    save()
    from flowgrpo_nb.rollout import RolloutConfig, rollout, step_values
    rcfg = RolloutConfig(K=args.K, shift=policy.shift, guidance=args.guidance, group_size=args.group)
    with torch.no_grad(), RSS() as mem, policy.count_nfe('rollout') as c:
        ro, sec = timed(lambda: rollout(policy, PROMPTS[:args.prompts], rcfg, pixel_reward,
                                        torch.Generator().manual_seed(0)), 'cpu')
    res['rollout'] = dict(B=ro.B, K=ro.K, seconds=sec, images_per_s=ro.B / sec, nfe=c['nfe'], calls=c['calls'],
                          seconds_per_nfe=sec / c['nfe'], peak_rss_gib=mem.gib,
                          reward_finite=bool(torch.isfinite(ro.reward).all()))
    save()
    with RSS() as mem: images, dec_s = timed(lambda: policy.decode(ro.x[:, -1]), 'cpu')
    res['decode'] = dict(images=len(images), seconds=dec_s, peak_rss_gib=mem.gib,
                         finite=bool(torch.isfinite(images).all()))
    res['lookahead'] = {}
    for op in args.ops:
        if left() <= 0: res['lookahead'][op] = dict(skipped='time budget spent'); continue
        with RSS() as mem, policy.count_nfe('lookahead') as c:
            sv, s = timed(lambda: step_values(policy, ro, op, pixel_reward), 'cpu')
        res['lookahead'][op] = dict(seconds=s, nfe=c['nfe'], nfe_per_trajectory=c['nfe'] / ro.B, calls=c['calls'],
                                    states_valued=sv.states,
                                    relative_to_rollout=s / sec, peak_rss_gib=mem.gib,
                                    finite=bool(torch.isfinite(sv.V).all()))
        save()
    del ro
    res['train'] = {}
    for m in args.methods:
        if left() <= 0: res['train'][m] = dict(skipped='time budget spent'); save(); continue
        res['train'][m] = bench_train(pipe, args, m, memory=RSS, diag_every=0, fast=False)
        save()
    res['process_peak_rss_gib'] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30
    save()
    print(cpu_summary(res))
    return res


def cpu_summary(res:dict) -> str:
    c, f, r = res['config'], res['forward'], res['rollout']
    lines = [f"{c['layers']} blocks, {c['transformer_params'] / 1e9:.2f} B params, {c['dtype']}, {c['resolution']} px, "
             f"{c['image_tokens']} + {c['text_tokens']} tokens: guided NFE {f['tflop_per_nfe'] * 1e3:.0f} GFLOP, "
             f"{f['seconds'] / f['samples']:.1f} s",
             f"rollout B={r['B']} K={r['K']}: {r['seconds']:.1f} s, {r['nfe']} NFE, "
             f"peak RSS {r['peak_rss_gib']:.1f} GiB"]
    for op, d in res['lookahead'].items():
        lines.append(f"values {op}: "
                     + (d['skipped'] if 'skipped' in d
                        else f"{d['seconds']:.1f} s, {d['nfe']} NFE, peak RSS {d['peak_rss_gib']:.1f} GiB"))
    for m, d in res['train'].items():
        if 'skipped' in d: lines.append(f"train {m}: {d['skipped']}"); continue
        x = d['metrics']
        lines.append(f"train {m}: {d['seconds']:.0f} s (rollout {x['sec_rollout']:.0f}, values {x['sec_values']:.0f}, "
                     f"update {x['sec_update']:.0f}), loss {x.get('loss', float('nan')):.3g}, "
                     f"grad norm {x.get('grad_norm', float('nan')):.3g}, peak RSS {d['peak_rss_gib']:.1f} GiB")
    return '\n'.join(lines)


if __name__ == '__main__':
    if '--cpu-real' in sys.argv[1:]: cpu_main(sys.argv[1:])
    else: main()
