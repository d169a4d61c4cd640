"""Choose the shipped tiny model among a pretraining run's EMA snapshots, and export it with the record of the choice.

The rule (stated before the snapshots were scored): evaluate every snapshot from `--from` on, every `--every` steps,
with the model card's evaluation (1200 held-out images, Euler ODE K=10, guidance 4, seed 0); ship the latest
snapshot whose every category's strict score is at most `--ceiling` (room for RL in each category the reward pays
for). The sentence that says what was scored and chosen goes into the checkpoint's json (`selection`), which the
model card renders; the scores go to `--out` (a JSON file).

    .venv/bin/python benchmarks/pretrain_select.py ../pretrain_v2/run --from 1000 --every 500 --export
"""
import json, time
from pathlib import Path
import torch
from fastcore.script import call_parse
from flowgrpo_nb.tiny import load_tiny, export_tiny, generate
from flowgrpo_nb.card import base_scores, eval_prompts, scored_categories

@call_parse
def main(run:str,              # the pretraining run folder (ema-NNNNNN.safetensors snapshots)
         start:int=1000,       # first snapshot scored
         every:int=500,        # steps between scored snapshots
         ceiling:float=0.9,    # a category above this strict score leaves too little room for RL (version 1's ceiling)
         out:str='',           # JSON file for the scores (default: <run>/selection.json)
         export:bool=False,    # export the chosen snapshot to the package's assets
         hardware:str='',      # what the pretraining ran on, for the card
         world:int=2,          # the grid world's version the run pretrained on (`flowgrpo pretrain --world`)
         note:str=''):         # the version's one-line note for the card (`version_note`)
    torch.set_num_threads(1)
    run = Path(run)
    steps = sorted(int(p.stem.split('-')[1]) for p in run.glob('ema-*.safetensors'))
    steps = [s for s in steps if s >= start and (s - start) % every == 0]
    CATEGORIES = scored_categories('heldout', world)  # the categories that carry a share of the score
    if not steps:
        raise SystemExit(f"pretrain_select.py: no EMA snapshot at steps {start}, {start + every}, ... in {run}")
    scores, reports = {}, {}
    for s in steps:
        reports[s] = base_scores(load_tiny(run / f'ema-{s:06d}.safetensors', world=world))
        d = reports[s].to_dict()
        scores[s] = {c: round(d[c]['strict'], 3) for c in (*CATEGORIES, 'overall')}
        print(s, scores[s], flush=True)
    ok = [s for s in steps if max(scores[s][c] for c in CATEGORIES) <= ceiling]
    chosen = ok[-1] if ok else steps[-1]
    curve = ', '.join(f"{scores[s]['overall']:.2f} at {s}" for s in steps)
    top = max(CATEGORIES, key=lambda c: scores[chosen][c])
    selection = (f"EMA snapshots every {every} steps from {start} to {steps[-1]} were scored with the evaluation "
                 f"below; overall strict {curve}. Shipped: the latest snapshot whose every category is at most "
                 f"{ceiling} (room for RL): step {chosen}{'' if ok else ' (none qualified: the last)'}, "
                 f"its highest category {top} at {scores[chosen][top]:.2f}.")
    Path(out or run / 'selection.json').write_text(
        json.dumps(dict(rule=f'latest snapshot with every category <= {ceiling}', scores=scores, chosen=chosen,
                        selection=selection), indent=1))
    print(selection)
    if export:
        rep = reports[chosen]  # the card's scores: the chosen snapshot's, as scored above
        t0 = time.perf_counter(); m2 = load_tiny(run / f'ema-{chosen:06d}.safetensors', world=world)
        generate(m2, eval_prompts(64, world=world), 10, 4.0, torch.Generator().manual_seed(0))
        sample = time.perf_counter() - t0
        w = '' if world == 2 else f' --world {world}'
        cmd = (f"flowgrpo pretrain --run-dir pretrain_run --steps {steps[-1]} --batch-size 32 --lr 0.0005 --seed 0 "
               f"--threads 1 --save-every 250{w}\n.venv/bin/python benchmarks/pretrain_select.py pretrain_run --start "
               f"{start} --every {every} --ceiling {ceiling}{w} --export")
        weak = [c for c in CATEGORIES if rep.to_dict()[c]['strict'] < 0.5]
        version = {} if world == 2 else dict(
            version=world, version_note=note,
            limitations=f"Trained only on the grammar of the grid world's version {world}; unknown words raise an "
                        f"error. Held-out strict score below 0.5 in {', '.join(weak) or 'no category'}: room for RL "
                        "fine-tuning.")
        path = export_tiny(run, chosen, command=cmd, hardware=hardware or 'a CPU', selection=selection,
                           eval=dict(n=1200, K=10, guidance=4.0, seed=0), scores=rep.to_dict(),
                           sample_seconds_64=round(sample, 1), **version)
        print(f"exported step {chosen} to {path}")
