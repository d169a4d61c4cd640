#!/usr/bin/env python
"""Write benchmarks/README.md from the SD3.5-Medium files the benchmarks wrote: results/sd35_real/cpu.json
(`gpu_bench.py --cpu-real`: measured on a CPU) and results/sd35_real/gpu_model.json (`sd35_model.py`: a model).

    python benchmarks/sd35_tables.py           # rewrite benchmarks/README.md
    python benchmarks/sd35_tables.py --check   # exit 1 when the README differs from what the files give
"""
from __future__ import annotations
import argparse, json, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU, MODEL, README = (ROOT/'results'/'sd35_real'/'cpu.json', ROOT/'results'/'sd35_real'/'gpu_model.json',
                      ROOT/'benchmarks'/'README.md')
METHODS = ('flow_grpo', 'stepwise', 'dense', 'turning_point')
NO_DEVICE = ("for now this workplace lends no device machine through the draw ... do this task without one")
SCRIPTS = [('gpu_bench.py',
            'SD3.5 Medium at its released size (random weights): `--cpu-real` runs it on the CPU (the first table); '
                            'without it, on a CUDA GPU; `--tiny` in seconds (the tests run it)'),
           ('sd35_model.py', 'the GPU memory and time model (counts on the meta device times published MFU anchors)'),
           ('sd35_tables.py', 'writes this file from the two JSON files')]


def f(x, nd=1): return '-' if x is None else f'{x:,.{nd}f}'
def gib(b): return f'{b / 2**30:.1f}'
def gb(b): return f'{b / 1e9:.0f}'
def sci(x): return f'{x:.3g}'


