"""Re-evaluate a seed's kept final adapters prompt by prompt: the per-prompt results a study's runs did not log.

`python benchmarks/prompt_component.py results/confirm/runs geneval 2002` loads each arm's newest kept checkpoint of
`<task>/seed<seed>/<arm>` (its EMA adapter, as the run evaluated it), evaluates it on the run's own held-out
evaluation (the same images, prompts and noise: `train.eval_settings`) on one thread, and writes
`<folder>/prompt_component.json`: per arm the checkpoint (relative to the folder), the final score the run logged,
the re-evaluated score and its per-prompt images and means, with the CPU and the code it ran on. The study's report
reads it (`summary.judge`, `component`) to let the held-out prompts count in the interval of every claim whose runs
logged no per-prompt results (post hoc: one seed's per-prompt differences of two arms). A re-evaluation on another
kind of CPU than the run's rounds differently, so its score need not equal the logged one: both are kept."""
import hashlib, json, sys, time
from pathlib import Path

import torch

from flowgrpo_nb.checkpoint import write_json, list_checkpoints
from flowgrpo_nb.config import run_config
from flowgrpo_nb.policy import LORA_FILE
from flowgrpo_nb.precision import machine_key, resolve_fast
from flowgrpo_nb.study.record import code_version
from flowgrpo_nb.task import evaluate_policy, load_task, load_policy
from flowgrpo_nb.train import eval_settings, check_base

def final_policy(run:Path):
    """(policy with the run's newest kept adapter, run config, checkpoint): a kept checkpoint holds only the LoRA file
    (the EMA, what the run evaluated) and state.json, so the LoRA file is checked against the sha256 state.json records
    for it, not the whole checkpoint."""
    cfg, ckpt = run_config(run), list_checkpoints(run)[-1]
    rec = json.loads((ckpt/'state.json').read_text())['files'][LORA_FILE]
    if hashlib.sha256((ckpt/LORA_FILE).read_bytes()).hexdigest() != rec['sha256']:
        sys.exit(f"{ckpt/LORA_FILE}: its sha256 is not the one state.json records; the adapter is not the run's")
    policy = load_policy(**cfg.backend())
    check_base(run, policy.base_fingerprint())
    policy.add_lora(cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets)
    policy.load_lora(ckpt)
    return policy.set_fast(resolve_fast(cfg.fast)[0]), cfg, ckpt

def reevaluate(run:Path) -> dict:
    "The run's final adapter evaluated again as the run evaluated it: scores and per-prompt results."
    policy, cfg, ckpt = final_policy(run)
    task = load_task(cfg.reward, cfg.prompts, cfg.eval_prompts, cfg.model)
    t0 = time.process_time()
    with torch.no_grad(): rep = evaluate_policy(policy, task, **eval_settings(cfg))
    logged = json.loads((run/'summary.json').read_text())['final']['eval_overall']
    return dict(checkpoint=ckpt, logged=logged, overall=rep.overall, cpu_seconds=time.process_time() - t0,
                prompts=rep.prompts.to_dict())

if __name__ == '__main__':
    torch.set_num_threads(1)
    folder, task, seed = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    arms, m = {}, machine_key()
    for d in sorted((folder/task/f'seed{seed}').iterdir()):
        if not (d/'checkpoints').is_dir(): continue
        r = reevaluate(d)
        r['checkpoint'] = r['checkpoint'].resolve().relative_to(folder.resolve()).as_posix()  # no path of one machine
        arms[d.name] = r
        print(f"{d.name}: logged {r['logged']:.4f}, re-evaluated {r['overall']:.4f} "
              f"({r['cpu_seconds']:.0f} CPU s)", flush=True)
    write_json(folder/'prompt_component.json', dict(
        about='post hoc: the final adapters kept of one seed re-evaluated prompt by prompt on the run\'s own held-out '
              'evaluation, for the prompt component of claims whose runs logged no per-prompt results',
        task=task, seed=seed, cpu=m['cpu'], capability=m['capability'], torch=m['torch'], threads=1,
        code=code_version(), arms=arms), 'the per-prompt re-evaluation')
