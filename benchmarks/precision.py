"""What lower precision would buy the embedded loop: the same training steps of each method in fp32 and under bf16
autocast (`torch.autocast('cpu', torch.bfloat16)`: the matmuls in bf16 through oneDNN, which uses AMX or AVX-512 bf16
where the CPU has them; the LoRA weights and the optimizer stay fp32), alternating fp32 / bf16 so that a slow spell of
the machine falls on both, on one thread (the comparison's workers).

Not a test, and nothing in the package uses bf16 on a CPU: it prints, per method and precision, the median process CPU
seconds of a step and of its phases, the ratio fp32 / bf16 (above 1: bf16 faster), and the PPO clip fraction of the
update (0 in fp32 at the default single optimizer step per rollout: the update recomputes the rollout's log-probs
exactly; under bf16 the two passes see other batch shapes and round differently). For the methods with a lookahead it
also values one rollout both ways and prints how many of the state values agree exactly. Example (~4 minutes):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/precision.py --methods flow_grpo,dense --steps 3 --reps 2
"""
import contextlib, statistics, tempfile
from pathlib import Path
import torch
from fastcore.script import call_parse

from flowgrpo_nb.study.design import ARMS, BUDGETS, CompareConfig
from flowgrpo_nb.rollout import rollout, step_values
from flowgrpo_nb.task import load_policy, load_task
from flowgrpo_nb.train import GRPOTrainer, step_generator, step_prompts

MODES = dict(fp32=contextlib.nullcontext, bf16=lambda: torch.autocast('cpu', dtype=torch.bfloat16))
PHASES = ('step', 'rollout', 'values', 'update')

def trainer(method:str, budget:str, out:Path) -> GRPOTrainer:
    cfg = CompareConfig(budget=budget, tasks=('geneval',)).train_config(method, 0, 'geneval')
    policy, task = (load_policy(cfg.model, cfg.model_path),
                    load_task(cfg.reward, cfg.prompts, cfg.eval_prompts, cfg.model))
    return GRPOTrainer(cfg, out, policy=policy, task=task, progress=False)

def run_steps(method:str, mode:str, budget:str, steps:int, out:Path) -> list[dict]:
    """Per-step metrics of `steps` training steps of a fresh run (calibration, when the method has one, in fp32 and
    untimed)."""
    tr = trainer(method, budget, out)
    if tr.cfg.calibrate: tr.calibrate()
    with MODES[mode](): return [tr.train_step() for _ in range(steps)]

def value_agreement(method:str, budget:str, out:Path) -> tuple[int, int, float]:
    "(equal, all, max |difference|) of one rollout's state values computed in fp32 and under bf16 autocast."
    tr = trainer(method, budget, out)
    cfg, task = tr.cfg, tr.task
    ro = rollout(tr.policy, step_prompts(cfg, 0, task.train_prompts), cfg.rollout_config(0), task.reward,
                 step_generator(cfg, 0))
    V = {}
    for mode, ctx in MODES.items():
        with ctx(): V[mode] = step_values(tr.policy, ro, cfg.lookahead, task.reward).V[:, :-1]
    return int((V['fp32'] == V['bf16']).sum()), V['fp32'].numel(), float((V['fp32'] - V['bf16']).abs().max())

@call_parse
def main(methods:str='flow_grpo,dense',  # comma-separated arms (flowgrpo_nb.study.design.ARMS)
         steps:int=3,                     # training steps per run
         reps:int=2,                      # runs per method and precision, alternating fp32 / bf16
         budget:str='quick',            # the comparison budget whose training config runs (smoke: a quick check)
         warmup:int=1):                   # first steps of a run left out of the medians (0 with steps=1: a quick check)
    """Print per method the CPU seconds of a step and its phases in fp32 and under bf16 autocast, and the values'
    agreement."""
    ms = [m.strip() for m in methods.split(',') if m.strip()]
    bad = [m for m in ms if m not in ARMS]
    if bad or not ms or budget not in BUDGETS or not 0 <= warmup < steps or reps < 1:
        raise SystemExit(f"methods={methods!r}, budget={budget!r}, steps={steps}, warmup={warmup}, reps={reps}: arms "
                         f"from {', '.join(ARMS)}, budget one of {', '.join(BUDGETS)}, warmup at least 0 and below "
                         "steps, reps at least 1")
    torch.set_num_threads(1)
    print(f"{'method':<16} {'precision':<9} " + ' '.join(f"{p + ' CPU s':>13}" for p in PHASES) + f" {'clip frac':>9}")
    with tempfile.TemporaryDirectory() as d:
        for m in ms:
            got = {mode: [] for mode in MODES}
            for r in range(reps):
                for mode in MODES: got[mode] += run_steps(m, mode, budget, steps, Path(d)/f'{m}_{mode}_{r}')[warmup:]
            med = {mode: {p: statistics.median(s[f'cpu_{p}'] for s in got[mode]) for p in PHASES} for mode in MODES}
            for mode in MODES:
                clip = statistics.mean(s.get('clipfrac', 0.0) for s in got[mode])
                print(f"{m:<16} {mode:<9} " + ' '.join(f"{med[mode][p]:>13.3f}" for p in PHASES) + f" {clip:>9.3f}")
            print(f"{m:<16} {'fp32/bf16':<9} "
                  + ' '.join(f"{med['fp32'][p] / med['bf16'][p]:>12.2f}×" if med['bf16'][p] > 1e-3 else f"{'—':>13}"
                             for p in PHASES))
            cfg = CompareConfig(budget=budget, tasks=('geneval',)).train_config(m, 0, 'geneval')
            if cfg.lookahead and cfg.lookahead != 'tweedie':
                eq, n, dmax = value_agreement(m, budget, Path(d)/f'{m}_values')
                print(f"{m:<16} values of one rollout ({cfg.lookahead}): {eq}/{n} equal in fp32 and bf16 (max "
                      f"|difference| {dmax:.3g})")
    print(f"medians over {reps} run(s) × {steps - warmup} step(s) per precision (after {warmup} warm-up step(s)), "
          "1 thread; ratio fp32 / bf16 > 1: bf16 faster")