def cpu_section(d:dict) -> list[str]:
    m, p, c = d['machine'], d['matmul_probe'], d['config']
    L = ['## SD3.5 Medium at its real size on the CPU (measured)', '',
         f"`python benchmarks/gpu_bench.py --cpu-real --layers {c['layers']} --resolution {c['resolution']} --K "
         f"{c['K']} --out results/sd35_real/cpu.json` on {m['cpu']} ({m['logical_cpus']} logical CPUs, "
         f"torch CPU capability {m['cpu_capability']}, {m['ram_gib']} GiB), {m['threads']} torch threads; "
         f"torch {m['torch']}, diffusers {m['diffusers']}, peft {m['peft']}, transformers {m['transformers']}. "
         "Random weights: the numbers are costs, not image quality.", '',
         f"- **Model**: diffusers' `SD3Transformer2DModel` with SD3.5 Medium's released config: {c['layers']} "
         f"MMDiT-X blocks, dual attention in blocks {c['dual_attention_layers'][0]}-{c['dual_attention_layers'][-1]}, "
         f"{c['heads']} heads of {c['head_dim']}, q/k norm `{c['qk_norm']}`, {c['transformer_params'] / 1e9:.2f} B "
         f"parameters; SD3.5's VAE config ({c['vae_params'] / 1e6:.0f} M, {c['vae_dtype']}); one-layer CLIPs of "
         "SD3.5's widths (768, 1280); no T5 (zeros).",
         f"- **Precision**: {c['dtype']} transformer and CLIPs, fp32 VAE and LoRA adapter. A matmul probe of "
         f"the transformer's MLP shape measured fp32 {p['fp32_gflops']:.0f} GFLOP/s and bf16 {p['bf16_gflops']:.0f} "
         f"GFLOP/s ({p['bf16_speedup']:.1f}x; torch reports native bf16 kernels: {m['mkldnn_bf16']}), "
         f"so {p['chosen']}.",
         f"- **Sizes** (small so that one method's step takes minutes): {c['resolution']} px (latent "
         f"{'x'.join(map(str, c['latent_shape']))}, {c['image_tokens']} image tokens), {c['clip_tokens']} CLIP + "
         f"{c['t5_tokens']} T5 text tokens (SD3.5: 77 + 256), K = {c['K']}, P x G = {c['P']} x {c['G']}, minibatch "
         f"{c['minibatch']}, CFG {c['guidance']}, LoRA r = {c['lora_rank']}, gradient checkpointing in training.",
         f"- Building the pipeline took {c['build_seconds']:.0f} s and {gib(c['build_peak_rss_gib'] * 2**30)} GiB peak "
         f"RSS (the weights are made in fp32, then cast). The whole run: {d['total_seconds'] / 60:.0f} min, "
         f"peak RSS of the process {d.get('process_peak_rss_gib', float('nan')):.1f} GiB.", '',
         '| stage | seconds | NFE | calls | peak RSS GiB | notes |', '|---|---:|---:|---:|---:|---|']
    fw, r, dec = d['forward'], d['rollout'], d['decode']
    L.append(f"| guided forward ({fw['samples']} samples, {fw['rows']} rows) | {f(fw['seconds'])} | {fw['samples']} | "
             f"1 | {f(fw['peak_rss_gib'])} | {fw['tflop_per_nfe'] * 1e3:.0f} GFLOP per guided NFE (FlopCounterMode), "
             f"{fw['tflops'] * 1e3:.0f} GFLOP/s |")
    L.append(f"| rollout (B = {r['B']}, K = {r['K']}, decode and reward) | {f(r['seconds'])} | "
             f"{r['nfe']} | {r['calls']} | {f(r['peak_rss_gib'])} | {r['seconds_per_nfe']:.1f} s per NFE incl. decode; "
             f"reward finite: {r['reward_finite']} |")
    L.append(f"| VAE decode of {dec['images']} images | {f(dec['seconds'])} | 0 | - | {f(dec['peak_rss_gib'])} | "
             f"finite: {dec['finite']} |")
    for op, v in d['lookahead'].items():
        if 'skipped' in v: L.append(f"| values `{op}` | - | - | - | - | {v['skipped']} |"); continue
        L.append(f"| values `{op}` | {f(v['seconds'])} | {v['nfe']} | {v['calls']} | {f(v['peak_rss_gib'])} | "
                 f"{v['states_valued']} states valued, {v['relative_to_rollout']:.2f}x the rollout; "
                 f"finite: {v['finite']} |")
    L += ['', 'One full training step of every method, with the trainer of `06_train` (`GRPOTrainer.train_step`) '
          "and the package's default recipe: "
          + recipe_line(d), '',
          '| method | values | rollout s | values s | update s | step s | step CPU s | NFE rollout / values / train | '
          'peak RSS GiB | loss | grad norm | update norm | KL (diag.) |',
          '|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|']
    for name in METHODS:
        t = d['train'].get(name)
        if t is None: continue
        if 'skipped' in t: L.append(f"| {name} | | | | | | | | | | | | {t['skipped']} |"); continue
        x, n = t['metrics'], t['nfe_by_phase']
        L.append(f"| {name} | {t['lookahead'] or 'final reward'} | {f(x['sec_rollout'])} | {f(x['sec_values'])} | "
                 f"{f(x['sec_update'])} | {f(t['seconds'])} | {f(x['cpu_step'] + x.get('cpu_diag', 0))} | "
                 f"{n.get('rollout', 0)} / {n.get('lookahead', 0)} / {n.get('train', 0)} | {f(t['peak_rss_gib'])} | "
                 f"{sci(x['loss'])} | {sci(x['grad_norm'])} | {sci(x['update_norm'])} | "
                 f"{sci(x['kl']) if 'kl' in x else '-'} |")
    L += ['', '"step s" is the whole `train_step`, the KL diagnostic included; "train" NFE are the update\'s guided '
          "evaluations and the KL diagnostic's (a forward with and one without the adapter); gradient checkpointing "
          "recomputes each block in the backward pass without being counted as NFE. The KL diagnostic runs before the "
          "update, on the zero-initialised adapter of step 0, so it is exactly 0 there.", '']
    ro = [t['metrics']['sec_rollout'] for t in d['train'].values() if 'metrics' in t]
    L += ["The two cores were shared with another long job (at nice 10) throughout: the same rollout (B = "
          f"{c['P'] * c['G']}, K = {c['K']}) took {min(ro):.0f}-{max(ro):.0f} s in the {len(ro)} steps above and "
          f"{r['seconds']:.0f} s in the rollout stage. Read the seconds as the order of magnitude on a small shared "
          "CPU and compare methods by NFE.", '']
    return L


def recipe_line(d:dict) -> str:
    t = next(v for v in d['train'].values() if 'recipe' in v)['recipe']
    return (f"{t['updates_per_rollout']} optimizer steps per rollout batch (minibatch {t['minibatch']}), "
            f"EMA of the adapter (decay {t['ema_decay']}), beta = {t['beta']} with the KL diagnostic (every "
            f"{t['kl_every']} steps: at step 0), clip range {t['clip_range']}, lr {t['lr']}, "
            f"LoRA r = {t['lora_rank']}, alpha = {t['lora_alpha']:.0f} on "
            f"{', '.join(f'`{x}`' for x in t['lora_targets'])} (in both attentions of the dual-attention blocks), "
            "gradient checkpointing. The per-step gradient-share diagnostic is off (`diag_every=0`); "
            "DenseGRPO's one-off calibration is not included.")


def model_section(d:dict) -> list[str]:
    c, m = d['counts'], d['model']
    g, lo, hi = m['gpu'], *(f'{u:.2f}' for u in m['mfu'])
    te = c['text_encoder_params']
    L = ['## One H200: a memory and time MODEL (not a measurement)', '',
         f"No device was lent to this issue (the device tool's status said: \"{NO_DEVICE}\"), "
         f"so nothing here ran on a GPU. `python benchmarks/sd35_model.py --out results/sd35_real/gpu_model.json` "
         "counts on SD3.5 Medium's real shapes on torch's meta device (no memory, no arithmetic) and turns the counts "
         "into seconds and bytes with stated assumptions:", '',
         f"- **Counted** at {c['resolution']} px ({c['image_tokens']} image + {c['text_tokens']} text tokens): "
         f"{c['flop_per_guided_nfe'] / 1e12:.2f} TFLOP per guided NFE, "
         f"{c['flop_per_guided_pair_fwd_bwd_gc'] / 1e12:.2f} TFLOP per guided (sample, step) pair forward and backward "
         f"with gradient checkpointing ({c['flop_per_guided_pair_fwd_bwd_no_gc'] / 1e12:.2f} without), "
         f"{c['flop_per_decode'] / 1e12:.2f} TFLOP per VAE decode (torch's FlopCounterMode); the backward of one pair "
         f"saves {gib(c['saved_bytes_per_pair_no_gc'])} GiB without checkpointing, {gib(c['saved_bytes_per_pair_gc'])} "
         f"GiB with it plus {gib(c['largest_block_saved_bytes_per_pair'])} GiB while one block is recomputed "
         "(saved-tensor hooks; attention counted as a fused kernel keeps it). Parameters: "
         f"transformer {c['transformer_params'] / 1e9:.2f} B (bf16), LoRA r = 32 {c['lora_params'] / 1e6:.1f} M (fp32, "
         f"x6 with gradient, Adam moments, EMA and the update's copy), VAE {c['vae_params'] / 1e6:.0f} M (fp32), "
         f"text encoders CLIP-L {te['clip_l'] / 1e6:.0f} M, bigG {te['clip_g'] / 1e6:.0f} M, T5-XXL encoder "
         f"{te['t5_xxl_encoder'] / 1e9:.2f} B (bf16, all resident).",
         f"- **Assumed**: {g['name']} at {g['peak_tflops']:.0f} dense bf16 TFLOP/s and {g['memory_gb']:.0f} GB; "
         f"every phase runs at a model FLOP utilisation of {lo}-{hi}, the range of the published anchor "
         f"{m['anchors']['verl_omni']['what']}. Cross-check, {m['anchors']['unirl']['what']}: at this model's settings "
         f"(K = {m['K']}, CFG, {c['resolution']} px, {m['flop_per_image'] / 1e12:.1f} TFLOP per image) that is an MFU "
         f"of {m['unirl_implied_mfu']:.2f} on an H20 ({m['anchors']['unirl']['h20_peak_tflops']:.0f} TFLOP/s), "
         f"or {m['h200_images_per_s_at_unirl_mfu']:.1f} images/s on one H200 at that MFU (UniRL's resolution and step "
         "count are not known here).",
         f"- **The step**: K = {m['K']}, P x G = {m['P']} x {m['G']}, the package's presets (trained window, "
         f"step-value operator, its `lookahead_nfe`), {m['minibatch']} sample per backward pass (all its trained steps "
         "in one graph, as the trainer does), decode batches of 8, values completed in one batched call; "
         "DenseGRPO's calibration, rewards other than the pixels and communication are left out.", '',
         f"| method | values | NFE rollout / values | train pairs | rollout s | values s | update s | step s | "
         f"rollout images/s | peak GB, ckpt / none | largest minibatch, ckpt / none |",
         '|---|---|---|---:|---:|---:|---:|---:|---:|---|---|']
    rng = lambda a, b: f'{a:.0f}-{b:.0f}' if max(a, b) >= 10 else f'{a:.1f}-{b:.1f}'
    for name in METHODS:
        r = m['methods'][name]
        a, b = r['time'][hi], r['time'][lo]  # the higher MFU gives the shorter time
        mem, mb = r['memory'], r['largest_minibatch']
        fits = lambda k: gb(mem[k]['peak']) + ('' if mem[k]['peak'] <= g['memory_gb'] * 1e9 else ' (does not fit)')
        L.append(f"| {name} | {a['lookahead'] or 'final reward'} | {a['nfe_rollout']} / {a['nfe_values']:.0f} | "
                 f"{a['pairs']} | {rng(a['seconds']['rollout'], b['seconds']['rollout'])} | "
                 f"{rng(a['seconds']['values'], b['seconds']['values'])} | "
                 f"{rng(a['seconds']['update'], b['seconds']['update'])} | {rng(a['seconds_step'], b['seconds_step'])} "
                 f"| {b['rollout_images_per_s']:.1f}-{a['rollout_images_per_s']:.1f} | {fits('gc')} / {fits('no_gc')} "
                 f"| {mb['gc']} / {mb['no_gc']} |")
    r0 = m['methods'][METHODS[0]]['memory']['gc']
    mbs = {k: sorted({m['methods'][n]['largest_minibatch'][k] for n in METHODS}) for k in ('gc', 'no_gc')}
    span = lambda v: str(v[0]) if len(v) == 1 else f'{v[0]}-{v[-1]}'
    per_pair = lambda k: gib(c[f'saved_bytes_per_pair_{k}'] + (c['largest_block_saved_bytes_per_pair'] if k == 'gc'
                                                               else 0))
    L += ['', f"Peak memory = weights ({gb(r0['weights'])} GB with T5) + adapter state ({gb(r0['adapter'])} GB) "
          "+ the largest of a backward pass's activations, the step values' batched inference and a decode batch of 8 "
          "(the last two as floors: the largest input + output of one layer). The trainer puts all trained steps of a "
          f"minibatch's samples in one backward pass, so a pair costs {per_pair('no_gc')} GiB without checkpointing "
          f"and {per_pair('gc')} GiB with it: the largest minibatch that fits is {span(mbs['no_gc'])} samples without "
          f"checkpointing and {span(mbs['gc'])} with it (each update takes {m['P'] * m['G'] // 2} samples). "
          "That is the trainer's default (`backward_pairs=0`); `--set backward_pairs=N` back-propagates at most N "
          "pairs per graph (the same gradient, in chunks), so any minibatch fits at N pairs' activations. "
          "Times are FLOPs over an assumed MFU; nothing here is measured on a GPU.", '']
    return L


def render(cpu:dict|None=None, model:dict|None=None) -> str:
    cpu = cpu or json.loads(CPU.read_text())
    model = model or json.loads(MODEL.read_text())
    L = ['# Benchmarks: SD3.5 Medium at its real size', '',
         '<!-- written by benchmarks/sd35_tables.py from results/sd35_real/*.json: do not edit by hand -->', '',
         "The other scripts in this folder (the tiny model's timings) are listed in the Speed section of "
         "[Running it](../nbs/running.ipynb#speed).", '',
         '| script | what it does |', '|---|---|'] + [f'| {", ".join(f"`{s}`" for s in a.split(", "))} | {b} |'
                                                      for a, b in SCRIPTS]
    L += [''] + cpu_section(cpu) + model_section(model)
    return '\n'.join(L).rstrip() + '\n'


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--check', action='store_true', help='exit 1 if benchmarks/README.md is not what the files give')
    a = p.parse_args(argv)
    for f in (CPU, MODEL):
        if not f.is_file(): sys.exit(f"{f.relative_to(ROOT)}: missing; run the benchmark that writes it first")
    text = render()
    if a.check:
        if not README.is_file() or README.read_text() != text:
            sys.exit('benchmarks/README.md differs from the JSON files: run python benchmarks/sd35_tables.py')
        return
    README.write_text(text)
    print(f'wrote {README.relative_to(ROOT)}')


if __name__ == '__main__': main()
